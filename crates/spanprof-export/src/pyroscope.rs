//! Grafana Pyroscope: push to `POST /push.v1.PusherService/Push` (a Connect unary
//! call: protobuf `PushRequest` body, `Content-Type: application/proto`), gzip'd pprof
//! in `raw_profile`, series labels `__name__=process_cpu` and `service_name` (the
//! OpenTelemetry `service.name`) plus user tags, so Grafana Tempo's
//! `tracesToProfiles` with profile type `process_cpu:cpu:nanoseconds:cpu:nanoseconds`
//! finds the profiles with no relabelling. An interval with wall-clock samples of hot
//! polls adds a second series, `__name__=wall` (profile type
//! `wall:wall:nanoseconds:wall:nanoseconds`). Besides `span_id` and `trace_id`, which
//! Pyroscope keeps per sample, a push carries only bounded sample labels
//! ([`PUSH_SAMPLE_LABELS`]): Pyroscope makes series of all the others.
//!
//! Why not the `pyroscope` crate (2.x): its session pushes the same request but a
//! failed push is logged and lost (no retry, no backoff, no bounded queue or drop
//! counters), it brings its own blocking HTTP client thread, and its default TLS
//! stack pulls aws-lc where the rest of the workspace uses rustls with ring. Its
//! `Backend` trait can hand over raw pprof, but the delivery is what we needed.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use spanprof_core::pprof::{
    LABEL_HOT, LABEL_ROUTE, LABEL_SPAN_ID, LABEL_SPAN_LATENCY, LABEL_SPAN_NAME, LABEL_TRACE_ID,
};
use spanprof_core::{Profile, ProfileSample, SampleLabels};

use crate::delivery::{Delivery, DeliveryConfig, DeliveryStats, SendFuture, Transport};
use crate::{ExportError, Exporter, ProfileSource};

/// The generated types of `proto/push/v1/push.proto` and `proto/types/v1/types.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    /// `push`.
    pub mod push {
        /// `push.v1`.
        pub mod v1 {
            include!("gen/push.v1.rs");
        }
    }
    /// `types`.
    pub mod types {
        /// `types.v1`.
        pub mod v1 {
            include!("gen/types.v1.rs");
        }
    }
}

/// The push path.
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
/// The `__name__` series label of CPU profiles.
pub const PROFILE_NAME: &str = "process_cpu";
/// The `__name__` series label of the wall-clock profiles of hot polls (profile type
/// `wall:wall:nanoseconds:wall:nanoseconds`).
pub const WALL_PROFILE_NAME: &str = "wall";
/// Default push interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// The pprof sample labels a push carries. Pyroscope keeps `span_id` and `trace_id`
/// as sample labels and turns every other sample label into a *series* label (its
/// distributor's `pprofsplit`), and a tenant may have 5 000 series by default: so
/// only labels with a bounded set of values go besides the two ids (`span_name` and
/// `route` are templates; `hot` has three values, `span_latency` five, and only with
/// [`PyroscopeConfig::latency_label`]). Per-request
/// labels such as `root_span_id` stay in the pprof files and the `/debug` endpoint
/// only.
pub const PUSH_SAMPLE_LABELS: [&str; 6] = [
    LABEL_SPAN_ID,
    LABEL_TRACE_ID,
    LABEL_SPAN_NAME,
    LABEL_ROUTE,
    LABEL_HOT,
    LABEL_SPAN_LATENCY,
];

/// Credentials for the push.
#[derive(Clone, PartialEq, Eq)]
pub enum PyroscopeAuth {
    /// No credentials.
    None,
    /// HTTP basic auth (`PYROSCOPE_BASIC_AUTH_USER` / `_PASSWORD`).
    Basic {
        /// User.
        user: String,
        /// Password.
        password: String,
    },
    /// `Authorization: Bearer <token>`.
    Bearer(String),
}

impl std::fmt::Debug for PyroscopeAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets.
        match self {
            PyroscopeAuth::None => f.write_str("None"),
            PyroscopeAuth::Basic { user, .. } => write!(f, "Basic({user}, ***)"),
            PyroscopeAuth::Bearer(_) => f.write_str("Bearer(***)"),
        }
    }
}

/// Configuration of the Pyroscope sink. `Debug` and `Display` never show secrets:
/// the server's credentials and query values (see [`crate::redact_url`]), the auth
/// and the CA bytes.
#[derive(Clone)]
#[non_exhaustive]
pub struct PyroscopeConfig {
    /// Server address, for example `http://pyroscope:4040` or `https://…`.
    pub server: String,
    /// `service_name` series label. Defaults to the traces' `service.name`: the
    /// tracer provider's `Resource`'s (with `SpanProfileProcessor`; followed if the
    /// provider is built after the sink starts), else `OTEL_SERVICE_NAME`, else
    /// `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, else the executable's name.
    pub service_name: String,
    /// Extra series labels.
    pub tags: Vec<(String, String)>,
    /// Credentials.
    pub auth: PyroscopeAuth,
    /// `X-Scope-OrgID` tenant.
    pub tenant_id: Option<String>,
    /// How often a profile is pushed. Defaults to [`DEFAULT_INTERVAL`].
    pub interval: Duration,
    /// Delivery settings.
    pub delivery: DeliveryConfig,
    /// PEM certificates trusted for `https://` servers besides the public (webpki)
    /// roots: a private CA's. Read a file with [`crate::read_ca_certificates`], or
    /// set `PYROSCOPE_CA_CERT_FILE` for [`PyroscopeConfig::from_env`].
    pub ca_certificates_pem: Option<Vec<u8>>,
    /// Whether samples carry their request's latency class, `span_latency`
    /// (`p0-50` … `p99+`, `open`), so that Grafana can select a route's slow requests.
    /// Pyroscope makes a series of every distinct set of sample labels: with it, each
    /// (span name, route, hot) series splits into at most five, so it is off by
    /// default (`false`); `PYROSCOPE_LATENCY_LABEL=true` turns it on. pprof files,
    /// the profile endpoint and OTLP profiles always carry the class.
    pub latency_label: bool,
}

impl std::fmt::Debug for PyroscopeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyroscopeConfig")
            .field("server", &crate::redact_url(&self.server))
            .field("service_name", &self.service_name)
            .field("tags", &self.tags)
            .field("auth", &self.auth)
            .field("tenant_id", &self.tenant_id)
            .field("interval", &self.interval)
            .field("delivery", &self.delivery)
            .field(
                "ca_certificates_pem",
                &crate::http::pem_summary(&self.ca_certificates_pem),
            )
            .field("latency_label", &self.latency_label)
            .finish()
    }
}

/// `Pyroscope push to <server, redacted> as <service_name>`: a start-up line.
impl std::fmt::Display for PyroscopeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Pyroscope push to {} as service_name={}",
            crate::redact_url(&self.server),
            self.service_name
        )
    }
}

impl PyroscopeConfig {
    /// A configuration for `server` with the defaults.
    pub fn new(server: impl Into<String>) -> Self {
        PyroscopeConfig {
            server: server.into(),
            service_name: crate::default_service_name(|k| std::env::var(k).ok()),
            tags: Vec::new(),
            auth: PyroscopeAuth::None,
            tenant_id: None,
            interval: DEFAULT_INTERVAL,
            delivery: DeliveryConfig::default(),
            ca_certificates_pem: None,
            latency_label: false,
        }
    }

    /// From `PYROSCOPE_SERVER_ADDRESS` (none set: `Ok(None)`),
    /// `PYROSCOPE_BASIC_AUTH_USER` / `PYROSCOPE_BASIC_AUTH_PASSWORD`,
    /// `PYROSCOPE_TENANT_ID`, `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` (when no
    /// tracer provider names the service) and `PYROSCOPE_CA_CERT_FILE` (a PEM
    /// file of CA certificates to trust besides the public roots; spanprof's own
    /// variable, the Pyroscope SDKs have none).
    pub fn from_env() -> Result<Option<Self>, ExportError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`PyroscopeConfig::from_env`], reading variables through `var`.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, ExportError> {
        let Some(server) = var("PYROSCOPE_SERVER_ADDRESS").filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let mut cfg = PyroscopeConfig::new(server);
        cfg.service_name = crate::default_service_name(&var);
        match (
            var("PYROSCOPE_BASIC_AUTH_USER"),
            var("PYROSCOPE_BASIC_AUTH_PASSWORD"),
        ) {
            (Some(user), Some(password)) => cfg.auth = PyroscopeAuth::Basic { user, password },
            (Some(_), None) => {
                return Err(ExportError::config(
                    "PYROSCOPE_BASIC_AUTH_PASSWORD",
                    "PYROSCOPE_BASIC_AUTH_USER is set without a password",
                ));
            }
            (None, Some(_)) => {
                return Err(ExportError::config(
                    "PYROSCOPE_BASIC_AUTH_USER",
                    "PYROSCOPE_BASIC_AUTH_PASSWORD is set without a user",
                ));
            }
            (None, None) => {}
        }
        cfg.tenant_id = var("PYROSCOPE_TENANT_ID").filter(|s| !s.is_empty());
        if let Some(v) = var("PYROSCOPE_LATENCY_LABEL").filter(|s| !s.is_empty()) {
            cfg.latency_label = match v.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => true,
                "false" | "0" | "no" | "off" => false,
                _ => {
                    return Err(ExportError::config(
                        "PYROSCOPE_LATENCY_LABEL",
                        format!("`{v}` is not true or false"),
                    ));
                }
            };
        }
        if let Some(path) = var("PYROSCOPE_CA_CERT_FILE").filter(|s| !s.is_empty()) {
            cfg.ca_certificates_pem = Some(crate::read_ca_certificates(
                "PYROSCOPE_CA_CERT_FILE",
                path.as_ref(),
            )?);
        }
        cfg.validate()?;
        Ok(Some(cfg))
    }

    fn validate(&self) -> Result<(), ExportError> {
        crate::http::validate_url("server", &self.server)?;
        if self.service_name.is_empty() {
            return Err(ExportError::config("service_name", "must not be empty"));
        }
        if self.interval < Duration::from_millis(100) {
            return Err(ExportError::config("interval", "must be at least 100ms"));
        }
        self.delivery.validate()
    }

    /// The series labels of every CPU profile pushed.
    pub fn series_labels(&self) -> Vec<proto::types::v1::LabelPair> {
        self.series_labels_named(PROFILE_NAME)
    }

    /// The series labels with `__name__` = `name`.
    fn series_labels_named(&self, name: &str) -> Vec<proto::types::v1::LabelPair> {
        let mut labels = vec![
            proto::types::v1::LabelPair {
                name: "__name__".into(),
                value: name.into(),
            },
            proto::types::v1::LabelPair {
                name: "service_name".into(),
                value: self.service_name.clone(),
            },
        ];
        for (k, v) in &self.tags {
            if k != "__name__" && k != "service_name" {
                labels.push(proto::types::v1::LabelPair {
                    name: k.clone(),
                    value: v.clone(),
                });
            }
        }
        labels
    }
}

/// The gzip'd pprof of one push's CPU profile: `profile`'s CPU samples with only the
/// [`PUSH_SAMPLE_LABELS`] (less `span_latency` without `latency`).
pub(crate) fn push_pprof(profile: &Profile, latency: bool) -> Vec<u8> {
    push_gz(profile, false, latency)
}

/// The gzip'd pprof of one push's wall-clock profile (`profile`'s wall-clock samples
/// of hot polls, labelled as [`push_pprof`]'s), if it has any.
pub(crate) fn push_pprof_wall(profile: &Profile, latency: bool) -> Option<Vec<u8>> {
    profile
        .samples
        .iter()
        .any(|s| s.wall_ns > 0)
        .then(|| push_gz(profile, true, latency))
}

fn push_gz(profile: &Profile, wall: bool, latency: bool) -> Vec<u8> {
    // Leave the per-request ids out of the labels (and so out of the string table)…
    let mut bounded: HashMap<*const SampleLabels, Arc<SampleLabels>> = HashMap::new();
    let samples = profile
        .samples
        .iter()
        .filter(|s| if wall { s.wall_ns > 0 } else { s.count > 0 })
        .map(|s| ProfileSample {
            wall_ns: if wall { s.wall_ns } else { 0 },
            labels: s.labels.as_ref().map(|l| {
                bounded
                    .entry(Arc::as_ptr(l))
                    .or_insert_with(|| {
                        Arc::new(SampleLabels {
                            parent_span_id: 0,
                            root_span_id: 0,
                            latency: l.latency.filter(|_| latency),
                            ..(**l).clone()
                        })
                    })
                    .clone()
            }),
            ..s.clone()
        })
        .collect();
    let bounded = Profile {
        samples,
        ..*profile
    };
    let mut pprof = if wall {
        spanprof_core::pprof::to_proto_wall(&bounded)
    } else {
        spanprof_core::pprof::to_proto(&bounded)
    };
    // …and keep only the listed keys, whatever else the encoder may add one day.
    let keep: Vec<i64> = pprof
        .string_table
        .iter()
        .enumerate()
        .filter(|(_, s)| PUSH_SAMPLE_LABELS.contains(&s.as_str()))
        .map(|(i, _)| i as i64)
        .collect();
    for sample in &mut pprof.sample {
        sample.label.retain(|l| keep.contains(&l.key));
    }
    let raw = pprof.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(raw.len() / 4 + 64),
        flate2::Compression::default(),
    );
    gz.write_all(&raw).expect("writing to a Vec cannot fail");
    gz.finish().expect("writing to a Vec cannot fail")
}

/// A new random profile id in the form Pyroscope's ingester parses: a version 4
/// UUID (`8-4-4-4-12` lowercase hex digits).
pub(crate) fn new_profile_id() -> String {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    // `RandomState` is keyed from the OS's random source (once per thread, then
    // stepped for each new one): two keyed hashes give 128 unpredictable bits.
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let state = RandomState::new();
    let hi = state.hash_one((n, std::process::id(), std::time::SystemTime::now()));
    let lo = state.hash_one((hi, n));
    let mut b = ((u128::from(hi) << 64) | u128::from(lo)).to_be_bytes();
    b[6] = (b[6] & 0x0f) | 0x40; // version 4
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Encodes one push of a gzip'd pprof profile with profile id `id`: the request body
/// the exporter sends (public for the wire-format tests).
#[doc(hidden)]
pub fn push_request(cfg: &PyroscopeConfig, pprof_gz: Vec<u8>, id: String) -> Vec<u8> {
    push_series(cfg, pprof_gz, id, None)
}

/// [`push_request`] with, when given, a second series: the wall-clock profile
/// (`__name__` = [`WALL_PROFILE_NAME`]) with its own profile id.
fn push_series(
    cfg: &PyroscopeConfig,
    pprof_gz: Vec<u8>,
    id: String,
    wall: Option<(Vec<u8>, String)>,
) -> Vec<u8> {
    let series = |labels, raw_profile, id| proto::push::v1::RawProfileSeries {
        labels,
        samples: vec![proto::push::v1::RawSample { raw_profile, id }],
    };
    let mut all = vec![series(cfg.series_labels(), pprof_gz, id)];
    if let Some((gz, id)) = wall {
        all.push(series(cfg.series_labels_named(WALL_PROFILE_NAME), gz, id));
    }
    proto::push::v1::PushRequest { series: all }.encode_to_vec()
}

struct PushTransport {
    client: crate::http::HttpClient,
    url: String,
    /// Content type, credentials and tenant.
    headers: http::HeaderMap,
}

impl PushTransport {
    fn headers(cfg: &PyroscopeConfig) -> Result<http::HeaderMap, ExportError> {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/proto"),
        );
        let auth = match &cfg.auth {
            PyroscopeAuth::None => None,
            PyroscopeAuth::Basic { user, password } => {
                Some(crate::http::basic_auth(user, password))
            }
            PyroscopeAuth::Bearer(token) => {
                let mut v =
                    http::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                        ExportError::config("auth", "the token is not a valid header value")
                    })?;
                v.set_sensitive(true);
                Some(v)
            }
        };
        if let Some(auth) = auth {
            headers.insert(http::header::AUTHORIZATION, auth);
        }
        if let Some(t) = &cfg.tenant_id {
            let v = http::HeaderValue::from_str(t)
                .map_err(|_| ExportError::config("tenant_id", "not a valid header value"))?;
            headers.insert("x-scope-orgid", v);
        }
        Ok(headers)
    }
}

impl Transport for PushTransport {
    fn send<'a>(&'a self, payload: &'a [u8]) -> SendFuture<'a> {
        Box::pin(self.client.post(&self.url, &self.headers, payload))
    }
}

/// Pushes a labelled CPU profile to Pyroscope every interval. Dropping it stops it
/// at once (logged); [`PyroscopeExporter::shutdown`] pushes the last interval first.
#[derive(Debug)]
#[must_use = "the exporter stops when dropped: keep it (or the Sinks holding it) alive as long as the service runs"]
pub struct PyroscopeExporter {
    exporter: Exporter,
}

impl PyroscopeExporter {
    /// Starts pushing the profiles of `source` (usually `Profiler::window`).
    pub fn start(cfg: PyroscopeConfig, source: ProfileSource) -> Result<Self, ExportError> {
        cfg.validate()?;
        let transport = PushTransport {
            client: crate::http::HttpClient::new(
                "server",
                &cfg.server,
                "ca_certificates_pem",
                cfg.ca_certificates_pem.as_deref(),
            )?,
            url: crate::http::join_path(&cfg.server, PUSH_PATH),
            headers: PushTransport::headers(&cfg)?,
        };
        let delivery = Delivery::start("pyroscope", cfg.delivery.clone(), transport);
        tracing::info!(
            "spanprof: sending profiles: {cfg}, every {:?}",
            cfg.interval
        );
        let service = crate::SinkServiceName::new("pyroscope", "service_name", &cfg.service_name);
        let latency = cfg.latency_label;
        let mut cfg = cfg;
        let exporter = Exporter::start(
            "pyroscope",
            cfg.interval,
            source,
            delivery,
            move |profile| {
                if profile.samples.is_empty() {
                    return None;
                }
                let name = service.current();
                if cfg.service_name != name {
                    cfg.service_name = name.into_owned();
                }
                let wall = push_pprof_wall(profile, latency).map(|gz| (gz, new_profile_id()));
                Some(push_series(
                    &cfg,
                    push_pprof(profile, latency),
                    new_profile_id(),
                    wall,
                ))
            },
        );
        Ok(PyroscopeExporter { exporter })
    }

    /// Delivery counters.
    pub fn stats(&self) -> DeliveryStats {
        self.exporter.stats()
    }

    /// Pushes what was collected since the last push, then flushes the queue until it
    /// is empty or `deadline` has passed (a push still under way then is cut; what
    /// is left is counted in `dropped_shutdown`), and stops. Returns within
    /// `deadline`. To stop several sinks with one deadline, use [`crate::Sinks`].
    pub fn shutdown(self, deadline: Duration) -> DeliveryStats {
        self.exporter.shutdown(deadline)
    }

    pub(crate) fn into_exporter(self) -> Exporter {
        self.exporter
    }
}
