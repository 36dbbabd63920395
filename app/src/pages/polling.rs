//! Timers for pages that refresh themselves (the jobs pages and the admin page): an interval
//! that lives as long as the component that starts it, and a call when a hidden tab is shown
//! again. Both do nothing on the server.

#[cfg(feature = "hydrate")]
use leptos::prelude::*;

/// Whether the tab is visible (always, on the server).
pub fn tab_visible() -> bool {
    #[cfg(feature = "hydrate")]
    return document().visibility_state() == web_sys::VisibilityState::Visible;
    #[cfg(not(feature = "hydrate"))]
    true
}

/// Call `tick` every `period_ms` until the calling component is unmounted.
pub fn every(period_ms: u32, tick: impl FnMut() + 'static) {
    #[cfg(feature = "hydrate")]
    {
        let interval = gloo_timers::callback::Interval::new(period_ms, tick);
        let interval = send_wrapper::SendWrapper::new(interval);
        on_cleanup(move || drop(interval));
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = (period_ms, tick);
}

/// Call `shown` each time the tab becomes visible again, until the component is unmounted.
pub fn when_shown(shown: impl Fn() + 'static) {
    #[cfg(feature = "hydrate")]
    {
        use wasm_bindgen::closure::Closure;
        use wasm_bindgen::JsCast;

        let on_change = Closure::<dyn Fn()>::new(move || {
            if tab_visible() {
                shown();
            }
        });
        let _ = document().add_event_listener_with_callback("visibilitychange", on_change.as_ref().unchecked_ref());
        let held = send_wrapper::SendWrapper::new(on_change);
        on_cleanup(move || {
            let on_change = held.take();
            let _ =
                document().remove_event_listener_with_callback("visibilitychange", on_change.as_ref().unchecked_ref());
        });
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = shown;
}
