#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod delivery;
mod files;
mod http_debug;
pub mod otlp;
pub mod pyroscope;

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use delivery::{Delivery, DeliveryConfig, DeliveryStats, SendError, Transport};
pub use files::{
    DEFAULT_FILE_INTERVAL, DEFAULT_MAX_FILES, PprofFileConfig, PprofFileExporter, write_one,
};
pub use http_debug::{DEBUG_PROFILE_PATH, debug_router};
pub use otlp::{OtlpProfilesConfig, OtlpProfilesExporter, OtlpProtocol};
pub use pyroscope::{PyroscopeAuth, PyroscopeConfig, PyroscopeExporter};

use spanprof_core::{Profile, Profiler};

/// `User-Agent` of every request spanprof sends.
pub const USER_AGENT: &str = concat!("spanprof/", env!("CARGO_PKG_VERSION"));

/// A sink could not be configured or started.
#[derive(Debug)]
#[non_exhaustive]
pub enum ExportError {
    /// A configuration value (or environment variable) is wrong; names it.
    Config {
        /// The field or variable.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// An I/O error (creating the pprof directory, for one).
    Io(std::io::Error),
}

impl ExportError {
    pub(crate) fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ExportError::Config {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportError::Config { field, reason } => {
                write!(
                    f,
                    "invalid spanprof export configuration: `{field}`: {reason}"
                )
            }
            ExportError::Io(e) => write!(f, "spanprof export: {e}"),
        }
    }
}

impl std::error::Error for ExportError {}

impl From<std::io::Error> for ExportError {
    fn from(e: std::io::Error) -> Self {
        ExportError::Io(e)
    }
}

/// Where an exporter gets each interval's profile.
pub struct ProfileSource(Box<dyn FnMut() -> Profile + Send>);

impl std::fmt::Debug for ProfileSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProfileSource")
    }
}

impl ProfileSource {
    /// Everything the profiler samples from now on, one interval at a time, with span
    /// ids in local-root scope (Grafana's convention: inner spans' samples carry
    /// their local root's id) unless `all_spans`.
    pub fn profiler(profiler: &Profiler, all_spans: bool) -> Self {
        let window = profiler.window(spanprof_core::DEFAULT_WINDOW_ENTRIES);
        ProfileSource(Box::new(move || {
            let p = window.take();
            if all_spans {
                p
            } else {
                p.with_local_root_ids()
            }
        }))
    }

    /// Any function returning the next interval's profile.
    pub fn from_fn(f: impl FnMut() -> Profile + Send + 'static) -> Self {
        ProfileSource(Box::new(f))
    }

    fn next(&mut self) -> Profile {
        (self.0)()
    }
}

/// The interval loop shared by the network sinks: every interval, take a profile,
/// encode it and queue it for delivery (never blocking on the network).
pub(crate) struct Exporter {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    delivery: Arc<Mutex<Option<Delivery>>>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Exporter {
    pub(crate) fn start(
        name: &'static str,
        interval: Duration,
        mut source: ProfileSource,
        delivery: Delivery,
        mut encode: impl FnMut(&Profile) -> Option<Vec<u8>> + Send + 'static,
    ) -> Exporter {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let delivery = Arc::new(Mutex::new(Some(delivery)));
        let thread = {
            let stop = stop.clone();
            let delivery = delivery.clone();
            std::thread::Builder::new()
                .name(format!("spanprof-{name}"))
                .spawn(move || {
                    loop {
                        let (lock, cv) = &*stop;
                        let stopped = {
                            let g = lock.lock().unwrap_or_else(|e| e.into_inner());
                            let (g, _) = cv
                                .wait_timeout_while(g, interval, |s| !*s)
                                .unwrap_or_else(|e| e.into_inner());
                            *g
                        };
                        // The last interval is taken at shutdown too.
                        let profile = source.next();
                        if let Some(payload) = encode(&profile)
                            && let Some(d) =
                                delivery.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
                        {
                            d.enqueue(payload);
                        }
                        if stopped {
                            return;
                        }
                    }
                })
                .expect("spawn an exporter thread")
        };
        Exporter {
            stop,
            thread: Some(thread),
            delivery,
        }
    }

    pub(crate) fn stats(&self) -> DeliveryStats {
        self.delivery
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(Delivery::stats)
            .unwrap_or_default()
    }

    pub(crate) fn shutdown(mut self, deadline: Duration) -> DeliveryStats {
        self.stop_interval();
        let d = self
            .delivery
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        d.map(|d| d.shutdown(deadline)).unwrap_or_default()
    }

    fn stop_interval(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop_interval();
    }
}

/// The service name: `OTEL_SERVICE_NAME`, else the executable's file name.
pub(crate) fn default_service_name() -> String {
    std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::env::current_exe()
                .ok()?
                .file_name()?
                .to_str()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown_service".to_owned())
}

pub(crate) fn validate_url(field: &str, url: &str) -> Result<(), ExportError> {
    let ok = (url.starts_with("http://") || url.starts_with("https://"))
        && url.parse::<http::Uri>().is_ok_and(|u| u.host().is_some());
    if ok {
        Ok(())
    } else {
        Err(ExportError::config(
            field,
            format!("`{url}` is not an http:// or https:// URL with a host"),
        ))
    }
}

/// The HTTP client of every sink: rustls with the ring provider (the one TLS stack of
/// the workspace; reqwest's `rustls-tls` feature selects ring), webpki roots, plus
/// the certificates of `ca_pem` (checked by [`parse_ca_certificates`]).
pub(crate) fn http_client(
    field: &str,
    ca_pem: Option<&[u8]>,
) -> Result<reqwest::Client, ExportError> {
    let mut builder = reqwest::Client::builder().user_agent(USER_AGENT);
    if let Some(pem) = ca_pem {
        for cert in parse_ca_certificates(field, pem)? {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| {
        let field = if ca_pem.is_some() {
            field
        } else {
            "http client"
        };
        ExportError::config(field, e.to_string())
    })
}

/// The certificates of a PEM bundle; an error naming `field` when it holds none or
/// one that does not parse as a certificate.
pub(crate) fn parse_ca_certificates(
    field: &str,
    pem: &[u8],
) -> Result<Vec<reqwest::Certificate>, ExportError> {
    let certs = reqwest::Certificate::from_pem_bundle(pem)
        .map_err(|e| ExportError::config(field, format!("not a PEM certificate bundle: {e}")))?;
    if certs.is_empty() {
        return Err(ExportError::config(
            field,
            "holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
        ));
    }
    // The PEM armour can be right around bytes that are no certificate: a client
    // built with them says so here, naming the field, not at the first send.
    let mut builder = reqwest::Client::builder();
    for c in &certs {
        builder = builder.add_root_certificate(c.clone());
    }
    builder
        .build()
        .map_err(|e| ExportError::config(field, format!("not a valid certificate: {e}")))?;
    Ok(certs)
}

/// Reads a PEM file of CA certificates named by configuration `field` (a variable
/// such as `OTEL_EXPORTER_OTLP_CERTIFICATE`); errors name the field and the path.
/// Only the file's `CERTIFICATE` blocks are kept: a private key in the same file
/// is dropped, so it can never be printed with the configuration.
pub fn read_ca_certificates(field: &str, path: &std::path::Path) -> Result<Vec<u8>, ExportError> {
    let pem = std::fs::read(path).map_err(|e| {
        ExportError::config(field, format!("cannot read `{}`: {e}", path.display()))
    })?;
    let certs = certificate_blocks(&String::from_utf8_lossy(&pem));
    parse_ca_certificates(field, certs.as_bytes())?;
    Ok(certs.into_bytes())
}

/// The `-----BEGIN CERTIFICATE-----` … `-----END CERTIFICATE-----` blocks of a PEM
/// text, and nothing else.
fn certificate_blocks(pem: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in pem.lines() {
        let line = line.trim();
        if line == "-----BEGIN CERTIFICATE-----" {
            inside = true;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
        if line == "-----END CERTIFICATE-----" {
            inside = false;
        }
    }
    out
}

/// Maps a response (or a transport error) to the retry policy.
pub(crate) async fn classify(
    result: Result<reqwest::Response, reqwest::Error>,
) -> Result<(), SendError> {
    match result {
        Err(e) => Err(SendError::Retryable(e.to_string())),
        Ok(resp) => {
            let status = resp.status();
            if status.is_success() {
                return Ok(());
            }
            let mut message = resp.text().await.unwrap_or_default();
            message.truncate(512);
            if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 {
                Err(SendError::Retryable(format!("{status}: {message}")))
            } else {
                Err(SendError::Rejected {
                    status: status.as_u16(),
                    message,
                })
            }
        }
    }
}
