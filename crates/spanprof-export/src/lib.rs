#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod delivery;
mod files;
mod http_debug;
pub mod otlp;
pub mod pyroscope;

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use delivery::{
    DEFAULT_SHUTDOWN_DEADLINE, Delivery, DeliveryConfig, DeliveryStats, SendError, Transport,
};
pub use files::{
    DEFAULT_FILE_INTERVAL, DEFAULT_MAX_FILES, PprofFileConfig, PprofFileExporter, write_one,
};
pub use http_debug::{
    DEBUG_PROFILE_PATH, DebugEndpointStats, MAX_CONCURRENT_WINDOWS, debug_endpoint_stats,
    debug_router,
};
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
    /// their local root's id) unless `all_spans`. Each interval first drains the
    /// profiler's per-thread buffers ([`Profiler::flush`]), so that every sample
    /// taken before it — the last ones of a request that ended just before
    /// shutdown, too — is in it.
    pub fn profiler(profiler: &Profiler, all_spans: bool) -> Self {
        let window = profiler.window(spanprof_core::DEFAULT_WINDOW_ENTRIES);
        let profiler = profiler.clone();
        ProfileSource(Box::new(move || {
            profiler.flush();
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

/// The state of an interval thread.
#[derive(Default)]
struct IntervalState {
    /// Shutdown asked for the last interval.
    stop: bool,
    /// The thread has queued its last interval and ended.
    done: bool,
    /// Shutdown gave up waiting for the last interval: it must not be queued.
    abandoned: bool,
}

/// The interval loop shared by the network sinks: every interval, take a profile,
/// encode it and queue it for delivery (never blocking on the network).
pub(crate) struct Exporter {
    name: &'static str,
    state: Arc<(Mutex<IntervalState>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    delivery: Delivery,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("sink", &self.name)
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
        let state: Arc<(Mutex<IntervalState>, Condvar)> = Arc::default();
        let thread = {
            let state = state.clone();
            let queue = delivery.shared();
            std::thread::Builder::new()
                .name(format!("spanprof-{name}-interval"))
                .spawn(move || {
                    let (lock, cv) = &*state;
                    loop {
                        let stopped = {
                            let g = lock.lock().unwrap_or_else(|e| e.into_inner());
                            let (g, _) = cv
                                .wait_timeout_while(g, interval, |s| !s.stop)
                                .unwrap_or_else(|e| e.into_inner());
                            g.stop
                        };
                        // The last interval is taken at shutdown too. A panic in the
                        // source or the encoder costs this interval, not the sink.
                        let payload =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                encode(&source.next())
                            }));
                        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
                        match payload {
                            Ok(Some(p)) if !g.abandoned => {
                                queue.enqueue(p);
                            }
                            Ok(_) => {}
                            Err(panic) => queue.lost_to_panic("taking a profile", &*panic),
                        }
                        if stopped {
                            g.done = true;
                            cv.notify_all();
                            return;
                        }
                    }
                })
                .expect("spawn an exporter thread")
        };
        Exporter {
            name,
            state,
            thread: Some(thread),
            delivery,
        }
    }

    pub(crate) fn stats(&self) -> DeliveryStats {
        self.delivery.stats()
    }

    pub(crate) fn shutdown(self, deadline: Duration) -> DeliveryStats {
        Sinks(vec![self]).shutdown(deadline)[0].1
    }

    /// Asks the interval thread for its last interval.
    fn stop_interval(&self) {
        let (lock, cv) = &*self.state;
        lock.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        cv.notify_all();
    }

    /// Waits for the last interval until `end`; past it, that interval is dropped
    /// and counted (`dropped_shutdown`) and the thread is left to end by itself.
    fn wait_interval(&mut self, end: Instant) {
        let (lock, cv) = &*self.state;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        while !g.done {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                g.abandoned = true;
                self.delivery.shared().count_dropped_shutdown();
                self.thread = None;
                return;
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
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if self.thread.is_some() {
            // Stop at once: what is queued is dropped and counted.
            let end = Instant::now();
            self.stop_interval();
            self.wait_interval(end);
            self.delivery.begin_close(end);
        }
    }
}

/// The network sinks of a service, stopped together: [`Sinks::shutdown`] stops
/// them all at once, sharing one deadline, so that two sinks whose servers hang
/// take the deadline, not twice it.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use spanprof_export::{OtlpProfilesConfig, OtlpProfilesExporter, ProfileSource};
/// use spanprof_export::{PyroscopeConfig, PyroscopeExporter, Sinks};
/// let profiler = spanprof_core::Profiler::builder().start()?;
/// let mut sinks = Sinks::new();
/// if let Some(cfg) = PyroscopeConfig::from_env()? {
///     sinks.push(PyroscopeExporter::start(cfg, ProfileSource::profiler(&profiler, false))?);
/// }
/// if let Some(cfg) = OtlpProfilesConfig::from_env()? {
///     sinks.push(OtlpProfilesExporter::start(cfg, ProfileSource::profiler(&profiler, false))?);
/// }
/// // … serve …
/// for (sink, stats) in sinks.shutdown(spanprof_export::DEFAULT_SHUTDOWN_DEADLINE) {
///     println!("{sink}: {stats:?}");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct Sinks(Vec<Exporter>);

impl Sinks {
    /// No sinks.
    pub fn new() -> Self {
        Sinks(Vec::new())
    }

    /// Adds a sink (a [`PyroscopeExporter`], an [`OtlpProfilesExporter`], or other
    /// `Sinks`).
    pub fn push(&mut self, sink: impl Into<Sinks>) -> &mut Self {
        self.0.extend(sink.into().0);
        self
    }

    /// How many sinks.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each sink's name (`pyroscope`, `otlp-profiles`) and counters.
    pub fn stats(&self) -> Vec<(&'static str, DeliveryStats)> {
        self.0.iter().map(|e| (e.name, e.stats())).collect()
    }

    /// Stops every sink at once: each takes its last interval and flushes its queue
    /// until it is empty or `deadline` has passed; a send still under way then is
    /// cut, and what is left is dropped and counted (`dropped_shutdown`). Returns
    /// within `deadline` (plus the time to stop the threads), whatever the servers
    /// do, with each sink's name and counters (also logged).
    pub fn shutdown(mut self, deadline: Duration) -> Vec<(&'static str, DeliveryStats)> {
        let end = Instant::now() + deadline;
        for e in &self.0 {
            e.stop_interval();
        }
        for e in &mut self.0 {
            e.wait_interval(end);
        }
        // Every sender flushes on its own thread: all at once, one deadline.
        for e in &self.0 {
            e.delivery.begin_close(end);
        }
        self.0
            .into_iter()
            .map(|mut e| (e.name, e.delivery.finish_close()))
            .collect()
    }
}

impl From<PyroscopeExporter> for Sinks {
    fn from(e: PyroscopeExporter) -> Self {
        Sinks(vec![e.into_exporter()])
    }
}

impl From<OtlpProfilesExporter> for Sinks {
    fn from(e: OtlpProfilesExporter) -> Self {
        Sinks(vec![e.into_exporter()])
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
            format!(
                "`{}` is not an http:// or https:// URL with a host",
                redact_url(url)
            ),
        ))
    }
}

/// `url` fit to print: credentials in it (`user:password@`) become `***@`, the
/// values of its query string `***` (`?token=***`), a fragment `#***`. Everything
/// spanprof-export logs or formats about an endpoint goes through this; use it for
/// your own start-up lines too.
///
/// ```
/// use spanprof_export::redact_url;
/// assert_eq!(
///     redact_url("https://alice:s3cret@pyroscope.example:4040/?token=abc&org=7"),
///     "https://***@pyroscope.example:4040/?token=***&org=***"
/// );
/// assert_eq!(redact_url("http://localhost:4317"), "http://localhost:4317");
/// ```
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let mut out = String::with_capacity(url.len());
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rfind('@') {
        Some(at) => {
            out.push_str("***@");
            out.push_str(&authority[at + 1..]);
        }
        None => out.push_str(authority),
    }
    let (tail, fragment) = match tail.split_once('#') {
        Some((t, _)) => (t, true),
        None => (tail, false),
    };
    match tail.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                let key = pair.split('=').next().unwrap_or_default();
                out.push_str(key);
                if !pair.is_empty() {
                    out.push_str("=***");
                }
            }
        }
        None => out.push_str(tail),
    }
    if fragment {
        out.push_str("#***");
    }
    out
}

/// What `Debug` shows of PEM bytes: their size only.
pub(crate) fn pem_summary(pem: &Option<Vec<u8>>) -> Option<String> {
    pem.as_ref().map(|p| format!("<{} bytes>", p.len()))
}

/// `base` with `path` appended to its path, before any query string.
pub(crate) fn join_path(base: &str, path: &str) -> String {
    match base.split_once('?') {
        Some((b, query)) => format!("{}{path}?{query}", b.trim_end_matches('/')),
        None => format!("{}{path}", base.trim_end_matches('/')),
    }
}

/// An error and its causes, one after another (`a: b: c`).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

/// The first `max` bytes of `s`, or fewer to end on a character boundary.
pub(crate) fn truncate_utf8(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
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

/// Most bytes of a server's error message kept.
const MAX_MESSAGE: usize = 512;

/// Maps a response (or a transport error) to the retry policy. Transport errors are
/// described without their URL (which may hold credentials).
pub(crate) async fn classify(
    result: Result<reqwest::Response, reqwest::Error>,
) -> Result<(), SendError> {
    match result {
        Err(e) => Err(SendError::Retryable(error_chain(&e.without_url()))),
        Ok(resp) => {
            let status = resp.status();
            if status.is_success() {
                return Ok(());
            }
            let mut message = resp.text().await.unwrap_or_default();
            truncate_utf8(&mut message, MAX_MESSAGE);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted_wherever_the_secret_sits() {
        for (url, want) in [
            ("http://localhost:4317", "http://localhost:4317"),
            ("https://u:p@h:1/x/y", "https://***@h:1/x/y"),
            ("https://token@h", "https://***@h"),
            ("http://h/p?token=t&x", "http://h/p?token=***&x=***"),
            ("http://h?a=1#frag", "http://h?a=***#***"),
            ("u:p@h:4040", "***@h:4040"),
            ("http://h/a@b", "http://h/a@b"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn paths_go_before_the_query_string() {
        assert_eq!(join_path("http://h/", "/v"), "http://h/v");
        assert_eq!(join_path("http://h/?t=1", "/v"), "http://h/v?t=1");
    }

    #[test]
    fn truncation_ends_on_a_character_boundary() {
        let mut s = format!("x{}", "é".repeat(400));
        truncate_utf8(&mut s, 512);
        assert_eq!(s.len(), 511);
        let mut s = "short".to_owned();
        truncate_utf8(&mut s, 512);
        assert_eq!(s, "short");
    }
}
