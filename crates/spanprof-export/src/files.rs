//! Periodic pprof files: one gzip'd profile per interval in a directory, named so
//! that they sort by time (`spanprof-<unix-ms, 13 digits>-<seq>.pb.gz`), the oldest
//! removed past a bound.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, UNIX_EPOCH};

use crate::{DeliveryStats, ExportError, ProfileSource};

/// Default interval between files.
pub const DEFAULT_FILE_INTERVAL: Duration = Duration::from_secs(60);
/// Default number of files kept.
pub const DEFAULT_MAX_FILES: usize = 60;

/// Configuration of the pprof file sink.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PprofFileConfig {
    /// The directory (created if missing).
    pub dir: PathBuf,
    /// Interval between files. Defaults to [`DEFAULT_FILE_INTERVAL`].
    pub interval: Duration,
    /// Files kept; the oldest are removed. Defaults to [`DEFAULT_MAX_FILES`].
    pub max_files: usize,
}

impl PprofFileConfig {
    /// Files in `dir` with the defaults.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        PprofFileConfig {
            dir: dir.into(),
            interval: DEFAULT_FILE_INTERVAL,
            max_files: DEFAULT_MAX_FILES,
        }
    }

    /// Sets the interval between files (at least 100 ms). Defaults to
    /// [`DEFAULT_FILE_INTERVAL`] (60 s).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Sets how many files are kept; the oldest are removed. Defaults to
    /// [`DEFAULT_MAX_FILES`] (60).
    pub fn max_files(mut self, max_files: usize) -> Self {
        self.max_files = max_files;
        self
    }
}

/// The file thread's state, shared with the handle.
#[derive(Default)]
struct FileState {
    /// Shutdown asked for the last interval's file.
    stop: bool,
    /// The thread has written its last file and ended.
    done: bool,
    /// Files written, and intervals whose file could not be written.
    written: u64,
    failed: u64,
    /// The files kept, oldest first.
    kept: Vec<PathBuf>,
}

/// Writes one pprof file per interval, until it is shut down ([`Self::shutdown`],
/// which writes the last interval's file within a deadline) or dropped (which stops
/// at once, and says so in the log). Alone, or in [`crate::Sinks`] with the network
/// sinks, stopped together.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use spanprof_export::{PprofFileConfig, PprofFileExporter, ProfileSource};
/// let profiler = spanprof_core::Profiler::builder().start()?;
/// let files = PprofFileExporter::start(
///     PprofFileConfig::new("/var/tmp/profiles").interval(Duration::from_secs(30)),
///     ProfileSource::profiler(&profiler),
/// )?;
/// // … serve …
/// let written = files.shutdown(spanprof_export::DEFAULT_SHUTDOWN_DEADLINE);
/// # drop(written); Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "the exporter stops when dropped: keep it alive as long as the service runs"]
pub struct PprofFileExporter {
    state: Arc<(Mutex<FileState>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    dir: PathBuf,
    started: Instant,
}

impl std::fmt::Debug for FileState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileState")
            .field("written", &self.written)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl PprofFileExporter {
    /// Starts writing files of the profiles of `source`.
    pub fn start(cfg: PprofFileConfig, mut source: ProfileSource) -> Result<Self, ExportError> {
        if cfg.interval < Duration::from_millis(100) {
            return Err(ExportError::config("interval", "must be at least 100ms"));
        }
        if cfg.max_files == 0 {
            return Err(ExportError::config("max_files", "must be at least 1"));
        }
        std::fs::create_dir_all(&cfg.dir)?;
        tracing::info!(
            "spanprof: writing profiles: pprof files in {} every {:?}, the last {} kept",
            cfg.dir.display(),
            cfg.interval,
            cfg.max_files
        );
        let state: Arc<(Mutex<FileState>, Condvar)> = Arc::default();
        let dir = cfg.dir.clone();
        let thread = {
            let state = state.clone();
            std::thread::Builder::new()
                .name("spanprof-pprof-files".into())
                .spawn(move || {
                    let (lock, cv) = &*state;
                    let mut seq = 0u64;
                    loop {
                        let stopped = {
                            let g = lock.lock().unwrap_or_else(|e| e.into_inner());
                            cv.wait_timeout_while(g, cfg.interval, |s| !s.stop)
                                .unwrap_or_else(|e| e.into_inner())
                                .0
                                .stop
                        };
                        let profile = source.next(stopped);
                        seq += 1;
                        let result = write_one(&cfg.dir, &profile, seq);
                        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
                        match result {
                            Ok(path) => {
                                g.written += 1;
                                g.kept.push(path);
                                while g.kept.len() > cfg.max_files {
                                    let old = g.kept.remove(0);
                                    let _ = std::fs::remove_file(old);
                                }
                            }
                            Err(e) => {
                                g.failed += 1;
                                tracing::warn!(error = %e, dir = %cfg.dir.display(), "spanprof: could not write a pprof file");
                            }
                        }
                        if stopped {
                            g.done = true;
                            cv.notify_all();
                            return;
                        }
                    }
                })
                .expect("spawn the pprof file thread")
        };
        Ok(PprofFileExporter {
            state,
            thread: Some(thread),
            dir,
            started: Instant::now(),
        })
    }

    /// The files written so far (oldest first), less those removed.
    pub fn files(&self) -> Vec<PathBuf> {
        self.lock().kept.clone()
    }

    /// Its counters as the network sinks report theirs: `queued` intervals taken,
    /// `sent` files written, `dropped_rejected` files that could not be written,
    /// `dropped_shutdown` a last interval the shutdown deadline cut.
    pub fn stats(&self) -> DeliveryStats {
        let g = self.lock();
        DeliveryStats {
            queued: g.written + g.failed,
            sent: g.written,
            dropped_rejected: g.failed,
            ..DeliveryStats::default()
        }
    }

    /// Writes the last interval's file and stops, waiting at most `deadline` for it
    /// (the file is then left to its thread, and counted as dropped at shutdown).
    /// Logs what it wrote, as the network sinks do. Returns the files kept.
    pub fn shutdown(mut self, deadline: Duration) -> Vec<PathBuf> {
        let end = Instant::now() + deadline;
        self.stop_interval();
        let stats = self.wait_interval(end);
        self.log_stop(&stats, false);
        self.files()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FileState> {
        self.state.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the thread for its last file.
    pub(crate) fn stop_interval(&self) {
        self.lock().stop = true;
        self.state.1.notify_all();
    }

    /// Waits for the last file until `end`; returns the counters then.
    pub(crate) fn wait_interval(&mut self, end: Instant) -> DeliveryStats {
        let (lock, cv) = &*self.state;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        while !g.done {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(g);
                self.thread = None;
                let mut stats = self.stats();
                stats.dropped_shutdown = 1;
                return stats;
            }
            g = cv
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.stats()
    }

    /// Logs the stop, as the network sinks do (`delivery::log_stop`).
    pub(crate) fn log_stop(&self, stats: &DeliveryStats, dropped_handle: bool) {
        let after = self.started.elapsed().as_secs_f64();
        let dir = self.dir.display();
        let detail = format!(
            "{} files written in {dir}, {} could not be written, {} cut by the shutdown deadline",
            stats.sent, stats.dropped_rejected, stats.dropped_shutdown
        );
        if dropped_handle {
            tracing::warn!(
                sink = "pprof-files",
                "spanprof: the pprof-files sink stopped {after:.1} s after it started because its handle was \
                 dropped: a sink runs only while its handle lives. Keep the exporter (or the Sinks holding it) \
                 alive as long as the service runs, and stop it with shutdown() at the end. {detail}"
            );
        } else if stats.dropped() > 0 {
            tracing::warn!(
                sink = "pprof-files",
                "spanprof: the pprof-files sink stopped after {after:.1} s: {detail}"
            );
        } else {
            tracing::info!(
                sink = "pprof-files",
                "spanprof: the pprof-files sink stopped after {after:.1} s: {detail}"
            );
        }
    }
}

impl Drop for PprofFileExporter {
    fn drop(&mut self) {
        if self.thread.is_some() {
            // Stop at once: the thread writes the last file on its own; the stop is
            // logged, saying that the handle was dropped.
            self.stop_interval();
            let stats = self.stats();
            self.thread = None;
            self.log_stop(&stats, true);
        }
    }
}

/// Writes `profile` as `spanprof-<unix ms>-<seq>.pb.gz` in `dir` (atomically: a
/// temporary name, then a rename) and returns its path.
pub(crate) fn write_one(
    dir: &Path,
    profile: &spanprof_core::Profile,
    seq: u64,
) -> std::io::Result<PathBuf> {
    let ms = profile
        .start
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let name = format!("spanprof-{ms:013}-{seq:06}.pb.gz");
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, spanprof_core::pprof::encode_gzip(profile))?;
    let path = dir.join(name);
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}
