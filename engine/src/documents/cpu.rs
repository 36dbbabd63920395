//! CPU-heavy work on documents in this process (the local provider's analysis) runs on the
//! blocking pool, at most cores − 1 at once: with 70 worker slots busy, the web's answers
//! still have a core. The readers, separate processes, have their own bound and a lower
//! priority ([`super::sandbox`]).

use std::sync::OnceLock;

use tokio::sync::Semaphore;

/// Pure: how many CPU-heavy tasks may run at once on `cores` cores (one is left free).
pub fn slots(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

fn permits() -> &'static Semaphore {
    static PERMITS: OnceLock<Semaphore> = OnceLock::new();
    PERMITS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        Semaphore::new(slots(cores))
    })
}

/// Run `work` on the blocking pool once a CPU slot is free.
pub async fn run<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, tokio::task::JoinError> {
    let _slot = permits().acquire().await.expect("the CPU semaphore is never closed");
    tokio::task::spawn_blocking(work).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_core_is_always_left_to_the_web() {
        assert_eq!(slots(2), 1);
        assert_eq!(slots(8), 7);
        assert_eq!(slots(1), 1, "a single core still does the work");
        assert_eq!(slots(0), 1);
    }
}
