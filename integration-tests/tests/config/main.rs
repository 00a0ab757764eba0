//! Bad configuration is reported when the layer is built, naming the field: one test
//! per rule.

use spanprof_tower::{ConfigError, PolicyConfig, ProfileCorrelationLayer, RoutePolicy};

fn build_json(json: &str) -> Result<(), ConfigError> {
    let cfg: PolicyConfig = serde_json::from_str(json).expect("well-formed JSON");
    ProfileCorrelationLayer::builder()
        .config(cfg)
        .build()
        .map(drop)
}

#[track_caller]
fn assert_field(r: Result<(), ConfigError>, field: &str, words: &str) {
    let e = r.expect_err("configuration should be rejected");
    assert_eq!(e.field, field, "{e}");
    let msg = e.to_string();
    assert!(msg.contains(field) && msg.contains(words), "{msg}");
}

#[test]
fn invalid_rate_is_named() {
    let r = ProfileCorrelationLayer::builder()
        .route("/checkout", RoutePolicy::new().sample_rate(1.5))
        .build()
        .map(drop);
    assert_field(
        r,
        "routes[\"/checkout\"].sample_rate",
        "between 0.0 and 1.0",
    );
    let r = ProfileCorrelationLayer::builder()
        .default_policy(RoutePolicy::new().sample_rate(f64::NAN))
        .build()
        .map(drop);
    assert_field(r, "default.sample_rate", "between 0.0 and 1.0");
    assert_field(
        build_json(r#"{"routes": {"/a": {"sample_rate": -0.1}}}"#),
        "routes[\"/a\"].sample_rate",
        "between 0.0 and 1.0",
    );
}

#[test]
fn negative_duration_is_named() {
    assert_field(
        build_json(r#"{"routes": {"/checkout": {"slow_after": "-300ms"}}}"#),
        "routes[\"/checkout\"].slow_after",
        "negative",
    );
    assert_field(
        build_json(r#"{"default": {"slow_after": -5}}"#),
        "default.slow_after",
        "non-negative",
    );
}

#[test]
fn a_long_poll_threshold_takes_a_unit_or_never() {
    build_json(r#"{"routes": {"/pay": {"long_poll": "25ms"}}, "default": {"long_poll": "never"}}"#)
        .expect("a threshold with a unit, and never");
    assert_field(
        build_json(r#"{"routes": {"/pay": {"long_poll": "25"}}}"#),
        "routes[\"/pay\"].long_poll",
        "has no unit",
    );
    assert_field(
        build_json(r#"{"default": {"long_poll": true}}"#),
        "default.long_poll",
        "not a duration",
    );
}

#[test]
fn high_rate_below_baseline_is_named() {
    let r = ProfileCorrelationLayer::builder()
        .route("/checkout", RoutePolicy::new().high_rate_hz(10))
        .build()
        .map(drop);
    assert_field(
        r,
        "routes[\"/checkout\"].high_rate_hz",
        "below the profiler's baseline",
    );
}

#[test]
fn route_that_cannot_match_is_named() {
    let r = ProfileCorrelationLayer::builder()
        .route("checkout", RoutePolicy::new())
        .build()
        .map(drop);
    assert_field(r, "routes[\"checkout\"]", "can never match");
    let r = ProfileCorrelationLayer::builder()
        .route("/cart/:id", RoutePolicy::new())
        .build()
        .map(drop);
    assert_field(r, "routes[\"/cart/:id\"]", "{id}");
    let r = ProfileCorrelationLayer::builder()
        .disable_route("/health?verbose=1")
        .build()
        .map(drop);
    assert_field(r, "disabled[0]", "query strings");
}

#[test]
fn unknown_fields_are_rejected_by_name() {
    let e = serde_json::from_str::<PolicyConfig>(r#"{"routes": {"/a": {"sample_rte": 0.1}}}"#)
        .unwrap_err();
    assert!(e.to_string().contains("sample_rte"), "{e}");
}

#[test]
fn a_duration_without_a_unit_is_refused_not_guessed() {
    // `250` (a JSON number) is milliseconds; `"250"` used to mean 250 seconds.
    assert_field(
        build_json(r#"{"routes": {"/checkout": {"slow_after": "250"}}}"#),
        "routes[\"/checkout\"].slow_after",
        "no unit",
    );
    assert!(build_json(r#"{"routes": {"/checkout": {"slow_after": 250}}}"#).is_ok());
    assert!(build_json(r#"{"routes": {"/checkout": {"slow_after": "250ms"}}}"#).is_ok());
}

#[test]
fn max_routes_out_of_bounds_is_named() {
    let build = |n| {
        ProfileCorrelationLayer::builder()
            .max_routes(n)
            .build()
            .map(drop)
    };
    assert_field(build(0), "max_routes", "at least 1");
    assert_field(
        build(spanprof_tower::MAX_MAX_ROUTES + 1),
        "max_routes",
        "at most 65536",
    );
    assert!(build(spanprof_tower::MAX_MAX_ROUTES).is_ok());
}

/// The report a reader gets from an error and its `source()` chain, as anyhow and
/// eyre print it: each message, then each cause's.
fn report(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str("\nCaused by: ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// An error either says its cause or returns it from `source()`, not both: else a
/// report prints every cause twice.
#[test]
fn errors_report_their_cause_once() {
    let io = || {
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "perf_event_open: EACCES",
        )
    };
    let config = || ConfigError::new("baseline_hz", "0 is not in 1..=1000");
    let errors: Vec<(Box<dyn std::error::Error>, &str)> = vec![
        (Box::new(spanprof::ProfilerError::Io(io())), "EACCES"),
        (
            Box::new(spanprof::ProfilerError::from(config())),
            "0 is not in",
        ),
        (Box::new(spanprof::export::ExportError::Io(io())), "EACCES"),
        (
            Box::new(spanprof::export::ExportError::from(config())),
            "0 is not in",
        ),
        (
            Box::new(spanprof::pprof::decode(b"\x1f\x8bnot gzip").unwrap_err()),
            "gzip",
        ),
        (
            Box::new(spanprof::pprof::decode(b"\x0a\xff\xff\xff").unwrap_err()),
            "protobuf",
        ),
    ];
    for (e, needle) in errors {
        let r = report(e.as_ref());
        assert!(r.contains(needle), "{r}");
        let lines: Vec<&str> = r
            .lines()
            .map(|l| l.trim_start_matches("Caused by: "))
            .collect();
        for (i, outer) in lines.iter().enumerate() {
            for inner in &lines[i + 1..] {
                assert!(!outer.contains(inner), "a cause reported twice:\n{r}");
            }
        }
    }
}
