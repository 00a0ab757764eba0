//! Flamegraphs (inferno SVG, with its interactive search) and differential
//! flamegraphs of store profiles.

use spanprof_core::{Profile, ProfileSample};

/// What a flamegraph's widths measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Value {
    /// CPU time (CPU samples).
    Cpu,
    /// Wall-clock time inside hot polls, on or off CPU (wall-clock samples).
    Wall,
}

impl Value {
    fn of(self, s: &ProfileSample) -> u64 {
        match self {
            Value::Cpu => s.cpu_ns,
            Value::Wall => s.wall_ns,
        }
    }

    /// What an empty profile lacks, for the 404.
    fn missing(self) -> &'static str {
        match self {
            Value::Cpu => "no CPU samples",
            Value::Wall => "no wall-clock samples (only work profiled at the high rate has them)",
        }
    }
}

/// Folded stacks (`root;…;leaf <µs>`), the input inferno reads.
fn folded(profile: &Profile, value: Value) -> Vec<String> {
    let mut lines: Vec<String> = profile
        .samples
        .iter()
        .filter(|s| value.of(s) > 0)
        .map(|s| {
            let stack: Vec<&str> = s.stack.iter().rev().map(|f| &*f.function).collect();
            // inferno separates frames with ';' and counts with a space.
            let stack = stack.join(";").replace(' ', "\u{a0}");
            format!("{stack} {}", (value.of(s) / 1_000).max(1))
        })
        .collect();
    lines.sort();
    lines
}

fn options(title: &str, value: Value) -> inferno::flamegraph::Options<'static> {
    let mut o = inferno::flamegraph::Options::default();
    o.title = title.to_owned();
    o.count_name = match value {
        Value::Cpu => "µs CPU",
        Value::Wall => "µs wall-clock",
    }
    .to_owned();
    o.min_width = 0.05;
    o
}

/// An interactive flamegraph SVG of `profile`, its widths `value`.
pub(crate) fn svg(profile: &Profile, title: &str, value: Value) -> Result<Vec<u8>, String> {
    let lines = folded(profile, value);
    if lines.is_empty() {
        return Err(value.missing().into());
    }
    let mut out = Vec::new();
    inferno::flamegraph::from_lines(
        &mut options(title, value),
        lines.iter().map(String::as_str),
        &mut out,
    )
    .map_err(|e| e.to_string())?;
    Ok(out)
}

/// A differential flamegraph: `after` drawn, coloured by how it differs from
/// `before` (red: more CPU share in `after`, blue: less).
pub(crate) fn diff_svg(before: &Profile, after: &Profile, title: &str) -> Result<Vec<u8>, String> {
    let (b, a) = (
        folded(before, Value::Cpu).join("\n"),
        folded(after, Value::Cpu).join("\n"),
    );
    if a.is_empty() {
        return Err("no CPU samples".into());
    }
    let mut diff = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options {
            normalize: true,
            ..Default::default()
        },
        b.as_bytes(),
        a.as_bytes(),
        &mut diff,
    )
    .map_err(|e| e.to_string())?;
    let diff = String::from_utf8(diff).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    inferno::flamegraph::from_lines(&mut options(title, Value::Cpu), diff.lines(), &mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}
