//! The committed Pyroscope push types match what prost-build generates now from
//! `proto/` (`SPANPROF_BLESS=1` rewrites them), so builds need no `protoc`.

use std::path::Path;

#[test]
fn generated_pyroscope_push_code_is_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fds = protox::compile(
        [root.join("proto/push/v1/push.proto")],
        [root.join("proto")],
    )
    .expect("compile push.proto");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pyroscope-gen");
    std::fs::create_dir_all(&out).unwrap();
    prost_build::Config::new()
        .out_dir(&out)
        .compile_fds(fds)
        .expect("generate");
    let mut stale = Vec::new();
    for file in ["push.v1.rs", "types.v1.rs"] {
        let fresh = std::fs::read_to_string(out.join(file)).unwrap();
        let committed_path = root.join("src/gen").join(file);
        let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
        if fresh != committed {
            if std::env::var_os("SPANPROF_BLESS").is_some() {
                std::fs::write(&committed_path, &fresh).unwrap();
            } else {
                stale.push(file);
            }
        }
    }
    assert!(
        stale.is_empty(),
        "src/gen/{stale:?} stale; regenerate with \
         `SPANPROF_BLESS=1 cargo test -p spanprof-export --test bootstrap`"
    );
}
