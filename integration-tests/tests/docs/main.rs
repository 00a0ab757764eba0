//! Every Rust snippet a user reads — the front page (`README.md`), the facade's page
//! (`crates/spanprof/README.md`, its crate docs) and `docs/*.md` — is compiled and
//! run by CI: the facade's page and the docs as doc tests (`integration-tests/src/lib.rs`
//! includes every page of `docs/`), the front page's one program as `examples/readme`
//! (built, and run by its own test). A snippet that is not run says why, in an HTML
//! comment on the line before it (`<!-- not run: … -->`).

use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The opening fences of `text`: (line number, info string, the line before).
fn fences(text: &str) -> Vec<(usize, String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut inside = false;
    for (i, l) in lines.iter().enumerate() {
        if let Some(info) = l.trim_start().strip_prefix("```") {
            if !inside {
                let before = if i > 0 { lines[i - 1] } else { "" };
                out.push((i + 1, info.trim().to_owned(), before.to_owned()));
            }
            inside = !inside;
        }
    }
    out
}

/// Whether rustdoc reads a fence with this info string as Rust.
fn is_rust(info: &str) -> bool {
    let tags: Vec<&str> = info.split([',', ' ']).filter(|t| !t.is_empty()).collect();
    tags.is_empty()
        || tags.contains(&"rust")
        || tags.iter().all(|t| {
            matches!(
                *t,
                "ignore"
                    | "no_run"
                    | "should_panic"
                    | "compile_fail"
                    | "edition2021"
                    | "edition2024"
            )
        })
}

fn docs_pages() -> Vec<String> {
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.ends_with(".md").then(|| format!("docs/{name}"))
        })
        .collect();
    pages.sort();
    pages
}

#[test]
fn every_page_of_docs_is_doc_tested() {
    let lib = read("integration-tests/src/lib.rs");
    let missing: Vec<String> = docs_pages()
        .into_iter()
        .filter(|p| !lib.contains(&format!("include_str!(\"../../{p}\")")))
        .collect();
    assert_eq!(
        missing,
        Vec::<String>::new(),
        "pages of docs/ whose snippets no doc test runs: add them to integration-tests/src/lib.rs"
    );
}

#[test]
fn every_rust_snippet_runs_or_says_why_not() {
    let mut pages = vec![
        "README.md".to_owned(),
        "crates/spanprof/README.md".to_owned(),
    ];
    pages.extend(docs_pages());
    let mut bad = Vec::new();
    for page in &pages {
        for (line, info, before) in fences(&read(page)) {
            if !is_rust(&info) {
                continue;
            }
            let skipped = info.contains("ignore") || info.contains("no_run");
            if skipped && !before.trim_start().starts_with("<!-- not run:") {
                bad.push(format!(
                    "{page}:{line}: ```{info} without a `<!-- not run: … -->` reason"
                ));
            }
        }
    }
    assert_eq!(bad, Vec::<String>::new());
}

/// The front page is no crate's docs: its one Rust block is lines of
/// `examples/readme`'s `main.rs` (the whole file is in docs/getting-started.md, kept
/// identical by `tests/readme`), so that the excerpt cannot drift from what CI builds;
/// every other block is marked as what it is (`text`, `toml`).
#[test]
fn the_front_pages_rust_is_lines_of_the_readme_example() {
    let readme = read("README.md");
    let rust: Vec<(usize, String, String)> = fences(&readme)
        .into_iter()
        .filter(|(_, info, _)| is_rust(info))
        .collect();
    assert_eq!(rust.len(), 1, "{rust:?}");
    assert_eq!(
        rust[0].2, "<!-- lines of examples/readme/src/main.rs -->",
        "{rust:?}"
    );
    let main = read("examples/readme/src/main.rs");
    let main: Vec<&str> = main.lines().map(str::trim).collect();
    let shown: Vec<&str> = readme
        .lines()
        .skip(rust[0].0)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    assert!(!shown.is_empty());
    for line in shown {
        assert!(
            main.contains(&line.trim()),
            "README.md shows `{line}`, which examples/readme/src/main.rs does not have"
        );
    }
}
