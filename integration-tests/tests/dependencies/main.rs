//! What a service builds when it adds spanprof: beside `opentelemetry-otlp` 0.33 (whose
//! HTTP exporter uses reqwest 0.13) no second reqwest, and TLS only when asked for.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The versions of `package` in the workspace's lock file, which holds every
/// member's dependencies (the checkout example uses opentelemetry-otlp's HTTP
/// exporter and spanprof's sinks).
fn locked_versions(package: &str) -> Vec<String> {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).unwrap();
    lock.split("[[package]]")
        .filter(|p| p.contains(&format!("\nname = \"{package}\"\n")))
        .filter_map(|p| {
            p.lines()
                .find_map(|l| l.strip_prefix("version = \""))
                .map(|v| v.trim_end_matches('"').to_owned())
        })
        .collect()
}

#[test]
fn one_reqwest_is_built_beside_opentelemetry_otlp() {
    assert_eq!(locked_versions("opentelemetry-otlp").len(), 1);
    let reqwest = locked_versions("reqwest");
    assert!(reqwest.len() <= 1, "reqwest versions: {reqwest:?}");
}

/// The crates spanprof-export builds (normal dependencies) with `features`.
fn export_tree(features: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root())
        .args([
            "tree",
            "--offline",
            "-p",
            "spanprof-export",
            "--no-default-features",
        ])
        .args(["--features", features, "-e", "normal", "--prefix", "none"])
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn tls_is_built_only_with_the_tls_feature() {
    let plain = export_tree("pyroscope,otlp");
    let tls: Vec<&String> = plain.iter().filter(|c| c.contains("rustls")).collect();
    assert!(
        tls.is_empty(),
        "TLS crates without the tls feature: {tls:?}"
    );
    let with = export_tree("pyroscope,otlp,tls");
    assert!(with.iter().any(|c| c == "rustls"), "{with:?}");
}
