//! What the HTTP sinks share: the user agent, URL checks and redaction, the HTTP
//! client with custom CA certificates, and how a response maps to the retry policy.

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
use crate::{ExportError, RejectStatus, SendError};

/// `User-Agent` of every request spanprof sends.
pub const USER_AGENT: &str = concat!("spanprof/", env!("CARGO_PKG_VERSION"));

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

#[cfg(any(feature = "pyroscope", feature = "otlp"))]
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
                    status: RejectStatus::Http(status.as_u16()),
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
            let response = http::Response::builder()
                .status(status)
                .body("no such tenant")
                .expect("a response");
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            rt.block_on(classify(Ok(reqwest::Response::from(response))))
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
}
