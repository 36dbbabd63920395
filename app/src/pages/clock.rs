//! Time in the browser. Pages that use these render their data only in the browser (local
//! resources), so server and client markup never disagree about a time zone.

/// Milliseconds since the epoch, in the browser (0 while rendering on the server).
pub fn now_ms() -> f64 {
    #[cfg(feature = "hydrate")]
    return js_sys::Date::now();
    #[cfg(not(feature = "hydrate"))]
    0.0
}

pub fn parse_ms(rfc3339: &str) -> f64 {
    #[cfg(feature = "hydrate")]
    return js_sys::Date::parse(rfc3339);
    #[cfg(not(feature = "hydrate"))]
    {
        let _ = rfc3339;
        0.0
    }
}

/// A time of day in the browser's time zone.
pub fn local_time(rfc3339: &str) -> String {
    #[cfg(feature = "hydrate")]
    return js_sys::Date::new(&wasm_bindgen::JsValue::from_str(rfc3339))
        .to_locale_time_string("default")
        .as_string()
        .unwrap_or_default();
    #[cfg(not(feature = "hydrate"))]
    rfc3339.get(11..19).unwrap_or_default().to_string()
}

/// A date and time (to the minute) in the browser's time zone.
pub fn local_date_time(rfc3339: &str) -> String {
    #[cfg(feature = "hydrate")]
    {
        let date = js_sys::Date::new(&wasm_bindgen::JsValue::from_str(rfc3339));
        let pad = |n: u32| format!("{n:02}");
        return format!(
            "{}-{}-{} {}:{}",
            date.get_full_year(),
            pad(date.get_month() + 1),
            pad(date.get_date()),
            pad(date.get_hours()),
            pad(date.get_minutes())
        );
    }
    #[cfg(not(feature = "hydrate"))]
    rfc3339.get(..16).map(|s| s.replace('T', " ")).unwrap_or_default()
}
