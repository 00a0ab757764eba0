//! The request an encoded profile decodes to, read through the generated types of the
//! official protos as a backend would: every index resolved, every table's zero entry
//! left empty.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use spanprof_core::{Frame, Hotness, Profile, ProfileSample, SampleLabels};

use super::*;

fn frame(function: &str, file: &str, line: u32, address: u64, inlined: bool) -> Frame {
    Frame {
        function: function.into(),
        file: Some(file.into()),
        line,
        address,
        inlined,
    }
}

fn labels(span_id: u64, route: &str) -> Option<Arc<SampleLabels>> {
    Some(Arc::new(SampleLabels {
        trace_id: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10,
        span_id,
        parent_span_id: 0,
        root_span_id: span_id,
        span_name: "apply".into(),
        route: route.into(),
        hot: Hotness::Cold,
        latency: None,
    }))
}

/// `hash` inlined into `compute` at one address, called from `main`.
fn deep_stack() -> Arc<[Frame]> {
    vec![
        frame("hash", "src/hash.rs", 7, 0x20, true),
        frame("<T as Trait>::compute", "src/compute.rs", 30, 0x20, false),
        frame("main", "src/main.rs", 3, 0x10, false),
    ]
    .into()
}

fn profile(samples: Vec<ProfileSample>) -> Profile {
    Profile {
        samples,
        start: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        duration_ns: 10_000_000_000,
        period_ns: 10_101_010,
    }
}

/// Encodes and decodes, as the wire would.
fn round_trip(p: &Profile) -> ExportProfilesServiceRequest {
    let bytes = export_request(p, "checkout").encode_to_vec();
    ExportProfilesServiceRequest::decode(bytes.as_slice()).expect("a valid request")
}

/// A sample's frames as (function, file, line) and its locations' addresses, leaf first.
fn frames_of(d: &pb::ProfilesDictionary, s: &pb::Sample) -> (Vec<(String, String, i64)>, Vec<u64>) {
    let string = |i: i32| d.string_table[i as usize].clone();
    let stack = &d.stack_table[s.stack_index as usize];
    let mut frames = vec![];
    let mut addresses = vec![];
    for &l in &stack.location_indices {
        let location = &d.location_table[l as usize];
        addresses.push(location.address);
        for line in &location.lines {
            let f = &d.function_table[line.function_index as usize];
            frames.push((
                string(f.name_strindex),
                string(f.filename_strindex),
                line.line,
            ));
        }
    }
    (frames, addresses)
}

fn string_attributes(d: &pb::ProfilesDictionary, s: &pb::Sample) -> Vec<(String, String)> {
    s.attribute_indices
        .iter()
        .map(|&i| {
            let kv = &d.attribute_table[i as usize];
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(v)) => v.clone(),
                other => panic!("a string attribute, not {other:?}"),
            };
            (d.string_table[kv.key_strindex as usize].clone(), value)
        })
        .collect()
}

#[test]
fn a_labelled_sample_resolves_to_its_frames_its_span_and_its_attributes() {
    let slow = labels(0xabcd, "POST /checkout").map(|l| {
        Arc::new(SampleLabels {
            latency: Some(spanprof_core::LatencyClass::P99Plus),
            ..(*l).clone()
        })
    });
    let req = round_trip(&profile(vec![ProfileSample {
        stack: deep_stack(),
        labels: slow,
        count: 2,
        cpu_ns: 20_000_000,
        wall_ns: 0,
    }]));
    let d = req.dictionary.as_ref().expect("a dictionary");
    let resource = &req.resource_profiles[0];
    let service = &resource.resource.as_ref().unwrap().attributes[0];
    assert_eq!(service.key, "service.name");
    assert_eq!(
        service.value.as_ref().unwrap().value,
        Some(Value::StringValue("checkout".into()))
    );
    let p = &resource.scope_profiles[0].profiles[0];
    let sample_type = p.sample_type.as_ref().unwrap();
    assert_eq!(d.string_table[sample_type.type_strindex as usize], "cpu");
    assert_eq!(
        d.string_table[sample_type.unit_strindex as usize],
        "nanoseconds"
    );
    assert_eq!(p.period, 10_101_010);
    assert_eq!(p.duration_nano, 10_000_000_000);
    assert_eq!(p.time_unix_nano, 1_700_000_000 * 1_000_000_000);

    let [s] = p.samples.as_slice() else {
        panic!("one sample, got {}", p.samples.len())
    };
    assert_eq!(s.values, [20_000_000]);
    let (frames, addresses) = frames_of(d, s);
    // The inlined function and the function it was inlined into share one location,
    // innermost first, each with its own line.
    assert_eq!(addresses, [0x20, 0x10]);
    assert_eq!(
        frames,
        [
            ("hash".to_owned(), "src/hash.rs".to_owned(), 7),
            (
                "<T as Trait>::compute".to_owned(),
                "src/compute.rs".to_owned(),
                30
            ),
            ("main".to_owned(), "src/main.rs".to_owned(), 3),
        ]
    );
    let link = &d.link_table[s.link_index as usize];
    assert_eq!(
        link.trace_id,
        0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10u128.to_be_bytes()
    );
    assert_eq!(link.span_id, 0xabcdu64.to_be_bytes());
    assert_eq!(
        string_attributes(d, s),
        [
            ("span_name".to_owned(), "apply".to_owned()),
            ("route".to_owned(), "POST /checkout".to_owned()),
            ("span_latency".to_owned(), "p99+".to_owned())
        ]
    );
}

#[test]
fn every_table_keeps_its_zero_entry_empty_and_holds_each_value_once() {
    let req = round_trip(&profile(vec![
        ProfileSample {
            stack: deep_stack(),
            labels: labels(1, "GET /a"),
            count: 1,
            cpu_ns: 1,
            wall_ns: 0,
        },
        ProfileSample {
            stack: deep_stack(),
            labels: labels(2, "GET /a"),
            count: 1,
            cpu_ns: 1,
            wall_ns: 0,
        },
        ProfileSample {
            stack: deep_stack()[2..].into(),
            labels: None,
            count: 1,
            cpu_ns: 1,
            wall_ns: 0,
        },
    ]));
    let d = req.dictionary.unwrap();
    assert_eq!(d.string_table[0], "");
    assert_eq!(d.function_table[0], pb::Function::default());
    assert_eq!(d.location_table[0], pb::Location::default());
    assert_eq!(d.stack_table[0], pb::Stack::default());
    assert_eq!(d.link_table[0], pb::Link::default());
    assert_eq!(d.attribute_table[0], pb::KeyValueAndUnit::default());
    assert_eq!(d.mapping_table, [pb::Mapping::default()]);

    let mut strings = d.string_table.clone();
    strings.sort();
    strings.dedup();
    assert_eq!(
        strings.len(),
        d.string_table.len(),
        "a string twice: {:?}",
        d.string_table
    );
    // Three functions, two locations (main's shared by the short stack), two stacks,
    // two links (one per span), two attributes (the name and the route, shared).
    assert_eq!(d.function_table.len(), 1 + 3);
    assert_eq!(d.location_table.len(), 1 + 2);
    assert_eq!(d.stack_table.len(), 1 + 2);
    assert_eq!(d.link_table.len(), 1 + 2);
    assert_eq!(d.attribute_table.len(), 1 + 2);
    let samples = &req.resource_profiles[0].scope_profiles[0].profiles[0].samples;
    assert_eq!(samples[0].stack_index, samples[1].stack_index);
    assert_ne!(samples[0].link_index, samples[1].link_index);
    let short = frames_of(&d, &samples[2]);
    assert_eq!(short.1, [0x10]);
}

#[test]
fn a_sample_outside_any_span_has_no_link_and_an_empty_route_is_left_out() {
    let req = round_trip(&profile(vec![
        ProfileSample {
            stack: deep_stack(),
            labels: None,
            count: 1,
            cpu_ns: 5,
            wall_ns: 0,
        },
        ProfileSample {
            stack: deep_stack(),
            labels: labels(0, "GET /a"),
            count: 1,
            cpu_ns: 6,
            wall_ns: 0,
        },
        ProfileSample {
            stack: deep_stack(),
            labels: labels(9, ""),
            count: 1,
            cpu_ns: 7,
            wall_ns: 0,
        },
    ]));
    let d = req.dictionary.as_ref().unwrap();
    let samples = &req.resource_profiles[0].scope_profiles[0].profiles[0].samples;
    for s in &samples[..2] {
        assert_eq!(s.link_index, 0, "no span, no link");
        assert!(s.attribute_indices.is_empty());
    }
    assert_ne!(samples[2].link_index, 0);
    assert_eq!(
        string_attributes(d, &samples[2]),
        [("span_name".to_owned(), "apply".to_owned())]
    );
}

#[test]
fn an_empty_profile_encodes_to_a_request_without_samples() {
    let req = round_trip(&profile(vec![]));
    let p = &req.resource_profiles[0].scope_profiles[0].profiles[0];
    assert!(p.samples.is_empty());
    assert_eq!(
        req.dictionary.unwrap().string_table,
        ["", "cpu", "nanoseconds"]
    );
}

#[test]
fn wall_clock_samples_make_a_second_profile_of_type_wall() {
    let blocked: Arc<[Frame]> = vec![
        frame("clock_nanosleep", "", 0, 0x30, false),
        frame("blocking_lookup", "src/lookup.rs", 12, 0x40, false),
    ]
    .into();
    let req = round_trip(&profile(vec![
        // On CPU: CPU and wall-clock samples in the same stack.
        ProfileSample {
            stack: deep_stack(),
            labels: labels(7, "GET /lookup"),
            count: 1,
            cpu_ns: 10_000_000,
            wall_ns: 20_000_000,
        },
        // Blocked: wall-clock samples only.
        ProfileSample {
            stack: blocked,
            labels: labels(7, "GET /lookup"),
            count: 0,
            cpu_ns: 0,
            wall_ns: 60_000_000,
        },
    ]));
    let d = req.dictionary.as_ref().unwrap();
    let profiles = &req.resource_profiles[0].scope_profiles[0].profiles;
    let [cpu, wall] = profiles.as_slice() else {
        panic!("two profiles, got {}", profiles.len())
    };
    let type_of = |p: &pb::Profile| {
        let t = p.sample_type.as_ref().unwrap();
        (
            d.string_table[t.type_strindex as usize].clone(),
            d.string_table[t.unit_strindex as usize].clone(),
        )
    };
    assert_eq!(type_of(cpu), ("cpu".to_owned(), "nanoseconds".to_owned()));
    assert_eq!(type_of(wall), ("wall".to_owned(), "nanoseconds".to_owned()));
    assert_ne!(cpu.profile_id, wall.profile_id);
    assert_eq!(cpu.samples.len(), 1, "the blocked stack has no CPU");
    assert_eq!(cpu.samples[0].values, [10_000_000]);
    let mut by_leaf: Vec<(String, Vec<i64>)> = wall
        .samples
        .iter()
        .map(|s| (frames_of(d, s).0[0].0.clone(), s.values.clone()))
        .collect();
    by_leaf.sort();
    assert_eq!(
        by_leaf,
        [
            ("clock_nanosleep".to_owned(), vec![60_000_000]),
            ("hash".to_owned(), vec![20_000_000]),
        ]
    );
    // Linked to the span like CPU samples.
    for s in &wall.samples {
        assert_eq!(
            d.link_table[s.link_index as usize].span_id,
            7u64.to_be_bytes()
        );
    }
}

#[test]
fn a_profile_without_wall_clock_samples_is_one_cpu_profile() {
    let req = round_trip(&profile(vec![ProfileSample {
        stack: deep_stack(),
        labels: None,
        count: 1,
        cpu_ns: 1,
        wall_ns: 0,
    }]));
    assert_eq!(req.resource_profiles[0].scope_profiles[0].profiles.len(), 1);
}
