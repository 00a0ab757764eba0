//! The committed gRPC code of `proto/inventory.proto` matches what the generator
//! produces now (`SPANPROF_BLESS=1` rewrites it), so builds need no `protoc`.

use std::path::Path;

#[test]
fn generated_inventory_grpc_code_is_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fds = protox::compile([root.join("proto/inventory.proto")], [root.join("proto")])
        .expect("compile inventory.proto");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("inventory-gen");
    std::fs::create_dir_all(&out).unwrap();
    tonic_prost_build::configure()
        .build_transport(false)
        .out_dir(&out)
        .compile_fds(fds)
        .expect("generate");
    let fresh = std::fs::read_to_string(out.join("inventory.rs")).unwrap();
    let committed_path = root.join("src/inventory_proto.rs");
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    if fresh != committed {
        if std::env::var_os("SPANPROF_BLESS").is_some() {
            std::fs::write(&committed_path, &fresh).unwrap();
            return;
        }
        panic!(
            "src/inventory_proto.rs is stale; regenerate with \
             `SPANPROF_BLESS=1 cargo test -p checkout --test bootstrap`"
        );
    }
}
