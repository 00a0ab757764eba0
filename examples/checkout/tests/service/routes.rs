//! Spans, profile labels and exported spans are named by route templates, never by
//! raw paths: a thousand distinct paths give a handful of names, and a secret in a
//! path appears nowhere.

use std::collections::BTreeSet;

use bytes::Bytes;
use http_body_util::Full;

use crate::support::{InProcess, get, send};

const SECRET: &str = "SECRETMARKER";

#[test]
fn a_thousand_raw_paths_make_a_handful_of_names_and_no_secret() {
    let shop = InProcess::start();
    let payments = shop.shop.payments;
    shop.rt.block_on(async {
        let paths: Vec<(http::Method, String)> = (0..1000)
            .map(|i| match i % 5 {
                0 => (http::Method::GET, format!("/pay/{SECRET}-{i}")),
                1 => (http::Method::POST, format!("/pay/{i}/{SECRET}")),
                2 => (http::Method::GET, format!("/{SECRET}{i}")),
                3 => (http::Method::POST, format!("/pay?card={SECRET}{i}")),
                _ => (http::Method::GET, format!("/refund/{i}")),
            })
            .collect();
        for chunk in paths.chunks(20) {
            let sends = chunk.iter().map(|(m, p)| {
                send(
                    http::Request::builder()
                        .method(m)
                        .uri(format!("http://{payments}{p}"))
                        .body(Full::new(Bytes::from_static(b"{\"amount_cents\":1}")))
                        .unwrap(),
                )
            });
            for r in futures_util::future::join_all(sends).await {
                r.expect("payments answered");
            }
        }
    });
    shop.flush_spans();
    shop.shop.profiler.flush();

    // The viewer's JSON: every trace (they are all roots here) and its spans.
    let viewer = shop.viewer();
    let names: BTreeSet<String> = shop.rt.block_on(async {
        let (status, list) = get(&format!("{viewer}api/traces?limit=1000"))
            .await
            .unwrap();
        assert_eq!(status, 200);
        assert!(!list.contains(SECRET), "the trace list shows the secret");
        let list: serde_json::Value = serde_json::from_str(&list).unwrap();
        let list = list.as_array().unwrap();
        assert!(list.len() >= 900, "{} traces recorded", list.len());
        let mut names = BTreeSet::new();
        for t in list {
            let id = t["trace_id"].as_str().unwrap();
            let (_, trace) = get(&format!("{viewer}api/traces/{id}")).await.unwrap();
            assert!(
                !trace.contains(SECRET),
                "trace {id} shows the secret: {trace}"
            );
            names.insert(t["root"].as_str().unwrap().to_owned());
        }
        names
    });
    assert!(names.len() <= 4, "span names: {names:?}");

    // Profile labels.
    let labels: BTreeSet<String> = shop
        .shop
        .profiler
        .store()
        .spans()
        .iter()
        .flat_map(|s| [s.labels.span_name.to_string(), s.labels.route.to_string()])
        .collect();
    assert!(
        labels.iter().all(|l| !l.contains(SECRET)),
        "profile labels: {labels:?}"
    );
    assert!(labels.len() <= 8, "profile labels: {labels:?}");

    // Exported spans.
    let exported = shop.collector.spans();
    assert!(exported.len() >= 900, "{} spans exported", exported.len());
    let leaked: Vec<_> = exported
        .iter()
        .filter(|s| s.name.contains(SECRET) || s.attributes.iter().any(|a| a.contains(SECRET)))
        .take(3)
        .collect();
    assert!(
        leaked.is_empty(),
        "exported spans carry the secret: {leaked:?}"
    );
}
