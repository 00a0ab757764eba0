//! What a new user sees first: the example starts, idles (its health probes run
//! every second), serves a few requests and stops without one warning.

use std::time::Duration;

use crate::support::{Example, checkout, get};

/// Warning and error lines of the example's log (stderr), leaving out the one that
/// is right on a build without `--cfg tokio_unstable` (the second pass of the suite
/// builds so on purpose).
fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .filter(|l| cfg!(tokio_unstable) || !l.contains("tokio_unstable"))
        .collect()
}

#[test]
fn the_example_starts_idles_serves_and_stops_with_no_warning() {
    let mut ex = Example::spawn(&["--listen", "127.0.0.1:0", "--load", "0"], &[]);
    let (api, _, _) = ex.addresses();
    ex.viewer_url(Duration::from_secs(60));
    // Idle long enough for a few of the once-a-second health probes of the backends.
    std::thread::sleep(Duration::from_millis(3500));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for i in 0..3 {
            let (status, body) = checkout(api, i).await.unwrap();
            assert_eq!(status, 200, "{body}");
            let (status, body) = get(&format!("http://{api}/cart/{i}")).await.unwrap();
            assert_eq!(status, 200, "{body}");
        }
    });
    ex.signal("TERM");
    let status = ex.wait(Duration::from_secs(30));
    let (out, err) = (ex.stdout(), ex.stderr());
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?}\n{out}\n{err}"
    );
    assert_eq!(warnings(&err), Vec::<&str>::new(), "\n{out}\n{err}");
    // A correct set-up says how it runs: the profiler's rates and mechanism, once.
    let started: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(" INFO ") && l.contains("spanprof: profiler started"))
        .collect();
    assert_eq!(started.len(), 1, "\n{err}");
    assert!(started[0].contains("99 Hz baseline"), "{}", started[0]);
}

/// Calls of a method inventory does not serve are the client's error, not the
/// server's: answered `Unimplemented`, and not one ERROR line each.
#[test]
fn unknown_grpc_methods_do_not_flood_the_log() {
    let mut ex = Example::spawn(&["--listen", "127.0.0.1:0", "--load", "0"], &[]);
    let (_, inventory, _) = ex.addresses();
    ex.viewer_url(Duration::from_secs(60));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{inventory}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut grpc = tonic::client::Grpc::new(channel);
        for i in 0..200 {
            grpc.ready().await.unwrap();
            let path = format!("/inventory.Inventory/Refund{}", i % 7);
            let reply: Result<tonic::Response<checkout::proto::ReserveReply>, tonic::Status> = grpc
                .unary(
                    tonic::Request::new(checkout::proto::ReserveRequest::default()),
                    http::uri::PathAndQuery::try_from(path).unwrap(),
                    tonic_prost::ProstCodec::default(),
                )
                .await;
            assert_eq!(reply.unwrap_err().code(), tonic::Code::Unimplemented);
        }
    });
    ex.signal("TERM");
    let status = ex.wait(Duration::from_secs(30));
    let (out, err) = (ex.stdout(), ex.stderr());
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?}\n{out}\n{err}"
    );
    let lines = warnings(&err);
    assert!(
        lines.is_empty(),
        "{} warning and error lines, the first: {:?}",
        lines.len(),
        lines.first()
    );
}
