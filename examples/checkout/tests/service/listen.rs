//! `--listen 0.0.0.0:…` exposes the API only: the viewer and the profile endpoint
//! have their own loopback listener, the backends stay on loopback, and the logs
//! (on stderr, no colour codes when it is not a terminal) say so.

use std::time::Duration;

use crate::support::{Example, get};

#[test]
fn a_public_listen_address_exposes_the_api_only() {
    let mut ex = Example::spawn(
        &[
            "--listen",
            "0.0.0.0:0",
            "--viewer",
            "127.0.0.1:0",
            "--load",
            "0",
        ],
        &[("RUST_LOG", "info")],
    );
    let (api, inventory, payments) = ex.addresses();
    let viewer = ex.viewer_url(Duration::from_secs(60));
    let mut wrong = Vec::new();
    if !api.ip().is_unspecified() {
        wrong.push(format!("the API is not on 0.0.0.0: {api}"));
    }
    if !inventory.ip().is_loopback() || !payments.ip().is_loopback() {
        wrong.push(format!(
            "backends not on loopback: inventory {inventory}, payments {payments}"
        ));
    }
    if !viewer.starts_with("http://127.0.0.1:") {
        wrong.push(format!("the viewer is not on loopback: {viewer}"));
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let public = format!("http://127.0.0.1:{}", api.port());
        assert_eq!(get(&format!("{public}/health")).await.unwrap().0, 200);
        for path in [
            "/debug/spanprof/",
            "/debug/spanprof/api/traces",
            "/debug/spanprof/profile?seconds=0",
        ] {
            let (status, _) = get(&format!("{public}{path}")).await.unwrap();
            if status != 404 {
                wrong.push(format!(
                    "{path} is served on the public listener ({status})"
                ));
            }
        }
        let (status, _) = get(&viewer).await.unwrap();
        assert_eq!(status, 200, "the viewer at {viewer}");
        let (status, body) = get(&format!("{viewer}profile?seconds=0")).await.unwrap();
        assert_eq!(
            status, 400,
            "the profile endpoint beside the viewer: {body}"
        );
    });
    let (out, err) = (ex.stdout(), ex.stderr());
    if !(err.contains("WARN") && err.contains("0.0.0.0") && err.contains("loopback")) {
        wrong.push(format!(
            "no warning on stderr about the public address:\n{err}"
        ));
    }
    if out.contains('\x1b') || err.contains('\x1b') {
        wrong.push(format!(
            "terminal escape codes in piped output:\n{out:?}\n{err:?}"
        ));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
