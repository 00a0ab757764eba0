//! The OpenTelemetry `service.name` of this process, as its traces carry it: the
//! tracer provider's `Resource` (recorded by spanprof's span processor as the
//! provider is built), else `OTEL_SERVICE_NAME`, else `service.name` in
//! `OTEL_RESOURCE_ATTRIBUTES`. The sinks file profiles under it, so that Grafana's
//! traces-to-profiles finds them under the traces' name.

use std::sync::{Arc, RwLock};

static RESOURCE_SERVICE_NAME: RwLock<Option<Arc<str>>> = RwLock::new(None);

/// Records the `service.name` of the tracer provider's `Resource`. Called by
/// `spanprof::SpanProfileProcessor` when the provider is built (the SDK hands every
/// span processor the Resource then); the last provider built wins.
pub fn set_resource_service_name(name: &str) {
    *RESOURCE_SERVICE_NAME
        .write()
        .unwrap_or_else(|e| e.into_inner()) = Some(Arc::from(name));
}

/// The `service.name` of the tracer provider's `Resource`, once a provider with
/// spanprof's span processor was built.
pub fn resource_service_name() -> Option<Arc<str>> {
    RESOURCE_SERVICE_NAME
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// The service name the environment gives, read through `var` as the OpenTelemetry
/// SDKs read it: `OTEL_SERVICE_NAME`, else `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES` (`key=value` pairs separated by commas, values
/// percent-encoded).
///
/// ```
/// let env = |k: &str| (k == "OTEL_RESOURCE_ATTRIBUTES")
///     .then(|| "deployment.environment=prod,service.name=cart%20api".to_owned());
/// assert_eq!(spanprof_core::env_service_name(env).as_deref(), Some("cart api"));
/// ```
pub fn env_service_name(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(name) = var("OTEL_SERVICE_NAME").filter(|s| !s.trim().is_empty()) {
        return Some(name.trim().to_owned());
    }
    let attributes = var("OTEL_RESOURCE_ATTRIBUTES")?;
    attributes.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == "service.name")
            .then(|| percent_decode(v.trim()))
            .flatten()
            .filter(|v| !v.is_empty())
    })
}

/// `s` with its `%XX` escapes decoded, as the `OTEL_*` variables' values and header
/// lists are written; `None` when an escape is malformed or the result is not UTF-8.
///
/// ```
/// assert_eq!(spanprof_core::percent_decode("cart%20api").as_deref(), Some("cart api"));
/// assert_eq!(spanprof_core::percent_decode("bad%2"), None);
/// ```
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::env_service_name;

    #[test]
    fn otel_service_name_wins_over_resource_attributes() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(env_service_name(env(&[])), None);
        assert_eq!(
            env_service_name(env(&[(
                "OTEL_RESOURCE_ATTRIBUTES",
                "a=b, service.name = x "
            )])),
            Some("x".into())
        );
        assert_eq!(
            env_service_name(env(&[
                ("OTEL_RESOURCE_ATTRIBUTES", "service.name=x"),
                ("OTEL_SERVICE_NAME", "y"),
            ])),
            Some("y".into())
        );
        assert_eq!(
            env_service_name(env(&[("OTEL_RESOURCE_ATTRIBUTES", "service.name=%zz")])),
            None
        );
    }
}
