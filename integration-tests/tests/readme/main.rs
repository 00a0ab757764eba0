//! The README's "Using it" is the `examples/readme` crate, which CI builds: its
//! `src/main.rs` is in the README word for word, and the README's `Cargo.toml`
//! block names the same crates with the same features.

use std::collections::BTreeMap;

fn read(path: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    std::fs::read_to_string(format!("{root}/{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The fenced block that follows `marker` in `text`.
fn block_after(text: &str, marker: &str) -> String {
    let at = text.find(marker).unwrap_or_else(|| panic!("no {marker:?}"));
    let rest = &text[at..];
    let open = rest.find("```").expect("opening fence");
    let body = &rest[open..];
    let body = &body[body.find('\n').unwrap() + 1..];
    body[..body.find("```").expect("closing fence")].to_owned()
}

/// `name -> features` of a `[dependencies]` block.
fn deps(toml: &str) -> BTreeMap<String, Vec<String>> {
    let section = toml.split("[dependencies]").nth(1).expect("[dependencies]");
    section
        .lines()
        .take_while(|l| !l.starts_with('['))
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|l| {
            let name = l.split(['=', '.']).next().unwrap().trim().to_owned();
            let features = l
                .split("features = [")
                .nth(1)
                .map(|f| {
                    f.split(']')
                        .next()
                        .unwrap()
                        .split(',')
                        .map(|x| x.trim().trim_matches('"').to_owned())
                        .filter(|x| !x.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            (name, features)
        })
        .collect()
}

#[test]
fn getting_started_shows_the_example_crate_word_for_word() {
    let page = read("docs/getting-started.md");
    let shown = block_after(
        &page,
        "<!-- not run: this is examples/readme/src/main.rs, which CI builds and runs -->",
    );
    let main = read("examples/readme/src/main.rs");
    // The file opens with two lines of doc comment and a blank line the README leaves out.
    let code: String = main.splitn(4, '\n').nth(3).unwrap().to_owned();
    assert_eq!(
        shown, code,
        "docs/getting-started.md differs from examples/readme/src/main.rs"
    );
}

#[test]
fn the_getting_started_cargo_block_matches_the_example_crate() {
    let readme = read("docs/getting-started.md");
    let shown = deps(&block_after(&readme, "`Cargo.toml` ("));
    let real = deps(&read("examples/readme/Cargo.toml"));
    assert_eq!(
        shown.keys().collect::<Vec<_>>(),
        real.keys().collect::<Vec<_>>(),
        "crates named"
    );
    for (name, features) in &real {
        // opentelemetry-otlp's gRPC transport is on in the workspace's own entry.
        if name == "opentelemetry-otlp" {
            continue;
        }
        assert_eq!(&shown[name], features, "features of {name}");
    }
    let config = block_after(&readme, "`.cargo/config.toml` (");
    // Only what a user must set: tokio_unstable. Frame pointers are optional (the
    // sampler unwinds by DWARF call-frame information).
    assert!(config.contains("tokio_unstable"), "{config}");
    assert!(!config.contains("frame-pointers"), "{config}");
}

#[test]
fn adopting_spanprof_takes_the_lines_the_readme_counts() {
    // The lines a user adds to a tokio + axum + tracing-opentelemetry service are
    // marked in the example; the README says how many, and the goal is at most 10.
    let main = read("examples/readme/src/main.rs");
    let spanprof = main.lines().filter(|l| l.ends_with("// +spanprof")).count();
    let viewer = main.lines().filter(|l| l.ends_with("// +viewer")).count();
    let readme = read("README.md");
    assert!(spanprof <= 10, "{spanprof} lines to adopt spanprof");
    assert!(
        readme.contains(&format!("**{spanprof} lines**")),
        "README.md should count {spanprof} lines"
    );
    assert!(
        readme.contains(&format!("and {viewer} more for the embedded viewer")),
        "README.md should count {viewer} viewer lines"
    );
    assert!(main.contains("#[spanprof::main]"));
}
