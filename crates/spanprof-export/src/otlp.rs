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
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development as pb;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use spanprof_core::{Frame, Profile, ProfileSample, SampleLabels, physical_frames};

use crate::delivery::{
    Delivery, DeliveryConfig, DeliveryStats, RejectStatus, SendError, SendFuture, Transport,
};
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

impl std::fmt::Display for OtlpProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OtlpProtocol::HttpProtobuf => "http/protobuf",
            OtlpProtocol::Grpc => "grpc",
        })
    }
}

/// Configuration of the OTLP profiles sink. `Debug` and `Display` never show
/// secrets: the endpoint's credentials and query values (see [`crate::redact_url`]),
/// header values and the CA bytes.
#[derive(Clone)]
#[non_exhaustive]
pub struct OtlpProfilesConfig {
    /// For HTTP, the full URL profiles are posted to; for gRPC, the server address.
    pub endpoint: String,
    /// Transport.
    pub protocol: OtlpProtocol,
    /// Headers (gRPC: metadata) sent with every export, such as `authorization` or
    /// an API key (`OTEL_EXPORTER_OTLP_HEADERS`).
    pub headers: Vec<(String, String)>,
    /// `service.name` resource attribute. Defaults as
    /// [`crate::PyroscopeConfig::service_name`] does: the traces' `service.name`.
    pub service_name: String,
    /// How often a profile is exported. Defaults to [`DEFAULT_INTERVAL`].
    pub interval: Duration,
    /// Delivery settings (`OTEL_EXPORTER_OTLP_TIMEOUT` sets `request_timeout`).
    pub delivery: DeliveryConfig,
    /// PEM certificates trusted for `https://` endpoints besides the public (webpki)
    /// roots: a private CA's (`OTEL_EXPORTER_OTLP_CERTIFICATE`). Read a file with
    /// [`crate::read_ca_certificates`].
    pub ca_certificates_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for OtlpProfilesConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<String> = self
            .headers
            .iter()
            .map(|(k, _)| format!("{k}: ***"))
            .collect();
        f.debug_struct("OtlpProfilesConfig")
            .field("endpoint", &crate::redact_url(&self.endpoint))
            .field("protocol", &self.protocol)
            .field("headers", &headers)
            .field("service_name", &self.service_name)
            .field("interval", &self.interval)
            .field("delivery", &self.delivery)
            .field(
                "ca_certificates_pem",
                &crate::http::pem_summary(&self.ca_certificates_pem),
            )
            .finish()
    }
}

/// `OTLP profiles (<protocol>) to <endpoint, redacted> as service.name=<name>`: a
/// start-up line.
impl std::fmt::Display for OtlpProfilesConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "OTLP profiles ({}) to {} as service.name={}",
            self.protocol,
            crate::redact_url(&self.endpoint),
            self.service_name
        )
    }
}

/// The OTLP signal whose variables are read (`OTEL_EXPORTER_OTLP_<SIGNAL>_*` before
/// `OTEL_EXPORTER_OTLP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    Profiles,
    Traces,
}

/// The variable of `what` (`ENDPOINT`, `PROTOCOL`, …) that is set, the signal's one
/// first: `(name, value)`.
pub(crate) fn otel_var(
    var: &impl Fn(&str) -> Option<String>,
    signal: Signal,
    what: &str,
) -> Option<(&'static str, String)> {
    let names: [&'static str; 2] = match (signal, what) {
        (Signal::Profiles, "ENDPOINT") => [
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ],
        (Signal::Profiles, "PROTOCOL") => [
            "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ],
        (Signal::Profiles, "TIMEOUT") => [
            "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ],
        (Signal::Profiles, "CERTIFICATE") => [
            "OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ],
        (Signal::Profiles, "HEADERS") => [
            "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ],
        (Signal::Traces, "ENDPOINT") => [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ],
        (Signal::Traces, "PROTOCOL") => [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ],
        (Signal::Traces, "TIMEOUT") => [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ],
        (Signal::Traces, "CERTIFICATE") => [
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ],
        (Signal::Traces, "HEADERS") => [
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ],
        _ => unreachable!("unknown OTLP setting {what}"),
    };
    names
        .into_iter()
        .find_map(|n| var(n).filter(|v| !v.trim().is_empty()).map(|v| (n, v)))
}

/// Where and how an OTLP signal is sent, as read from the environment: the part of
/// the profiles' and the spans' configurations that is the same.
pub(crate) struct OtlpTarget {
    pub(crate) endpoint: String,
    pub(crate) protocol: OtlpProtocol,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) request_timeout: Option<Duration>,
    pub(crate) ca_certificates_pem: Option<Vec<u8>>,
}

impl OtlpTarget {
    /// Reads the signal's variables (see [`OtlpProfilesConfig::from_env`]); `http_path`
    /// is appended to the general endpoint for HTTP. `Ok(None)` when no endpoint is
    /// set.
    pub(crate) fn from_lookup(
        var: &impl Fn(&str) -> Option<String>,
        signal: Signal,
        http_path: &str,
    ) -> Result<Option<OtlpTarget>, ExportError> {
        let protocol = match otel_var(var, signal, "PROTOCOL") {
            None => OtlpProtocol::HttpProtobuf,
            Some((_, p)) if p.trim() == "http/protobuf" => OtlpProtocol::HttpProtobuf,
            Some((_, p)) if p.trim() == "grpc" => OtlpProtocol::Grpc,
            Some((name, other)) => {
                return Err(ExportError::config(
                    name,
                    format!("`{other}` is not supported (use http/protobuf or grpc)"),
                ));
            }
        };
        let (endpoint_var, endpoint) = match otel_var(var, signal, "ENDPOINT") {
            None => return Ok(None),
            Some((name @ "OTEL_EXPORTER_OTLP_ENDPOINT", base))
                if protocol == OtlpProtocol::HttpProtobuf =>
            {
                (name, crate::http::join_path(base.trim(), http_path))
            }
            Some((name, e)) => (name, e.trim().to_owned()),
        };
        crate::http::validate_url(endpoint_var, &endpoint)?;
        let mut headers: Vec<(String, String)> = Vec::new();
        // The general variable first, so the signal's wins for a key set in both.
        let signal_headers = otel_var(&|n: &str| var(n), signal, "HEADERS").map(|(n, _)| n);
        for name in ["OTEL_EXPORTER_OTLP_HEADERS"]
            .into_iter()
            .chain(signal_headers.filter(|n| *n != "OTEL_EXPORTER_OTLP_HEADERS"))
        {
            if let Some(value) = var(name) {
                for (k, v) in parse_otlp_headers(name, &value)? {
                    headers.retain(|(old, _)| !old.eq_ignore_ascii_case(&k));
                    headers.push((k, v));
                }
            }
        }
        let request_timeout = match otel_var(var, signal, "TIMEOUT") {
            None => None,
            Some((name, ms)) => match ms.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Some(Duration::from_millis(ms)),
                _ => {
                    return Err(ExportError::config(
                        name,
                        format!("`{ms}` is not a positive whole number of milliseconds"),
                    ));
                }
            },
        };
        let ca_certificates_pem = match otel_var(var, signal, "CERTIFICATE") {
            None => None,
            Some((name, path)) => Some(crate::read_ca_certificates(name, path.as_ref())?),
        };
        Ok(Some(OtlpTarget {
            endpoint,
            protocol,
            headers,
            request_timeout,
            ca_certificates_pem,
        }))
    }
}

/// Parses an `OTEL_EXPORTER_OTLP_*HEADERS` value: `key=value` pairs separated by
/// commas, keys and values percent-encoded (the W3C Baggage form the OpenTelemetry
/// specification uses). Errors name `name` and never echo a value.
pub(crate) fn parse_otlp_headers(
    name: &str,
    value: &str,
) -> Result<Vec<(String, String)>, ExportError> {
    let mut out = Vec::new();
    for (i, entry) in value.split(',').enumerate() {
        if entry.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = entry.split_once('=') else {
            return Err(ExportError::config(
                name,
                format!("entry {} is not `key=value`", i + 1),
            ));
        };
        let key = spanprof_core::percent_decode(k.trim())
            .ok_or_else(|| ExportError::config(name, format!("entry {} has a bad key", i + 1)))?;
        let value = spanprof_core::percent_decode(v.trim()).ok_or_else(|| {
            ExportError::config(
                name,
                format!("the value of `{key}` is not valid percent-encoded UTF-8"),
            )
        })?;
        check_header(name, &key, &value)?;
        out.push((key, value));
    }
    Ok(out)
}

/// Checks that `key: value` can be sent as an HTTP header and as gRPC metadata.
pub(crate) fn check_header(field: &str, key: &str, value: &str) -> Result<(), ExportError> {
    if http::HeaderName::from_bytes(key.as_bytes()).is_err()
        || tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(
            key.to_ascii_lowercase().as_bytes(),
        )
        .is_err()
    {
        return Err(ExportError::config(
            field,
            format!("`{key}` is not a valid header name"),
        ));
    }
    if http::HeaderValue::from_str(value).is_err() {
        return Err(ExportError::config(
            field,
            format!("the value of `{key}` is not a valid header value"),
        ));
    }
    Ok(())
}

impl OtlpProfilesConfig {
    /// A configuration posting to `endpoint` over `protocol`, with the defaults.
    pub fn new(endpoint: impl Into<String>, protocol: OtlpProtocol) -> Self {
        OtlpProfilesConfig {
            endpoint: endpoint.into(),
            protocol,
            headers: Vec::new(),
            service_name: crate::default_service_name(|k| std::env::var(k).ok()),
            interval: DEFAULT_INTERVAL,
            delivery: DeliveryConfig::default(),
            ca_certificates_pem: None,
        }
    }

    /// From the OpenTelemetry exporter variables, as for traces, each
    /// `OTEL_EXPORTER_OTLP_PROFILES_*` variable taking precedence over its
    /// `OTEL_EXPORTER_OTLP_*` counterpart:
    ///
    /// - `…_ENDPOINT`: the profiles one is used as is; the general one is a base to
    ///   which HTTP appends `/v1development/profiles`. `Ok(None)` when neither is set.
    /// - `…_PROTOCOL`: `http/protobuf` (the default) or `grpc`; anything else is an
    ///   error naming the variable.
    /// - `…_HEADERS`: `key=value,key2=value2` (percent-encoded), sent with every
    ///   export (gRPC: as metadata); both variables apply, the profiles one winning
    ///   for a key set in both.
    /// - `…_TIMEOUT`: milliseconds per export (default 10 000).
    /// - `…_CERTIFICATE`: a PEM file of CA certificates to trust for `https://`.
    ///
    /// And `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` for `service_name`, when
    /// no tracer provider names the service.
    pub fn from_env() -> Result<Option<Self>, ExportError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`OtlpProfilesConfig::from_env`], reading variables through `var`.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, ExportError> {
        let Some(target) = OtlpTarget::from_lookup(&var, Signal::Profiles, HTTP_PATH)? else {
            return Ok(None);
        };
        let mut cfg = OtlpProfilesConfig::new(target.endpoint, target.protocol);
        cfg.service_name = crate::default_service_name(&var);
        cfg.headers = target.headers;
        if let Some(t) = target.request_timeout {
            cfg.delivery.request_timeout = t;
        }
        cfg.ca_certificates_pem = target.ca_certificates_pem;
        Ok(Some(cfg))
    }

    fn validate(&self) -> Result<(), ExportError> {
        crate::http::validate_url("endpoint", &self.endpoint)?;
        for (k, v) in &self.headers {
            check_header("headers", k, v)?;
        }
        if self.interval < Duration::from_millis(100) {
            return Err(ExportError::config("interval", "must be at least 100ms"));
        }
        self.delivery.validate()
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
pub(crate) fn export_request(
    profile: &Profile,
    service_name: &str,
) -> ExportProfilesServiceRequest {
    let mut dict = Dictionary::new();
    let cpu = dict.string("cpu");
    let nanoseconds = dict.string("nanoseconds");
    let samples = profile.samples.iter().map(|s| dict.sample(s)).collect();
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
        dictionary: Some(dict.finish()),
    }
}

/// The profile's shared dictionary as it is built: each table interns its entries
/// (index 0 is the zero value, as OTLP requires).
struct Dictionary {
    strings: Table<String, String>,
    functions: Table<(i32, i32), pb::Function>,
    locations: Table<Vec<(u64, i32, i64)>, pb::Location>,
    stacks: Table<Vec<i32>, pb::Stack>,
    links: Table<(u128, u64), pb::Link>,
    attributes: Table<(i32, String), pb::KeyValueAndUnit>,
}

impl Dictionary {
    fn new() -> Self {
        Dictionary {
            strings: Table::new(),
            functions: Table::new(),
            locations: Table::new(),
            stacks: Table::new(),
            links: Table::new(),
            attributes: Table::new(),
        }
    }

    fn string(&mut self, v: &str) -> i32 {
        self.strings.get(v.to_owned(), || v.to_owned())
    }

    /// One sample: its stack of locations, its link to the span, its attributes.
    fn sample(&mut self, sample: &ProfileSample) -> pb::Sample {
        let location_indices: Vec<i32> = physical_frames(&sample.stack)
            .map(|frames| self.location(frames))
            .collect();
        let stack_index = self
            .stacks
            .get(location_indices.clone(), || pb::Stack { location_indices });
        let (link_index, attribute_indices) = match &sample.labels {
            Some(l) if l.span_id != 0 => (self.link(l), self.span_attributes(l)),
            _ => (0, vec![]),
        };
        pb::Sample {
            stack_index,
            attribute_indices,
            link_index,
            values: vec![i64::try_from(sample.cpu_ns).unwrap_or(i64::MAX)],
            timestamps_unix_nano: vec![],
        }
    }

    /// One location per physical frame: the frames inlined at one address share it.
    fn location(&mut self, frames: &[Frame]) -> i32 {
        let address = frames[0].address;
        let mut key = Vec::with_capacity(frames.len());
        let mut lines = Vec::with_capacity(frames.len());
        for f in frames {
            let name = self.string(&f.function);
            let file = f.file.as_deref().map_or(0, |file| self.string(file));
            let function_index = self.functions.get((name, file), || pb::Function {
                name_strindex: name,
                // Empty, as in pprof: a reader that finds it equal to the name may
                // take the name for a mangled one and shorten it.
                system_name_strindex: 0,
                filename_strindex: file,
                start_line: 0,
            });
            key.push((address, function_index, i64::from(f.line)));
            lines.push(pb::Line {
                function_index,
                line: i64::from(f.line),
                column: 0,
            });
        }
        self.locations.get(key, || pb::Location {
            mapping_index: 0,
            address,
            lines,
            attribute_indices: vec![],
        })
    }

    /// The link from a sample to its span.
    fn link(&mut self, l: &SampleLabels) -> i32 {
        self.links.get((l.trace_id, l.span_id), || pb::Link {
            trace_id: l.trace_id.to_be_bytes().to_vec(),
            span_id: l.span_id.to_be_bytes().to_vec(),
        })
    }

    /// The span name and route as sample attributes (when not empty).
    fn span_attributes(&mut self, l: &SampleLabels) -> Vec<i32> {
        let mut out = Vec::with_capacity(2);
        for (k, v) in [("span_name", &*l.span_name), ("route", &*l.route)] {
            if v.is_empty() {
                continue;
            }
            let key = self.string(k);
            out.push(
                self.attributes
                    .get((key, v.to_owned()), || pb::KeyValueAndUnit {
                        key_strindex: key,
                        value: Some(AnyValue {
                            value: Some(any_value::Value::StringValue(v.to_owned())),
                        }),
                        unit_strindex: 0,
                    }),
            );
        }
        out
    }

    fn finish(self) -> pb::ProfilesDictionary {
        pb::ProfilesDictionary {
            mapping_table: vec![pb::Mapping::default()],
            location_table: self.locations.values,
            function_table: self.functions.values,
            link_table: self.links.values,
            string_table: self.strings.values,
            attribute_table: self.attributes.values,
            stack_table: self.stacks.values,
        }
    }
}

struct HttpTransport {
    client: crate::http::HttpClient,
    url: String,
    /// The configured headers and the content type.
    headers: http::HeaderMap,
}

impl Transport for HttpTransport {
    fn send<'a>(&'a self, payload: &'a [u8]) -> SendFuture<'a> {
        Box::pin(self.client.post(&self.url, &self.headers, payload))
    }
}

struct GrpcTransport {
    endpoint: tonic::transport::Endpoint,
    /// One channel for the exporter's life, made on the first send (inside the
    /// delivery runtime); it reconnects by itself after failures.
    channel: std::sync::OnceLock<tonic::transport::Channel>,
    metadata: tonic::metadata::MetadataMap,
    /// The method called (`/package.Service/Export`).
    path: &'static str,
}

impl Transport for GrpcTransport {
    fn send<'a>(&'a self, payload: &'a [u8]) -> SendFuture<'a> {
        Box::pin(async move {
            let channel = self
                .channel
                .get_or_init(|| self.endpoint.connect_lazy())
                .clone();
            let mut request = tonic::Request::new(payload.to_vec());
            *request.metadata_mut() = self.metadata.clone();
            match export_raw(channel, request, self.path).await {
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
                        | Code::Unknown => Err(SendError::Retryable(describe_status(&status))),
                        code => Err(SendError::Rejected {
                            status: RejectStatus::Grpc(code as i32),
                            message: status.message().to_owned(),
                        }),
                    }
                }
            }
        })
    }
}

/// A failed call in plain words: what happened to the connection when that can be
/// told (`connection refused`, `connection closed by the server`), then the gRPC code
/// and message (tonic's own text is `code: 'The service is currently unavailable',
/// message: "tcp connect error", source: …`, and a reset reads as `Unknown` with a
/// broken pipe).
fn describe_status(status: &tonic::Status) -> String {
    let code = format!("{:?}", status.code());
    let message = status.message();
    let detail = if message.is_empty() {
        format!("gRPC {code}")
    } else {
        format!("gRPC {code}: {message}")
    };
    match crate::http::plain_cause(status) {
        Some(plain) => format!("{plain} ({detail})"),
        None => detail,
    }
}

/// The gRPC method the official client calls (`ProfilesServiceClient::export`).
const EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// One `Export` call with the payload as the delivery queue holds it: an encoded
/// export request (`ExportProfilesServiceRequest`, `ExportTraceServiceRequest`), sent as it is rather than decoded into a message
/// for the generated client to encode again. Errors map as the generated client's do
/// (a channel that is not ready is `Unknown`).
async fn export_raw(
    channel: tonic::transport::Channel,
    request: tonic::Request<Vec<u8>>,
    path: &'static str,
) -> Result<(), tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.unary::<_, (), _>(request, path, RawCodec)
        .await
        .map(drop)
}

/// A codec that sends already-encoded protobuf bytes and ignores the answer's body
/// (`ExportProfilesServiceResponse`: a partial-success count, not acted on).
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = ();
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = ();
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<()>, tonic::Status> {
        use bytes::Buf;
        src.advance(src.remaining());
        Ok(Some(()))
    }
}

/// The headers as HTTP headers (checked by `validate`).
fn http_headers(headers: &[(String, String)]) -> http::HeaderMap {
    headers
        .iter()
        .filter_map(|(k, v)| {
            Some((
                http::HeaderName::from_bytes(k.as_bytes()).ok()?,
                http::HeaderValue::from_str(v).ok()?,
            ))
        })
        .collect()
}

/// The headers as gRPC metadata (checked by `validate`).
fn grpc_metadata(headers: &[(String, String)]) -> tonic::metadata::MetadataMap {
    let mut map = tonic::metadata::MetadataMap::new();
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
            v.parse::<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>(),
        ) {
            map.insert(k, v);
        }
    }
    map
}

/// The delivery of one OTLP signal: over HTTP, or over gRPC calling `grpc_path`.
/// `name` is the sink's name and the word for its payloads' items.
pub(crate) fn start_delivery(
    name: (&'static str, &'static str),
    endpoint_url: &str,
    protocol: OtlpProtocol,
    headers: &[(String, String)],
    delivery: &DeliveryConfig,
    ca_certificates_pem: Option<&[u8]>,
    grpc_path: &'static str,
) -> Result<Delivery, ExportError> {
    Ok(match protocol {
        OtlpProtocol::HttpProtobuf => Delivery::start_for(
            name.0,
            name.1,
            delivery.clone(),
            HttpTransport {
                client: crate::http::HttpClient::new(
                    "endpoint",
                    endpoint_url,
                    "ca_certificates_pem",
                    ca_certificates_pem,
                )?,
                url: endpoint_url.to_owned(),
                headers: {
                    let mut h = http_headers(headers);
                    h.insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/x-protobuf"),
                    );
                    h
                },
            },
        ),
        OtlpProtocol::Grpc => {
            let endpoint = tonic::transport::Endpoint::from_shared(endpoint_url.to_owned())
                .map_err(|e| ExportError::config("endpoint", e.to_string()))?
                .timeout(delivery.request_timeout)
                .connect_timeout(Duration::from_secs(5));
            #[cfg(not(feature = "tls"))]
            if endpoint_url.starts_with("https://") || ca_certificates_pem.is_some() {
                return Err(ExportError::config(
                    if ca_certificates_pem.is_some() {
                        "ca_certificates_pem"
                    } else {
                        "endpoint"
                    },
                    "https:// and CA certificates need TLS: enable the `tls` feature of spanprof (or spanprof-export)",
                ));
            }
            #[cfg(feature = "tls")]
            let mut endpoint = endpoint;
            #[cfg(feature = "tls")]
            if endpoint_url.starts_with("https://") {
                let mut tls = tonic::transport::ClientTlsConfig::new().with_webpki_roots();
                if let Some(pem) = ca_certificates_pem {
                    crate::http::parse_ca_certificates("ca_certificates_pem", pem)?;
                    tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
                }
                let field = if ca_certificates_pem.is_some() {
                    "ca_certificates_pem"
                } else {
                    "endpoint"
                };
                endpoint = endpoint
                    .tls_config(tls)
                    .map_err(|e| ExportError::config(field, e.to_string()))?;
            }
            Delivery::start_for(
                name.0,
                name.1,
                delivery.clone(),
                GrpcTransport {
                    endpoint,
                    channel: std::sync::OnceLock::new(),
                    metadata: grpc_metadata(headers),
                    path: grpc_path,
                },
            )
        }
    })
}

/// Exports a labelled CPU profile as OTLP profiles every interval. Experimental.
/// Dropping it stops it at once (logged); [`OtlpProfilesExporter::shutdown`] sends
/// the last interval first.
#[derive(Debug)]
#[must_use = "the exporter stops when dropped: keep it (or the Sinks holding it) alive as long as the service runs"]
pub struct OtlpProfilesExporter {
    exporter: Exporter,
}

impl OtlpProfilesExporter {
    /// Starts exporting the profiles of `source`.
    pub fn start(cfg: OtlpProfilesConfig, source: ProfileSource) -> Result<Self, ExportError> {
        cfg.validate()?;
        let delivery = start_delivery(
            ("otlp-profiles", "profiles"),
            &cfg.endpoint,
            cfg.protocol,
            &cfg.headers,
            &cfg.delivery,
            cfg.ca_certificates_pem.as_deref(),
            EXPORT_PATH,
        )?;
        tracing::info!(
            "spanprof: sending profiles: {cfg}, every {:?}",
            cfg.interval
        );
        let service =
            crate::SinkServiceName::new("otlp-profiles", "service.name", &cfg.service_name);
        let exporter = Exporter::start("otlp-profiles", cfg.interval, source, delivery, move |p| {
            (!p.samples.is_empty()).then(|| export_request(p, &service.current()).encode_to_vec())
        });
        Ok(OtlpProfilesExporter { exporter })
    }

    /// Delivery counters.
    pub fn stats(&self) -> DeliveryStats {
        self.exporter.stats()
    }

    /// Exports what was collected since the last export, then flushes the queue
    /// until it is empty or `deadline` has passed (an export still under way then is
    /// cut; what is left is counted in `dropped_shutdown`), and stops. Returns within
    /// `deadline`. To stop several sinks with one deadline, use [`crate::Sinks`].
    pub fn shutdown(self, deadline: Duration) -> DeliveryStats {
        self.exporter.shutdown(deadline)
    }

    pub(crate) fn into_exporter(self) -> Exporter {
        self.exporter
    }
}
