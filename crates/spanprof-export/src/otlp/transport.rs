//! Sending an encoded OTLP export request over HTTP or gRPC, and the delivery that
//! retries it: shared by the profiles sink and the span exporter.

use std::time::Duration;

use crate::ExportError;
use crate::delivery::{Delivery, DeliveryConfig, RejectStatus, SendError, SendFuture, Transport};

use super::OtlpProtocol;

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
pub(super) const EXPORT_PATH: &str =
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
