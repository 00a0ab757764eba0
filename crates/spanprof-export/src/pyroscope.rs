//! Grafana Pyroscope: push to `POST /push.v1.PusherService/Push` (a Connect unary
//! call: protobuf `PushRequest` body, `Content-Type: application/proto`), gzip'd pprof
//! in `raw_profile`, series labels `__name__=process_cpu` and `service_name` (the
//! OpenTelemetry `service.name`) plus user tags, so Grafana Tempo's
//! `tracesToProfiles` with profile type `process_cpu:cpu:nanoseconds:cpu:nanoseconds`
//! finds the profiles with no relabelling.
//!
//! Why not the `pyroscope` crate (2.x): its session pushes the same request but a
//! failed push is logged and lost (no retry, no backoff, no bounded queue or drop
//! counters), it brings its own blocking HTTP client thread, and its default TLS
//! stack pulls aws-lc where the rest of the workspace uses rustls with ring. Its
//! `Backend` trait can hand over raw pprof, but the delivery is what we needed.

use std::time::Duration;

use prost::Message;

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
/// Default push interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

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

/// Configuration of the Pyroscope sink.
#[derive(Debug, Clone)]
pub struct PyroscopeConfig {
    /// Server address, for example `http://pyroscope:4040` or `https://…`.
    pub server: String,
    /// `service_name` series label. Defaults to `OTEL_SERVICE_NAME`, else the
    /// executable's name.
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
}

impl PyroscopeConfig {
    /// A configuration for `server` with the defaults.
    pub fn new(server: impl Into<String>) -> Self {
        PyroscopeConfig {
            server: server.into(),
            service_name: crate::default_service_name(),
            tags: Vec::new(),
            auth: PyroscopeAuth::None,
            tenant_id: None,
            interval: DEFAULT_INTERVAL,
            delivery: DeliveryConfig::default(),
            ca_certificates_pem: None,
        }
    }

    /// From `PYROSCOPE_SERVER_ADDRESS` (none set: `Ok(None)`),
    /// `PYROSCOPE_BASIC_AUTH_USER` / `PYROSCOPE_BASIC_AUTH_PASSWORD`,
    /// `PYROSCOPE_TENANT_ID`, `OTEL_SERVICE_NAME` and `PYROSCOPE_CA_CERT_FILE` (a PEM
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
        if let Some(name) = var("OTEL_SERVICE_NAME").filter(|s| !s.is_empty()) {
            cfg.service_name = name;
        }
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
        crate::validate_url("server", &self.server)?;
        if self.service_name.is_empty() {
            return Err(ExportError::config("service_name", "must not be empty"));
        }
        if self.interval < Duration::from_millis(100) {
            return Err(ExportError::config("interval", "must be at least 100ms"));
        }
        Ok(())
    }

    /// The series labels of every push.
    pub fn series_labels(&self) -> Vec<proto::types::v1::LabelPair> {
        let mut labels = vec![
            proto::types::v1::LabelPair {
                name: "__name__".into(),
                value: PROFILE_NAME.into(),
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

/// Encodes one push of a gzip'd pprof profile.
pub fn push_request(cfg: &PyroscopeConfig, pprof_gz: Vec<u8>, id: String) -> Vec<u8> {
    proto::push::v1::PushRequest {
        series: vec![proto::push::v1::RawProfileSeries {
            labels: cfg.series_labels(),
            samples: vec![proto::push::v1::RawSample {
                raw_profile: pprof_gz,
                id,
            }],
        }],
    }
    .encode_to_vec()
}

struct PushTransport {
    client: reqwest::Client,
    url: String,
    auth: PyroscopeAuth,
    tenant_id: Option<String>,
}

impl Transport for PushTransport {
    fn send<'a>(&'a self, payload: &'a [u8]) -> SendFuture<'a> {
        Box::pin(async move {
            let mut req = self
                .client
                .post(&self.url)
                .header(http::header::CONTENT_TYPE, "application/proto")
                .header(http::header::USER_AGENT, crate::USER_AGENT)
                .body(payload.to_vec());
            req = match &self.auth {
                PyroscopeAuth::None => req,
                PyroscopeAuth::Basic { user, password } => req.basic_auth(user, Some(password)),
                PyroscopeAuth::Bearer(token) => req.bearer_auth(token),
            };
            if let Some(t) = &self.tenant_id {
                req = req.header("X-Scope-OrgID", t);
            }
            crate::classify(req.send().await).await
        })
    }
}

/// Pushes a labelled CPU profile to Pyroscope every interval.
#[derive(Debug)]
pub struct PyroscopeExporter {
    exporter: Exporter,
}

impl PyroscopeExporter {
    /// Starts pushing the profiles of `source` (usually `Profiler::window`).
    pub fn start(cfg: PyroscopeConfig, source: ProfileSource) -> Result<Self, ExportError> {
        cfg.validate()?;
        let transport = PushTransport {
            client: crate::http_client("ca_certificates_pem", cfg.ca_certificates_pem.as_deref())?,
            url: format!("{}{PUSH_PATH}", cfg.server.trim_end_matches('/')),
            auth: cfg.auth.clone(),
            tenant_id: cfg.tenant_id.clone(),
        };
        let delivery = Delivery::start("pyroscope", cfg.delivery.clone(), transport);
        let mut seq = 0u64;
        let exporter = Exporter::start(
            "pyroscope-interval",
            cfg.interval,
            source,
            delivery,
            move |profile| {
                if profile.samples.is_empty() {
                    return None;
                }
                seq += 1;
                let id = format!("{:016x}-{seq}", std::process::id());
                Some(push_request(
                    &cfg,
                    spanprof_core::pprof::encode_gzip(profile),
                    id,
                ))
            },
        );
        Ok(PyroscopeExporter { exporter })
    }

    /// Delivery counters.
    pub fn stats(&self) -> DeliveryStats {
        self.exporter.stats()
    }

    /// Pushes what was collected since the last push, then flushes the queue within
    /// `deadline` and stops.
    pub fn shutdown(self, deadline: Duration) -> DeliveryStats {
        self.exporter.shutdown(deadline)
    }
}
