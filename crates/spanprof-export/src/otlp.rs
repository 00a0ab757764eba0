//! OTLP profiles (`profiles/v1development`, **experimental**: the signal is alpha and
//! its schema still changes). Each sample's `link_index` points at a
//! `Link{trace_id, span_id}` of the span whose labels it carries, so a backend can go
//! from a sample to its trace. HTTP (`POST /v1development/profiles`,
//! `application/x-protobuf`) and gRPC (`ProfilesService/Export`), with
//! `opentelemetry-proto`'s generated types (`opentelemetry-otlp` has no profiles
//! exporter).

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development as pb;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use spanprof_core::{Frame, Profile};

use crate::delivery::{Delivery, DeliveryConfig, DeliveryStats, SendError, SendFuture, Transport};
use crate::{ExportError, Exporter, ProfileSource};

/// The HTTP path of the profiles signal.
pub const HTTP_PATH: &str = "/v1development/profiles";
/// Default export interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `http/protobuf` (the default).
    HttpProtobuf,
    /// `grpc`.
    Grpc,
}

/// Configuration of the OTLP profiles sink.
#[derive(Debug, Clone)]
pub struct OtlpProfilesConfig {
    /// For HTTP, the full URL profiles are posted to; for gRPC, the server address.
    pub endpoint: String,
    /// Transport.
    pub protocol: OtlpProtocol,
    /// `service.name` resource attribute.
    pub service_name: String,
    /// How often a profile is exported. Defaults to [`DEFAULT_INTERVAL`].
    pub interval: Duration,
    /// Delivery settings.
    pub delivery: DeliveryConfig,
    /// PEM certificates trusted for `https://` endpoints besides the public (webpki)
    /// roots: a private CA's (`OTEL_EXPORTER_OTLP_CERTIFICATE`). Read a file with
    /// [`crate::read_ca_certificates`].
    pub ca_certificates_pem: Option<Vec<u8>>,
}

impl OtlpProfilesConfig {
    /// A configuration posting to `endpoint` over HTTP.
    pub fn new(endpoint: impl Into<String>, protocol: OtlpProtocol) -> Self {
        OtlpProfilesConfig {
            endpoint: endpoint.into(),
            protocol,
            service_name: crate::default_service_name(),
            interval: DEFAULT_INTERVAL,
            delivery: DeliveryConfig::default(),
            ca_certificates_pem: None,
        }
    }

    /// From the standard variables: `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` (used as is)
    /// or `OTEL_EXPORTER_OTLP_ENDPOINT` (HTTP: `/v1development/profiles` appended),
    /// `OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL`
    /// (`http/protobuf` or `grpc`), `OTEL_SERVICE_NAME`, and
    /// `OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE` / `OTEL_EXPORTER_OTLP_CERTIFICATE` (a
    /// PEM file of CA certificates to trust for `https://`). `Ok(None)` when no
    /// endpoint is set.
    pub fn from_env() -> Result<Option<Self>, ExportError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`OtlpProfilesConfig::from_env`], reading variables through `var`.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, ExportError> {
        let nonempty = |k: &str| var(k).filter(|v| !v.is_empty());
        let protocol = match nonempty("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL")
            .map(|p| ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", p))
            .or_else(|| {
                nonempty("OTEL_EXPORTER_OTLP_PROTOCOL").map(|p| ("OTEL_EXPORTER_OTLP_PROTOCOL", p))
            }) {
            None => OtlpProtocol::HttpProtobuf,
            Some((_, p)) if p == "http/protobuf" => OtlpProtocol::HttpProtobuf,
            Some((_, p)) if p == "grpc" => OtlpProtocol::Grpc,
            Some((var, other)) => {
                return Err(ExportError::config(
                    var,
                    format!("`{other}` is not supported (use http/protobuf or grpc)"),
                ));
            }
        };
        let endpoint = if let Some(e) = nonempty("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT") {
            e
        } else if let Some(base) = nonempty("OTEL_EXPORTER_OTLP_ENDPOINT") {
            match protocol {
                OtlpProtocol::HttpProtobuf => format!("{}{HTTP_PATH}", base.trim_end_matches('/')),
                OtlpProtocol::Grpc => base,
            }
        } else {
            return Ok(None);
        };
        let mut cfg = OtlpProfilesConfig::new(endpoint, protocol);
        if let Some(name) = nonempty("OTEL_SERVICE_NAME") {
            cfg.service_name = name;
        }
        crate::validate_url("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", &cfg.endpoint)?;
        for var in [
            "OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ] {
            if let Some(path) = nonempty(var) {
                cfg.ca_certificates_pem = Some(crate::read_ca_certificates(var, path.as_ref())?);
                break;
            }
        }
        Ok(Some(cfg))
    }
}

/// Interns values into a dictionary table whose index 0 is the zero value.
struct Table<K, V> {
    index: HashMap<K, i32>,
    values: Vec<V>,
}

impl<K: std::hash::Hash + Eq, V: Default> Table<K, V> {
    fn new() -> Self {
        Table {
            index: HashMap::new(),
            values: vec![V::default()],
        }
    }

    fn get(&mut self, key: K, make: impl FnOnce() -> V) -> i32 {
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = self.values.len() as i32;
        self.values.push(make());
        self.index.insert(key, i);
        i
    }
}

/// Builds the export request for one profile (one resource, one scope, one profile,
/// one shared dictionary).
pub fn export_request(profile: &Profile, service_name: &str) -> ExportProfilesServiceRequest {
    let mut strings: Table<String, String> = Table::new();
    let mut functions: Table<(i32, i32), pb::Function> = Table::new();
    let mut locations: Table<Vec<(u64, i32, i64)>, pb::Location> = Table::new();
    let mut stacks: Table<Vec<i32>, pb::Stack> = Table::new();
    let mut links: Table<(u128, u64), pb::Link> = Table::new();
    let mut attrs: Table<(i32, String), pb::KeyValueAndUnit> = Table::new();
    let mut s = |v: &str| strings.get(v.to_owned(), || v.to_owned());

    let cpu = s("cpu");
    let nanoseconds = s("nanoseconds");
    let mut samples = Vec::with_capacity(profile.samples.len());
    for sample in &profile.samples {
        let mut location_indices = Vec::new();
        let frames: &[Frame] = &sample.stack;
        let mut i = 0;
        while i < frames.len() {
            // One location per physical frame: inlined frames at one address share it.
            let mut end = i;
            while frames[end].inlined
                && end + 1 < frames.len()
                && frames[end + 1].address == frames[i].address
            {
                end += 1;
            }
            let mut key = Vec::new();
            let mut lines = Vec::new();
            for f in &frames[i..=end] {
                let name = s(&f.function);
                let file = f.file.as_deref().map_or(0, &mut s);
                let fi = functions.get((name, file), || pb::Function {
                    name_strindex: name,
                    system_name_strindex: name,
                    filename_strindex: file,
                    start_line: 0,
                });
                key.push((frames[i].address, fi, i64::from(f.line)));
                lines.push(pb::Line {
                    function_index: fi,
                    line: i64::from(f.line),
                    column: 0,
                });
            }
            let address = frames[i].address;
            location_indices.push(locations.get(key, || pb::Location {
                mapping_index: 0,
                address,
                lines,
                attribute_indices: vec![],
            }));
            i = end + 1;
        }
        let stack_index = stacks.get(location_indices.clone(), || pb::Stack { location_indices });
        let (link_index, attribute_indices) = match &sample.labels {
            Some(l) if l.span_id != 0 => {
                let link = links.get((l.trace_id, l.span_id), || pb::Link {
                    trace_id: l.trace_id.to_be_bytes().to_vec(),
                    span_id: l.span_id.to_be_bytes().to_vec(),
                });
                let mut a = Vec::new();
                for (k, v) in [("span_name", &*l.span_name), ("route", &*l.route)] {
                    if !v.is_empty() {
                        let key = s(k);
                        a.push(attrs.get((key, v.to_owned()), || pb::KeyValueAndUnit {
                            key_strindex: key,
                            value: Some(AnyValue {
                                value: Some(any_value::Value::StringValue(v.to_owned())),
                            }),
                            unit_strindex: 0,
                        }));
                    }
                }
                (link, a)
            }
            _ => (0, vec![]),
        };
        samples.push(pb::Sample {
            stack_index,
            attribute_indices,
            link_index,
            values: vec![i64::try_from(sample.cpu_ns).unwrap_or(i64::MAX)],
            timestamps_unix_nano: vec![],
        });
    }
    let time_unix_nano = profile
        .start
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let profile_id = {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&time_unix_nano.to_be_bytes());
        id[8..12].copy_from_slice(&std::process::id().to_be_bytes());
        id
    };
    let pb_profile = pb::Profile {
        sample_type: Some(pb::ValueType {
            type_strindex: cpu,
            unit_strindex: nanoseconds,
        }),
        samples,
        time_unix_nano,
        duration_nano: profile.duration_ns,
        period_type: Some(pb::ValueType {
            type_strindex: cpu,
            unit_strindex: nanoseconds,
        }),
        period: i64::try_from(profile.period_ns).unwrap_or(i64::MAX),
        profile_id: profile_id.to_vec(),
        ..Default::default()
    };
    ExportProfilesServiceRequest {
        resource_profiles: vec![pb::ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(service_name.to_owned())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_profiles: vec![pb::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "spanprof".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                profiles: vec![pb_profile],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(pb::ProfilesDictionary {
            mapping_table: vec![pb::Mapping::default()],
            location_table: locations.values,
            function_table: functions.values,
            link_table: links.values,
            string_table: strings.values,
            attribute_table: attrs.values,
            stack_table: stacks.values,
        }),
    }
}

struct HttpTransport {
    client: reqwest::Client,
    url: String,
}

impl Transport for HttpTransport {
    fn send<'a>(&'a self, payload: &'a [u8]) -> SendFuture<'a> {
        Box::pin(async move {
            let req = self
                .client
                .post(&self.url)
                .header(http::header::CONTENT_TYPE, "application/x-protobuf")
                .body(payload.to_vec());
            crate::classify(req.send().await).await
        })
    }
}

struct GrpcTransport {
    endpoint: tonic::transport::Endpoint,
    /// One channel for the exporter's life, made on the first send (inside the
    /// delivery runtime); it reconnects by itself after failures.
    channel: std::sync::OnceLock<tonic::transport::Channel>,
}

impl Transport for GrpcTransport {
    fn send<'a>(&'a self, payload: &'a [u8]) -> SendFuture<'a> {
        Box::pin(async move {
            let request =
                ExportProfilesServiceRequest::decode(payload).map_err(|e| SendError::Rejected {
                    status: 0,
                    message: e.to_string(),
                })?;
            let channel = self
                .channel
                .get_or_init(|| self.endpoint.connect_lazy())
                .clone();
            let mut client = ProfilesServiceClient::new(channel);
            match client.export(request).await {
                Ok(_) => Ok(()),
                Err(status) => {
                    use tonic::Code;
                    match status.code() {
                        // `Cancelled` is what tonic reports when the endpoint's
                        // timeout cuts a connect or a call short.
                        Code::Unavailable
                        | Code::Cancelled
                        | Code::DeadlineExceeded
                        | Code::ResourceExhausted
                        | Code::Aborted
                        | Code::Internal
                        | Code::Unknown => Err(SendError::Retryable(status.to_string())),
                        code => Err(SendError::Rejected {
                            status: code as u16,
                            message: status.message().to_owned(),
                        }),
                    }
                }
            }
        })
    }
}

/// Exports a labelled CPU profile as OTLP profiles every interval. Experimental.
#[derive(Debug)]
pub struct OtlpProfilesExporter {
    exporter: Exporter,
}

impl OtlpProfilesExporter {
    /// Starts exporting the profiles of `source`.
    pub fn start(cfg: OtlpProfilesConfig, source: ProfileSource) -> Result<Self, ExportError> {
        crate::validate_url("endpoint", &cfg.endpoint)?;
        let delivery = match cfg.protocol {
            OtlpProtocol::HttpProtobuf => Delivery::start(
                "otlp-profiles",
                cfg.delivery.clone(),
                HttpTransport {
                    client: crate::http_client(
                        "ca_certificates_pem",
                        cfg.ca_certificates_pem.as_deref(),
                    )?,
                    url: cfg.endpoint.clone(),
                },
            ),
            OtlpProtocol::Grpc => {
                let mut endpoint = tonic::transport::Endpoint::from_shared(cfg.endpoint.clone())
                    .map_err(|e| ExportError::config("endpoint", e.to_string()))?
                    .timeout(cfg.delivery.request_timeout)
                    .connect_timeout(Duration::from_secs(5));
                if cfg.endpoint.starts_with("https://") {
                    let mut tls = tonic::transport::ClientTlsConfig::new().with_webpki_roots();
                    if let Some(pem) = &cfg.ca_certificates_pem {
                        crate::parse_ca_certificates("ca_certificates_pem", pem)?;
                        tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
                    }
                    let field = if cfg.ca_certificates_pem.is_some() {
                        "ca_certificates_pem"
                    } else {
                        "endpoint"
                    };
                    endpoint = endpoint
                        .tls_config(tls)
                        .map_err(|e| ExportError::config(field, e.to_string()))?;
                }
                Delivery::start(
                    "otlp-profiles",
                    cfg.delivery.clone(),
                    GrpcTransport {
                        endpoint,
                        channel: std::sync::OnceLock::new(),
                    },
                )
            }
        };
        let service = cfg.service_name.clone();
        let exporter = Exporter::start("otlp-interval", cfg.interval, source, delivery, move |p| {
            (!p.samples.is_empty()).then(|| export_request(p, &service).encode_to_vec())
        });
        Ok(OtlpProfilesExporter { exporter })
    }

    /// Delivery counters.
    pub fn stats(&self) -> DeliveryStats {
        self.exporter.stats()
    }

    /// Exports what was collected since the last export, flushes within `deadline`,
    /// stops.
    pub fn shutdown(self, deadline: Duration) -> DeliveryStats {
        self.exporter.shutdown(deadline)
    }
}
