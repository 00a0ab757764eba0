//! A profile as an OTLP `ExportProfilesServiceRequest`: one resource, one scope, one
//! profile, its shared dictionary interned as it is built.

use std::collections::HashMap;
use std::time::UNIX_EPOCH;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development as pb;
use opentelemetry_proto::tonic::resource::v1::Resource;
use spanprof_core::pprof::LABEL_SPAN_LATENCY;
use spanprof_core::{Frame, Profile, ProfileSample, SampleLabels, physical_frames};

/// Interns values into a dictionary table whose index 0 is the zero value.
struct Table<K, V> {
    index: HashMap<K, i32>,
    values: Vec<V>,
}

impl<K: std::hash::Hash + Eq, V: Default> Table<K, V> {
    fn new() -> Self {
        Table {
            index: HashMap::new(),
            values: vec![V::default()],
        }
    }

    fn get(&mut self, key: K, make: impl FnOnce() -> V) -> i32 {
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = self.values.len() as i32;
        self.values.push(make());
        self.index.insert(key, i);
        i
    }
}

/// Builds the export request for one profile (one resource, one scope, one shared
/// dictionary): the CPU profile, and the wall-clock profile of hot polls when the
/// interval has wall-clock samples.
pub(crate) fn export_request(
    profile: &Profile,
    service_name: &str,
) -> ExportProfilesServiceRequest {
    let mut dict = Dictionary::new();
    let cpu = dict.string("cpu");
    let nanoseconds = dict.string("nanoseconds");
    // The stacks only wall-clock samples saw are not in the CPU profile, nor the
    // stacks only CPU samples saw in the wall profile.
    let samples = profile
        .samples
        .iter()
        .filter(|s| s.count > 0)
        .map(|s| dict.sample(s, s.cpu_ns))
        .collect();
    let wall_samples: Vec<pb::Sample> = profile
        .samples
        .iter()
        .filter(|s| s.wall_ns > 0)
        .map(|s| dict.sample(s, s.wall_ns))
        .collect();
    let time_unix_nano = profile
        .start
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let profile_id = {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&time_unix_nano.to_be_bytes());
        id[8..12].copy_from_slice(&std::process::id().to_be_bytes());
        id
    };
    let pb_profile = pb::Profile {
        sample_type: Some(pb::ValueType {
            type_strindex: cpu,
            unit_strindex: nanoseconds,
        }),
        samples,
        time_unix_nano,
        duration_nano: profile.duration_ns,
        period_type: Some(pb::ValueType {
            type_strindex: cpu,
            unit_strindex: nanoseconds,
        }),
        period: i64::try_from(profile.period_ns).unwrap_or(i64::MAX),
        profile_id: profile_id.to_vec(),
        ..Default::default()
    };
    let mut profiles = vec![pb_profile];
    if !wall_samples.is_empty() {
        let mut wall_id = profile_id;
        wall_id[15] = 1;
        let of_wall = Some(pb::ValueType {
            type_strindex: dict.string("wall"),
            unit_strindex: nanoseconds,
        });
        profiles.push(pb::Profile {
            sample_type: of_wall,
            samples: wall_samples,
            time_unix_nano,
            duration_nano: profile.duration_ns,
            period_type: of_wall,
            profile_id: wall_id.to_vec(),
            ..Default::default()
        });
    }
    ExportProfilesServiceRequest {
        resource_profiles: vec![pb::ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(service_name.to_owned())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_profiles: vec![pb::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "spanprof".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dict.finish()),
    }
}

/// The profile's shared dictionary as it is built: each table interns its entries
/// (index 0 is the zero value, as OTLP requires).
struct Dictionary {
    strings: Table<String, String>,
    functions: Table<(i32, i32), pb::Function>,
    locations: Table<Vec<(u64, i32, i64)>, pb::Location>,
    stacks: Table<Vec<i32>, pb::Stack>,
    links: Table<(u128, u64), pb::Link>,
    attributes: Table<(i32, String), pb::KeyValueAndUnit>,
}

impl Dictionary {
    fn new() -> Self {
        Dictionary {
            strings: Table::new(),
            functions: Table::new(),
            locations: Table::new(),
            stacks: Table::new(),
            links: Table::new(),
            attributes: Table::new(),
        }
    }

    fn string(&mut self, v: &str) -> i32 {
        self.strings.get(v.to_owned(), || v.to_owned())
    }

    /// One sample of `value` (its CPU or wall-clock time): its stack of locations, its
    /// link to the span, its attributes.
    fn sample(&mut self, sample: &ProfileSample, value: u64) -> pb::Sample {
        let location_indices: Vec<i32> = physical_frames(&sample.stack)
            .map(|frames| self.location(frames))
            .collect();
        let stack_index = self
            .stacks
            .get(location_indices.clone(), || pb::Stack { location_indices });
        let (link_index, attribute_indices) = match &sample.labels {
            Some(l) if l.span_id != 0 => (self.link(l), self.span_attributes(l)),
            _ => (0, vec![]),
        };
        pb::Sample {
            stack_index,
            attribute_indices,
            link_index,
            values: vec![i64::try_from(value).unwrap_or(i64::MAX)],
            timestamps_unix_nano: vec![],
        }
    }

    /// One location per physical frame: the frames inlined at one address share it.
    fn location(&mut self, frames: &[Frame]) -> i32 {
        let address = frames[0].address;
        let mut key = Vec::with_capacity(frames.len());
        let mut lines = Vec::with_capacity(frames.len());
        for f in frames {
            let name = self.string(&f.function);
            let file = f.file.as_deref().map_or(0, |file| self.string(file));
            let function_index = self.functions.get((name, file), || pb::Function {
                name_strindex: name,
                // Empty, as in pprof: a reader that finds it equal to the name may
                // take the name for a mangled one and shorten it.
                system_name_strindex: 0,
                filename_strindex: file,
                start_line: 0,
            });
            key.push((address, function_index, i64::from(f.line)));
            lines.push(pb::Line {
                function_index,
                line: i64::from(f.line),
                column: 0,
            });
        }
        self.locations.get(key, || pb::Location {
            mapping_index: 0,
            address,
            lines,
            attribute_indices: vec![],
        })
    }

    /// The link from a sample to its span.
    fn link(&mut self, l: &SampleLabels) -> i32 {
        self.links.get((l.trace_id, l.span_id), || pb::Link {
            trace_id: l.trace_id.to_be_bytes().to_vec(),
            span_id: l.span_id.to_be_bytes().to_vec(),
        })
    }

    /// The span name, route and latency class as sample attributes (when known).
    fn span_attributes(&mut self, l: &SampleLabels) -> Vec<i32> {
        let mut out = Vec::with_capacity(3);
        let latency = l.latency.map_or("", |c| c.as_str());
        for (k, v) in [
            ("span_name", &*l.span_name),
            ("route", &*l.route),
            (LABEL_SPAN_LATENCY, latency),
        ] {
            if v.is_empty() {
                continue;
            }
            let key = self.string(k);
            out.push(
                self.attributes
                    .get((key, v.to_owned()), || pb::KeyValueAndUnit {
                        key_strindex: key,
                        value: Some(AnyValue {
                            value: Some(any_value::Value::StringValue(v.to_owned())),
                        }),
                        unit_strindex: 0,
                    }),
            );
        }
        out
    }

    fn finish(self) -> pb::ProfilesDictionary {
        pb::ProfilesDictionary {
            mapping_table: vec![pb::Mapping::default()],
            location_table: self.locations.values,
            function_table: self.functions.values,
            link_table: self.links.values,
            string_table: self.strings.values,
            attribute_table: self.attributes.values,
            stack_table: self.stacks.values,
        }
    }
}

#[cfg(test)]
mod tests;
