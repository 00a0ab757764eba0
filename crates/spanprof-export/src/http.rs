//! What the HTTP sinks share: the user agent, URL checks and redaction, the HTTP
//! client (hyper's, with rustls and custom CA certificates under the `tls` feature),
//! and how a response maps to the retry policy.

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
use crate::{ExportError, RejectStatus, SendError};

/// `User-Agent` of every request spanprof sends.
pub(crate) const USER_AGENT: &str = concat!("spanprof/", env!("CARGO_PKG_VERSION"));

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
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

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
/// What `Debug` shows of PEM bytes: their size only.
pub(crate) fn pem_summary(pem: &Option<Vec<u8>>) -> Option<String> {
    pem.as_ref().map(|p| format!("<{} bytes>", p.len()))
}

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
/// `base` with `path` appended to its path, before any query string.
pub(crate) fn join_path(base: &str, path: &str) -> String {
    match base.split_once('?') {
        Some((b, query)) => format!("{}{path}?{query}", b.trim_end_matches('/')),
        None => format!("{}{path}", base.trim_end_matches('/')),
    }
}

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
/// What happened to the connection, in plain words, if an error or one of its causes
/// is an I/O error that says (`connection refused`, `connection reset by the
/// server`, …).
pub(crate) fn plain_cause(e: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    use std::io::ErrorKind;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        let plain = c.downcast_ref::<std::io::Error>().and_then(|io| {
            Some(match io.kind() {
                ErrorKind::ConnectionRefused => "connection refused",
                ErrorKind::ConnectionReset => "connection reset by the server",
                ErrorKind::ConnectionAborted => "connection aborted",
                ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof => {
                    "connection closed by the server"
                }
                ErrorKind::TimedOut => "timed out",
                ErrorKind::NotConnected => "not connected",
                ErrorKind::AddrNotAvailable => "address not available",
                ErrorKind::HostUnreachable => "host unreachable",
                ErrorKind::NetworkUnreachable => "network unreachable",
                _ => return None,
            })
        });
        if plain.is_some() {
            return plain;
        }
        // hyper's own: the connection went away before the answer (no I/O error
        // under it when the peer closed cleanly).
        if let Some(h) = c.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_canceled() || h.is_closed())
        {
            return Some("connection closed by the server");
        }
        cause = c.source();
    }
    None
}

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
/// An error and its causes, one after another (`a: b: c`), led by what happened in
/// plain words when that can be told (`connection refused (…)`).
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    match plain_cause(e) {
        Some(plain) => format!("{plain} ({})", error_chain(e)),
        None => error_chain(e),
    }
}

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
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

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
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

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
type Connector = hyper_util::client::legacy::connect::HttpConnector;

#[cfg(all(any(feature = "pyroscope", feature = "otlp"), feature = "tls"))]
type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<Connector>,
    http_body_util::Full<bytes::Bytes>,
>;
#[cfg(all(any(feature = "pyroscope", feature = "otlp"), not(feature = "tls")))]
type Client = hyper_util::client::legacy::Client<Connector, http_body_util::Full<bytes::Bytes>>;

/// The HTTP client of the HTTP sinks (hyper's): HTTP/1.1, and with the `tls` feature
/// `https://` through rustls with the **ring** provider (the one TLS stack of the
/// workspace, chosen here, never a process-wide default), trusting the public
/// (webpki) roots plus the certificates of `ca_pem` (checked by
/// [`parse_ca_certificates`]). No proxy: a proxy variable in the environment is
/// reported once, not used.
#[cfg(any(feature = "pyroscope", feature = "otlp"))]
#[derive(Clone)]
pub(crate) struct HttpClient {
    client: Client,
}

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
impl HttpClient {
    /// A client for `url` (checked by [`validate_url`]); errors name `field` (the
    /// CA certificates') or `url_field` (an `https://` URL without the `tls` feature).
    pub(crate) fn new(
        url_field: &str,
        url: &str,
        field: &str,
        ca_pem: Option<&[u8]>,
    ) -> Result<HttpClient, ExportError> {
        report_proxy_variables(url);
        let mut http = Connector::new();
        http.enforce_http(false);
        let builder =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
        #[cfg(feature = "tls")]
        let client = {
            let config = tls_config(field, ca_pem)?;
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(config)
                .https_or_http()
                .enable_http1()
                .wrap_connector(http);
            builder.build(https)
        };
        #[cfg(not(feature = "tls"))]
        let client = {
            if url.starts_with("https://") {
                return Err(ExportError::config(
                    url_field,
                    "an https:// endpoint needs TLS: enable the `tls` feature of spanprof (or spanprof-export)",
                ));
            }
            if ca_pem.is_some() {
                return Err(ExportError::config(
                    field,
                    "CA certificates need TLS: enable the `tls` feature of spanprof (or spanprof-export)",
                ));
            }
            builder.build(http)
        };
        let _ = (url_field, field);
        Ok(HttpClient { client })
    }

    /// POSTs `body` to `url` with `headers` (credentials in the URL go into an
    /// `Authorization: Basic` header, never on the wire in the URL) and maps the
    /// answer to the retry policy.
    pub(crate) async fn post(
        &self,
        url: &str,
        headers: &http::HeaderMap,
        body: &[u8],
    ) -> Result<(), SendError> {
        let (uri, basic) =
            split_credentials(url).map_err(|e| SendError::Retryable(format!("bad URL: {e}")))?;
        let mut req = http::Request::post(uri)
            .header(http::header::USER_AGENT, USER_AGENT)
            .body(http_body_util::Full::new(bytes::Bytes::copy_from_slice(
                body,
            )))
            .map_err(|e| SendError::Retryable(format!("bad request: {e}")))?;
        if let Some(basic) = basic {
            req.headers_mut().insert(http::header::AUTHORIZATION, basic);
        }
        for (k, v) in headers {
            req.headers_mut().insert(k.clone(), v.clone());
        }
        match self.client.request(req).await {
            Err(e) => Err(SendError::Retryable(describe(&e))),
            Ok(resp) => {
                let status = resp.status();
                if status.is_success() {
                    return Ok(());
                }
                use http_body_util::BodyExt;
                let body = http_body_util::Limited::new(resp.into_body(), 64 * 1024)
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                classify(status, String::from_utf8_lossy(&body).into_owned())
            }
        }
    }
}

/// `Authorization: Basic` for `user` and `password`.
#[cfg(any(feature = "pyroscope", feature = "otlp"))]
pub(crate) fn basic_auth(user: &str, password: &str) -> http::HeaderValue {
    let mut v = http::HeaderValue::from_str(&format!(
        "Basic {}",
        base64(format!("{user}:{password}").as_bytes())
    ))
    .expect("base64 is a valid header value");
    v.set_sensitive(true);
    v
}

/// Standard base64 with padding.
#[cfg(any(feature = "pyroscope", feature = "otlp"))]
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `url` without its `user:password@`, and those as an `Authorization: Basic` value.
#[cfg(any(feature = "pyroscope", feature = "otlp"))]
fn split_credentials(url: &str) -> Result<(http::Uri, Option<http::HeaderValue>), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("no scheme".into());
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let tail = tail.split('#').next().unwrap_or_default();
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.parse().map(|u| (u, None)).map_err(|e| redacted(&e));
    };
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let decode =
        |s: &str| spanprof_core::percent_decode(s).ok_or_else(|| "bad credentials".to_owned());
    let basic = basic_auth(&decode(user)?, &decode(password)?);
    let uri = format!("{scheme}://{host}{tail}")
        .parse()
        .map_err(|e| redacted(&e))?;
    Ok((uri, Some(basic)))
}

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
fn redacted(e: &http::uri::InvalidUri) -> String {
    // The URI's error never quotes the URI.
    e.to_string()
}

/// The sinks connect directly: a proxy variable that would apply to `url` is
/// reported once, so that a service behind a proxy sees why its sinks fail.
#[cfg(any(feature = "pyroscope", feature = "otlp"))]
fn report_proxy_variables(url: &str) {
    static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let names: &[&str] = if url.starts_with("https://") {
        &["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]
    } else {
        &["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
    };
    if let Some(name) = names
        .iter()
        .find(|n| std::env::var_os(n).is_some_and(|v| !v.is_empty()))
        && !REPORTED.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        tracing::warn!(
            "spanprof: {name} is set, but spanprof's sinks do not go through proxies: they connect to {} \
             directly (route it around the proxy, e.g. NO_PROXY, or reach the server some other way)",
            redact_url(url)
        );
    }
}

#[cfg(all(any(feature = "pyroscope", feature = "otlp"), feature = "tls"))]
/// rustls with ring, the public roots and the certificates of `ca_pem`.
fn tls_config(field: &str, ca_pem: Option<&[u8]>) -> Result<rustls::ClientConfig, ExportError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = ca_pem {
        for cert in parse_ca_certificates(field, pem)? {
            roots
                .add(cert)
                .map_err(|e| ExportError::config(field, format!("not a valid certificate: {e}")))?;
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ExportError::config("tls", e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(all(any(feature = "pyroscope", feature = "otlp"), feature = "tls"))]
/// The certificates of a PEM bundle; an error naming `field` when it holds none or
/// one that does not parse as a certificate.
pub(crate) fn parse_ca_certificates(
    field: &str,
    pem: &[u8],
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, ExportError> {
    use rustls::pki_types::pem::PemObject;
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ExportError::config(field, format!("not a PEM certificate bundle: {e}")))?;
    if certs.is_empty() {
        return Err(ExportError::config(
            field,
            "holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
        ));
    }
    // The PEM armour can be right around bytes that are no certificate: a trust store
    // built with them says so here, naming the field, not at the first send.
    let mut roots = rustls::RootCertStore::empty();
    for c in &certs {
        roots
            .add(c.clone())
            .map_err(|e| ExportError::config(field, format!("not a valid certificate: {e}")))?;
    }
    Ok(certs)
}

#[cfg(all(any(feature = "pyroscope", feature = "otlp"), not(feature = "tls")))]
/// Without TLS a CA bundle is only checked for its PEM armour (it cannot be used).
pub(crate) fn parse_ca_certificates(field: &str, pem: &[u8]) -> Result<Vec<()>, ExportError> {
    let text = String::from_utf8_lossy(pem);
    let n = text.matches("-----BEGIN CERTIFICATE-----").count();
    if n == 0 {
        return Err(ExportError::config(
            field,
            "holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
        ));
    }
    Ok(vec![(); n])
}

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
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

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
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

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
/// Most bytes of a server's error message kept.
const MAX_MESSAGE: usize = 512;

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
/// Maps an answer that is not a success to the retry policy: 5xx, 408 and 429 are
/// worth retrying, any other status is a refusal.
pub(crate) fn classify(status: http::StatusCode, mut message: String) -> Result<(), SendError> {
    if status.is_success() {
        return Ok(());
    }
    truncate_utf8(&mut message, MAX_MESSAGE);
    if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 {
        Err(SendError::Retryable(format!("{status}: {message}")))
    } else {
        Err(SendError::Rejected {
            status: RejectStatus::Http(status.as_u16()),
            message,
        })
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

    #[cfg(any(feature = "pyroscope", feature = "otlp"))]
    #[test]
    fn paths_go_before_the_query_string() {
        assert_eq!(join_path("http://h/", "/v"), "http://h/v");
        assert_eq!(join_path("http://h/?t=1", "/v"), "http://h/v?t=1");
    }

    #[cfg(any(feature = "pyroscope", feature = "otlp"))]
    #[test]
    fn truncation_ends_on_a_character_boundary() {
        let mut s = format!("x{}", "é".repeat(400));
        truncate_utf8(&mut s, 512);
        assert_eq!(s.len(), 511);
        let mut s = "short".to_owned();
        truncate_utf8(&mut s, 512);
        assert_eq!(s, "short");
    }

    #[cfg(any(feature = "pyroscope", feature = "otlp"))]
    #[test]
    fn refusals_carry_the_http_status_and_retryable_codes_do_not_refuse() {
        let answer = |status: u16| {
            classify(
                http::StatusCode::from_u16(status).expect("a status"),
                "no such tenant".to_owned(),
            )
        };
        assert_eq!(
            answer(404),
            Err(SendError::Rejected {
                status: RejectStatus::Http(404),
                message: "no such tenant".to_owned(),
            })
        );
        for retryable in [408, 429, 500, 503] {
            assert!(
                matches!(answer(retryable), Err(SendError::Retryable(_))),
                "{retryable}"
            );
        }
        assert_eq!(answer(200), Ok(()));
        assert_eq!(RejectStatus::Http(404).to_string(), "HTTP 404");
        assert_eq!(RejectStatus::Grpc(3).to_string(), "gRPC code 3");
    }

    #[cfg(any(feature = "pyroscope", feature = "otlp"))]
    #[test]
    fn credentials_leave_the_url_for_a_basic_auth_header() {
        assert_eq!(
            base64(b"Aladdin:open sesame"),
            "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(base64(b"a"), "YQ==");
        let (uri, basic) = split_credentials("https://u%40x:p%3Aw@h:4040/p?q=1#f").unwrap();
        assert_eq!(uri.to_string(), "https://h:4040/p?q=1");
        assert_eq!(basic.unwrap(), basic_auth("u@x", "p:w"));
        let (uri, basic) = split_credentials("http://h/a@b").unwrap();
        assert_eq!((uri.to_string(), basic), ("http://h/a@b".to_owned(), None));
    }
}
