//! A raw HTTP/1 client over loopback (so a test sets any `Host` and `Origin`, or
//! none) and the viewer served on its real listener.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use spanprof_core::Profiler;
use spanprof_viewer::{Exposure, RecentSpans, Viewer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An answer: status, headers (names lowercased) and body (lossy text).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// The value of header `name`, if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The profiler of this test process.
pub fn profiler() -> Profiler {
    Profiler::current_or_start().expect("profiler")
}

/// `viewer` served with [`spanprof_viewer::serve`] on a free loopback port.
pub async fn serve(viewer: Viewer) -> SocketAddr {
    spanprof_viewer::serve(
        viewer,
        "127.0.0.1:0".parse().unwrap(),
        Exposure::LoopbackOnly,
    )
    .await
    .expect("serve")
}

/// A viewer over this process's profiler with no spans recorded.
pub fn viewer() -> Viewer {
    Viewer::new(profiler(), RecentSpans::new(10))
}

/// Sends `METHOD target` as HTTP/1.1 with exactly `headers` (add `Host` yourself)
/// and `Connection: close`, and reads the whole answer.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let mut head = format!("{method} {target} HTTP/1.1\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("Connection: close\r\n\r\n");
    exchange(addr, head).await
}

/// `GET target` with `Host` set to `host` and the other `headers`.
pub async fn get(addr: SocketAddr, target: &str, host: &str, headers: &[(&str, &str)]) -> Answer {
    let mut all = vec![("Host", host)];
    all.extend_from_slice(headers);
    request(addr, "GET", target, &all).await
}

/// Writes `head` as it is (a request of any shape) and reads the answer to its end.
pub async fn exchange(addr: SocketAddr, head: String) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    parse(&raw)
}

fn parse(raw: &[u8]) -> Answer {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body = String::from_utf8_lossy(&raw[end + 4..]).into_owned();
    Answer {
        status,
        headers,
        body,
    }
}

/// Fails if `answer` carries any CORS header.
#[track_caller]
pub fn assert_no_cors(answer: &Answer) {
    let cors: Vec<_> = answer
        .headers
        .iter()
        .filter(|(n, _)| n.starts_with("access-control-"))
        .collect();
    assert!(cors.is_empty(), "CORS headers sent: {cors:?}");
}

/// Fails unless `answer` has `status`, showing the body otherwise.
#[track_caller]
pub fn assert_status(answer: &Answer, status: u16, what: &str) {
    assert_eq!(
        answer.status, status,
        "{what}: {} {:?}",
        answer.status, answer.body
    );
}

/// Waits at most `limit` for `f`, failing with `what` past it.
pub async fn within<T>(limit: Duration, what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {limit:?}"))
}
