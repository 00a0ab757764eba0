//! Flamegraphs (inferno SVG, with its interactive search) and differential
//! flamegraphs of store profiles.

use spanprof_core::Profile;

/// Folded stacks (`root;…;leaf <cpu µs>`), the input inferno reads.
fn folded(profile: &Profile) -> Vec<String> {
    let mut lines: Vec<String> = profile
        .samples
        .iter()
        .filter(|s| s.cpu_ns > 0)
        .map(|s| {
            let stack: Vec<&str> = s.stack.iter().rev().map(|f| &*f.function).collect();
            // inferno separates frames with ';' and counts with a space.
            let stack = stack.join(";").replace(' ', "\u{a0}");
            format!("{stack} {}", (s.cpu_ns / 1_000).max(1))
        })
        .collect();
    lines.sort();
    lines
}

fn options(title: &str) -> inferno::flamegraph::Options<'static> {
    let mut o = inferno::flamegraph::Options::default();
    o.title = title.to_owned();
    o.count_name = "µs CPU".to_owned();
    o.min_width = 0.05;
    o
}

/// An interactive flamegraph SVG of `profile`.
pub(crate) fn svg(profile: &Profile, title: &str) -> Result<Vec<u8>, String> {
    let lines = folded(profile);
    if lines.is_empty() {
        return Err("no CPU samples".into());
    }
    let mut out = Vec::new();
    inferno::flamegraph::from_lines(
        &mut options(title),
        lines.iter().map(String::as_str),
        &mut out,
    )
    .map_err(|e| e.to_string())?;
    Ok(out)
}

/// A differential flamegraph: `after` drawn, coloured by how it differs from
/// `before` (red: more CPU share in `after`, blue: less).
pub(crate) fn diff_svg(before: &Profile, after: &Profile, title: &str) -> Result<Vec<u8>, String> {
    let (b, a) = (folded(before).join("\n"), folded(after).join("\n"));
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
    inferno::flamegraph::from_lines(&mut options(title), diff.lines(), &mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}
