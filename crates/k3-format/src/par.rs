//! Scoped worker threads that never panic when a thread cannot start.

/// Runs every job on its own scoped thread and returns the results in job order. A job whose
/// thread cannot be started (thread or address-space limit, e.g. under `prlimit --as`) runs
/// inline on the caller instead of panicking; a job that panics re-raises its panic here.
pub fn run_scoped<F, R>(jobs: impl IntoIterator<Item = F>) -> Vec<R>
where
    F: FnOnce() -> R + Send + Copy,
    R: Send,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|work| {
                std::thread::Builder::new()
                    .spawn_scoped(s, work)
                    .map_err(|_| work)
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                Err(work) => work(),
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn results_come_back_in_job_order() {
        let data: Vec<u64> = (0..100).collect();
        let sums = super::run_scoped(data.chunks(7).map(|c| move || c.iter().sum::<u64>()));
        assert_eq!(sums.len(), 15);
        assert_eq!(sums[0], (0..7).sum::<u64>());
        assert_eq!(sums.iter().sum::<u64>(), (0..100).sum::<u64>());
    }
}
