//! OpenTelemetry's process context (OTEP 4719) and thread context (OTEP 4947), for
//! profilers outside the process (feature `otel-thread-ctx`).
//!
//! - The **thread context** is the label slot itself (`sys::thread_ctx`): every push
//!   publishes the record of the span being polled, which begins with its OTEP
//!   record (`crate::sys::record::ThreadCtxRecord`).
//! - The **process context** (`sys::process_ctx`) carries the tracer provider's
//!   `Resource` and the thread context's reference data: `threadlocal.schema_version`
//!   and `threadlocal.attribute_key_map` ([`ATTRIBUTE_KEYS`]). It is published when
//!   the profiler starts (sampling or labels only) and updated when the Resource is
//!   set ([`set_process_context_resource`]).

use std::sync::Mutex;

use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// `threadlocal.schema_version`: the thread context's layout, as OTEP 4947 names it.
pub const SCHEMA_VERSION: &str = "tlsdesc_v1_dev";

/// `threadlocal.attribute_key_map`: the attribute keys of the thread context
/// records, by key index. Append-only: indexes never change.
pub const ATTRIBUTE_KEYS: [&str; 2] = ["http.route", "span.name"];

/// Key index of the route (the layer's route template, `/cart/{id}`).
pub(crate) const KEY_ROUTE: u8 = 0;
/// Key index of the span name (`GET /cart/{id}`, or an inner span's name).
pub(crate) const KEY_SPAN_NAME: u8 = 1;

/// The payload of the process context (OTEP 4719's
/// `opentelemetry.proto.processcontext.v1development.ProcessContext`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessContext {
    /// The resource attributes describing this process.
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    /// Attributes for outside readers that are not part of the Resource: here the
    /// thread context's reference data.
    #[prost(message, repeated, tag = "2")]
    pub attributes: Vec<KeyValue>,
}

struct State {
    /// The Resource's attributes (until a provider sets them: `service.name` from
    /// the environment, if any).
    resource: Option<Vec<KeyValue>>,
    /// Whether the profiler has started (the context is published from then on).
    started: bool,
    #[cfg(spanprof_otel_ctx)]
    mapping: Option<crate::sys::process_ctx::ProcessCtxMapping>,
}

static STATE: Mutex<State> = Mutex::new(State {
    resource: None,
    started: false,
    #[cfg(spanprof_otel_ctx)]
    mapping: None,
});

/// Publishes the tracer provider's `Resource` attributes in the process context
/// (now if the profiler runs, else when it starts). `SpanProfileProcessor` calls it
/// when the provider is built; the last call wins.
pub fn set_process_context_resource(attributes: impl IntoIterator<Item = opentelemetry::KeyValue>) {
    let attributes = attributes
        .into_iter()
        .map(|kv| KeyValue {
            key: kv.key.to_string(),
            value: Some(AnyValue::from(kv.value)),
            key_strindex: 0,
        })
        .collect();
    let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    state.resource = Some(attributes);
    if state.started {
        publish(&mut state);
    }
}

/// At profiler start (both modes): checks that the thread context can be found and
/// publishes the process context.
pub(crate) fn on_start() {
    #[cfg(spanprof_otel_ctx)]
    if !crate::sys::thread_ctx::symbol_exported() {
        crate::setup::thread_ctx_not_exported();
    }
    #[cfg(not(spanprof_otel_ctx))]
    crate::setup::thread_ctx_unsupported();
    let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    state.started = true;
    publish(&mut state);
}

/// The encoded process context for the current state.
fn payload(state: &State) -> Vec<u8> {
    let resource = state.resource.clone().unwrap_or_else(|| {
        crate::env_service_name(|k| std::env::var(k).ok())
            .map(|name| vec![string("service.name", name)])
            .unwrap_or_default()
    });
    let keys = ATTRIBUTE_KEYS
        .iter()
        .map(|k| AnyValue {
            value: Some(any_value::Value::StringValue((*k).to_owned())),
        })
        .collect();
    let context = ProcessContext {
        resource: Some(Resource {
            attributes: resource,
            dropped_attributes_count: 0,
            entity_refs: Vec::new(),
        }),
        attributes: vec![
            string("threadlocal.schema_version", SCHEMA_VERSION.to_owned()),
            KeyValue {
                key: "threadlocal.attribute_key_map".to_owned(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::ArrayValue(ArrayValue { values: keys })),
                }),
                key_strindex: 0,
            },
        ],
    };
    prost::Message::encode_to_vec(&context)
}

fn string(key: &str, value: String) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value)),
        }),
        key_strindex: 0,
    }
}

#[cfg(spanprof_otel_ctx)]
fn publish(state: &mut State) {
    use crate::sys::process_ctx::{Backing, ProcessCtxMapping};
    let payload = payload(state);
    if let Some(m) = &mut state.mapping {
        m.update(payload);
        return;
    }
    match ProcessCtxMapping::publish(payload) {
        Ok(m) => {
            tracing::debug!(
                address = format_args!("{:#x}", m.address()),
                memfd = m.backing() == Backing::Memfd,
                "spanprof: OpenTelemetry process context published"
            );
            state.mapping = Some(m);
        }
        Err(e) => tracing::warn!(
            error = %e,
            "spanprof: could not publish the OpenTelemetry process context (OTEL_CTX), so profilers outside the process \
             cannot read this service's Resource or the thread context's key map"
        ),
    }
}

#[cfg(not(spanprof_otel_ctx))]
fn publish(state: &mut State) {
    let _ = payload(state);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_carries_the_resource_and_the_key_map() {
        let state = State {
            resource: Some(vec![string("service.name", "shop".to_owned())]),
            started: true,
            #[cfg(spanprof_otel_ctx)]
            mapping: None,
        };
        let decoded: ProcessContext =
            prost::Message::decode(payload(&state).as_slice()).expect("decodes");
        let resource = decoded.resource.clone().expect("a resource");
        assert_eq!(resource.attributes[0].key, "service.name");
        assert_eq!(decoded.attributes[0].key, "threadlocal.schema_version");
        let Some(any_value::Value::ArrayValue(keys)) = decoded.attributes[1]
            .value
            .as_ref()
            .and_then(|v| v.value.clone())
        else {
            panic!("no key map: {decoded:?}");
        };
        assert_eq!(keys.values.len(), ATTRIBUTE_KEYS.len());
    }
}
