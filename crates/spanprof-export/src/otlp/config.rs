//! The profiles sink's settings, and the OTLP endpoint, protocol and headers as the
//! OpenTelemetry environment variables give them (shared with the span exporter).

use std::time::Duration;

use crate::ExportError;
use crate::delivery::DeliveryConfig;

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

    pub(super) fn validate(&self) -> Result<(), ExportError> {
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
