//! The shop's CPU-heavy steps run on a bounded set of blocking threads, never on the
//! runtime's workers: a slow cart (the demo's point: a second of regex compiling and
//! attribute scans) holds a CPU thread, while the workers stay free to answer
//! `/health`, the cheap requests and the backends' I/O. Each step keeps its request's
//! profile labels (`spanprof::spawn_blocking`) and tracing span.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// Runs CPU-heavy closures, at most `threads` at once.
#[derive(Debug, Clone)]
pub struct CpuPool {
    permits: Arc<Semaphore>,
}

/// Why a step did not run to the end.
#[derive(Debug)]
pub struct CpuError(pub String);

impl CpuPool {
    /// At most `threads` steps at once (at least one).
    pub fn new(threads: usize) -> Self {
        CpuPool {
            permits: Arc::new(Semaphore::new(threads.max(1))),
        }
    }

    /// One thread per core.
    pub fn per_core() -> Self {
        CpuPool::new(std::thread::available_parallelism().map_or(2, |n| n.get()))
    }

    /// Runs `f` on a blocking thread once one of the pool's places is free, inside
    /// the current tracing span and with the current profile labels.
    pub async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, CpuError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| CpuError("the CPU pool is closed".into()))?;
        let span = tracing::Span::current();
        spanprof::spawn_blocking(move || {
            let _permit = permit;
            span.in_scope(f)
        })
        .await
        .map_err(|e| CpuError(format!("a CPU step failed: {e}")))
    }
}
