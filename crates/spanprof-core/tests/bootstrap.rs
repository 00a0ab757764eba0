//! Checks that the committed `src/pprof/proto.rs` is what prost-build generates
//! from `proto/profile.proto`, so the two cannot drift apart.
//!
//! To regenerate the committed file after changing the schema (or after a
//! prost-build upgrade changes its output), run:
//!
//! ```text
//! SPANPROF_BLESS=1 cargo test -p spanprof-core --test bootstrap
//! ```

use std::fs;
use std::path::{Path, PathBuf};

/// The file prost-build writes for `package perftools.profiles;`.
const GENERATED_NAME: &str = "perftools.profiles.rs";

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles the schema with protox (no `protoc` needed) and runs prost-build on
/// the descriptors into `out_dir`; returns the generated source.
fn generate(out_dir: &Path) -> String {
    let proto_dir = manifest_dir().join("proto");
    let fds = protox::compile(["profile.proto"], [&proto_dir])
        .unwrap_or_else(|e| panic!("protox failed to compile {}: {e}", proto_dir.display()));
    prost_build::Config::new()
        .out_dir(out_dir)
        .compile_fds(fds)
        .expect("prost-build failed to generate code");
    let path = out_dir.join(GENERATED_NAME);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn generated_pprof_proto_is_up_to_date() {
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("spanprof-pprof-bootstrap");
    let _ = fs::remove_dir_all(&out_dir);
    fs::create_dir_all(&out_dir).expect("creating the output directory");
    let generated = generate(&out_dir);

    let committed_path = manifest_dir().join("src/pprof/proto.rs");
    let committed = fs::read_to_string(&committed_path).unwrap_or_default();

    if committed == generated {
        return;
    }
    if std::env::var_os("SPANPROF_BLESS").is_some_and(|v| !v.is_empty() && v != "0") {
        fs::write(&committed_path, &generated)
            .unwrap_or_else(|e| panic!("writing {}: {e}", committed_path.display()));
        eprintln!("rewrote {}", committed_path.display());
        return;
    }
    let first_diff = committed
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .map_or_else(
            || "one file is a prefix of the other".to_owned(),
            |i| format!("first difference at line {}", i + 1),
        );
    panic!(
        "{} is out of date with proto/profile.proto ({first_diff}).\n\
         Regenerate it with:\n\n    \
         SPANPROF_BLESS=1 cargo test -p spanprof-core --test bootstrap\n\n\
         and commit the result. Do not edit the generated file by hand.",
        committed_path.display()
    );
}
