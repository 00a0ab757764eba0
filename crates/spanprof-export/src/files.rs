//! Periodic pprof files: one gzip'd profile per interval in a directory, named so
//! that they sort by time (`spanprof-<unix-ms, 13 digits>-<seq>.pb.gz`), the oldest
//! removed past a bound.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, UNIX_EPOCH};

use crate::{ExportError, ProfileSource};

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
}

/// Writes one pprof file per interval, until it is shut down or dropped (either
/// writes the last interval's file).
#[derive(Debug)]
#[must_use = "the exporter stops when dropped: keep it alive as long as the service runs"]
pub struct PprofFileExporter {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    written: Arc<Mutex<Vec<PathBuf>>>,
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
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let written: Arc<Mutex<Vec<PathBuf>>> = Arc::default();
        let thread = {
            let stop = stop.clone();
            let written = written.clone();
            std::thread::Builder::new()
                .name("spanprof-pprof-files".into())
                .spawn(move || {
                    let mut seq = 0u64;
                    loop {
                        let stopped = {
                            let (lock, cv) = &*stop;
                            let g = lock.lock().unwrap_or_else(|e| e.into_inner());
                            *cv.wait_timeout_while(g, cfg.interval, |s| !*s)
                                .unwrap_or_else(|e| e.into_inner())
                                .0
                        };
                        let profile = source.next();
                        seq += 1;
                        match write_one(&cfg.dir, &profile, seq) {
                            Ok(path) => {
                                let mut w = written.lock().unwrap_or_else(|e| e.into_inner());
                                w.push(path);
                                while w.len() > cfg.max_files {
                                    let old = w.remove(0);
                                    let _ = std::fs::remove_file(old);
                                }
                            }
                            Err(e) => tracing::warn!(error = %e, dir = %cfg.dir.display(), "spanprof: could not write a pprof file"),
                        }
                        if stopped {
                            return;
                        }
                    }
                })
                .expect("spawn the pprof file thread")
        };
        Ok(PprofFileExporter {
            stop,
            thread: Some(thread),
            written,
        })
    }

    /// The files written so far (oldest first), less those removed.
    pub fn files(&self) -> Vec<PathBuf> {
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Writes the last interval's file and stops.
    pub fn shutdown(mut self) -> Vec<PathBuf> {
        self.stop_thread();
        self.files()
    }

    fn stop_thread(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for PprofFileExporter {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// Writes `profile` as `spanprof-<unix ms>-<seq>.pb.gz` in `dir` (atomically: a
/// temporary name, then a rename) and returns its path.
pub fn write_one(
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
