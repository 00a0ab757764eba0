//! The service name profiles are filed under is the one traces carry: the tracer
//! provider's `Resource` (`Resource::builder().with_service_name(..)`, the
//! OpenTelemetry way), else `OTEL_SERVICE_NAME`, else `service.name` in
//! `OTEL_RESOURCE_ATTRIBUTES`, for the Pyroscope series label and OTLP profiles'
//! `service.name` alike; else Grafana's traces-to-profiles finds nothing.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
use prost::Message;
use spanprof::SpanProfileProcessor;
use spanprof_export::pyroscope::proto::push::v1::PushRequest;
use spanprof_export::{
    OtlpProfilesConfig, OtlpProfilesExporter, OtlpProtocol, PyroscopeConfig, PyroscopeExporter,
};
use support::receiver::{Receiver, numbered_source};

use support::global_logs as logs;

fn warnings(needle: &str) -> Vec<String> {
    logs()
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("WARN") && l.contains(needle))
        .cloned()
        .collect()
}

/// A tracer provider with `resource` and spanprof's span processor (as a service
/// sets it up).
fn provider(resource: Resource) -> SdkTracerProvider {
    SdkTracerProvider::builder()
        .with_resource(resource)
        .with_span_processor(SpanProfileProcessor::new(SimpleSpanProcessor::new(
            InMemorySpanExporter::default(),
        )))
        .build()
}

/// The `service_name` series label of each Pyroscope push, and the `service.name` of
/// each OTLP profiles export, the receiver got.
fn names(receiver: &Receiver) -> Vec<String> {
    receiver
        .received()
        .iter()
        .map(|r| {
            if r.path.contains("profiles") {
                let req = ExportProfilesServiceRequest::decode(r.body.as_ref()).unwrap();
                let attrs = &req.resource_profiles[0]
                    .resource
                    .as_ref()
                    .unwrap()
                    .attributes;
                let kv = attrs.iter().find(|kv| kv.key == "service.name").unwrap();
                match kv.value.as_ref().unwrap().value.as_ref().unwrap() {
                    any_value::Value::StringValue(s) => s.clone(),
                    other => panic!("{other:?}"),
                }
            } else {
                let req = PushRequest::decode(r.body.as_ref()).unwrap();
                let labels = &req.series[0].labels;
                labels
                    .iter()
                    .find(|l| l.name == "service_name")
                    .unwrap()
                    .value
                    .clone()
            }
        })
        .collect()
}

/// Starts both sinks against `receiver`, pushing every 100 ms, with their default
/// service name.
fn sinks(receiver: &Receiver) -> (PyroscopeExporter, OtlpProfilesExporter) {
    let mut cfg = PyroscopeConfig::new(receiver.url());
    cfg.interval = Duration::from_millis(100);
    let pyroscope = PyroscopeExporter::start(cfg, numbered_source()).unwrap();
    let mut cfg = OtlpProfilesConfig::new(
        format!("{}/v1development/profiles", receiver.url()),
        OtlpProtocol::HttpProtobuf,
    );
    cfg.interval = Duration::from_millis(100);
    let otlp = OtlpProfilesExporter::start(cfg, numbered_source()).unwrap();
    (pyroscope, otlp)
}

fn wait_for(receiver: &Receiver, pushes: usize) {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while receiver.received().len() < pushes && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tracer_providers_resource_names_the_profiles() {
    logs();
    let provider = provider(
        Resource::builder()
            .with_service_name("checkout-api")
            .build(),
    );
    let receiver = Receiver::start(vec![]).await;
    let (pyroscope, otlp) = sinks(&receiver);
    let r = receiver.clone();
    tokio::task::spawn_blocking(move || wait_for(&r, 4))
        .await
        .unwrap();
    let got = names(&receiver);
    tokio::task::spawn_blocking(move || drop((pyroscope, otlp)))
        .await
        .unwrap();
    assert!(got.len() >= 4, "{got:?}");
    assert!(got.iter().all(|n| n == "checkout-api"), "{got:?}");
    assert_eq!(warnings("service"), Vec::<String>::new());
    provider.shutdown().unwrap();
}

/// Sinks are often started before tracing: their default name follows the Resource
/// once the provider is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_built_after_the_sinks_still_names_their_profiles() {
    logs();
    let receiver = Receiver::start(vec![]).await;
    let (pyroscope, otlp) = sinks(&receiver);
    let provider = provider(
        Resource::builder()
            .with_service_name("checkout-api")
            .build(),
    );
    // Pushes already under way may carry the old name.
    let before = receiver.received().len() + 2;
    let r = receiver.clone();
    tokio::task::spawn_blocking(move || wait_for(&r, before + 4))
        .await
        .unwrap();
    let got = names(&receiver);
    tokio::task::spawn_blocking(move || drop((pyroscope, otlp)))
        .await
        .unwrap();
    assert!(got.len() >= before + 4, "{got:?}");
    assert!(got[before..].iter().all(|n| n == "checkout-api"), "{got:?}");
    provider.shutdown().unwrap();
}

#[test]
fn otel_resource_attributes_name_the_service_unless_otel_service_name_does() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    const ATTRS: &str = "deployment.environment=prod,service.name=cart%20api";
    let cfg = PyroscopeConfig::from_lookup(env(&[
        ("PYROSCOPE_SERVER_ADDRESS", "http://pyroscope:4040"),
        ("OTEL_RESOURCE_ATTRIBUTES", ATTRS),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(cfg.service_name, "cart api");
    let cfg = OtlpProfilesConfig::from_lookup(env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ("OTEL_RESOURCE_ATTRIBUTES", ATTRS),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(cfg.service_name, "cart api");
    let cfg = PyroscopeConfig::from_lookup(env(&[
        ("PYROSCOPE_SERVER_ADDRESS", "http://pyroscope:4040"),
        ("OTEL_RESOURCE_ATTRIBUTES", ATTRS),
        ("OTEL_SERVICE_NAME", "cart"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(cfg.service_name, "cart");
}

/// A name set in the sink's configuration that is not the traces' is a mistake
/// spanprof can see: one warning naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_named_otherwise_than_the_traces_is_reported() {
    logs();
    let provider = provider(
        Resource::builder()
            .with_service_name("checkout-api")
            .build(),
    );
    let receiver = Receiver::start(vec![]).await;
    let mut cfg = PyroscopeConfig::new(receiver.url());
    cfg.service_name = "checkout".into();
    let pyroscope = PyroscopeExporter::start(cfg, numbered_source()).unwrap();
    tokio::task::spawn_blocking(move || drop(pyroscope))
        .await
        .unwrap();
    let found = warnings("service_name=checkout ");
    assert_eq!(found.len(), 1, "{:?}", warnings(""));
    assert!(found[0].contains("checkout-api"), "{}", found[0]);
    provider.shutdown().unwrap();
}

/// A provider with no service name files traces under `unknown_service`: spanprof
/// says how to name it, once.
#[test]
fn a_resource_without_a_service_name_is_reported() {
    logs();
    let provider = provider(Resource::builder_empty().build());
    let found = warnings("unknown_service");
    assert_eq!(found.len(), 1, "{:?}", warnings(""));
    assert!(
        found[0].contains("OTEL_SERVICE_NAME") && found[0].contains("with_service_name"),
        "{}",
        found[0]
    );
    provider.shutdown().unwrap();
}
