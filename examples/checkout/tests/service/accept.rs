//! Running out of file descriptors does not take the payments port away: accept
//! errors are logged and retried, and checkouts work again once descriptors free up.

use std::time::Duration;

use crate::support::{Example, checkout, get};

#[test]
fn payments_keep_accepting_after_running_out_of_file_descriptors() {
    let mut ex =
        Example::spawn_with_nofile(NOFILE, &["--listen", "127.0.0.1:0", "--load", "0"], &[]);
    let (api, _, payments) = ex.addresses();
    ex.viewer_url(Duration::from_secs(60));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for i in 0..3 {
            assert_eq!(checkout(api, i).await.unwrap().0, 200);
        }
        // Connections the payments service accepts until its descriptors run out;
        // the rest wait in the listen backlog.
        let mut held = Vec::new();
        for _ in 0..NOFILE + 100 {
            match tokio::net::TcpStream::connect(payments).await {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        drop(held);
        tokio::time::sleep(Duration::from_secs(3)).await;
    });
    rt.block_on(async {
        // Many at once, so the API needs new connections to payments.
        let results = futures_util::future::join_all((0..25).map(|i| checkout(api, 100 + i))).await;
        let failed: Vec<_> = results
            .iter()
            .filter(|r| !matches!(r, Ok((s, _)) if *s == 200))
            .collect();
        assert!(
            failed.is_empty(),
            "{} of 25 checkouts failed: {failed:?}",
            failed.len()
        );
        let (status, body) = get(&format!("http://{payments}/health"))
            .await
            .expect("the payments port accepts new connections again");
        assert_eq!(status, 200, "{body}");
    });
    // The condition was real, and logged.
    let err = ex.stderr();
    assert!(
        err.contains("accept") && err.contains("Too many open files"),
        "the payments service ran out of descriptors and said so:\n{err}"
    );
}

/// The open-file limit of the example under test.
const NOFILE: u32 = 256;
