//! The front page's "Using it", run as a user would: it starts, serves `/hash`, lists
//! its traces in the viewer, answers `go tool pprof`'s endpoint and stops on Ctrl-C
//! (SIGINT), without one warning.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One HTTP/1.1 GET over a new connection: (status, body).
fn get(url: &str) -> (u16, String) {
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut s = TcpStream::connect(host).unwrap_or_else(|e| panic!("{url}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

fn collect(stream: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let out = Arc::new(Mutex::new(String::new()));
    let into = out.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let mut s = into.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    out
}

struct Service {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Service {
    /// The URL printed on the line starting with `prefix`.
    fn url(&mut self, prefix: &str) -> String {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.stdout.lock().unwrap().clone();
            if let Some(line) = out.lines().find(|l| l.starts_with(prefix)) {
                return line
                    .split_whitespace()
                    .find(|w| w.starts_with("http://"))
                    .expect("a URL")
                    .to_owned();
            }
            assert!(
                self.child.try_wait().unwrap().is_none() && Instant::now() < end,
                "no `{prefix}` line:\n{out}\n{}",
                self.stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_readme_service_serves_profiles_and_stops_on_ctrl_c_without_a_warning() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_readme"))
        .env("ADDR", "127.0.0.1:0")
        .env("VIEWER_ADDR", "127.0.0.1:0")
        .env_remove("RUST_LOG")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_SERVICE_NAME")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the readme example");
    let stdout = collect(child.stdout.take().unwrap());
    let stderr = collect(child.stderr.take().unwrap());
    let mut service = Service {
        child,
        stdout,
        stderr,
    };
    let viewer = service.url("viewer");
    let hash = service.url("service");
    for _ in 0..3 {
        let (status, body) = get(&hash);
        assert_eq!((status, body.trim().len()), (200, 16), "{body}");
    }
    let end = Instant::now() + Duration::from_secs(30);
    let traces = loop {
        let (status, body) = get(&format!("{viewer}api/traces"));
        if (status == 200 && body.contains("\"root\":\"request\"")) || Instant::now() > end {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // tower-http's TraceLayer names its spans `request`.
    assert!(traces.contains("\"root\":\"request\""), "{traces}");
    let (status, _) = get(&format!("{viewer}profile?seconds=1"));
    assert_eq!(status, 200);

    let pid = service.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-s", "INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let end = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = service.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "still running 30 s after SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(200));
    let err = service.stderr.lock().unwrap().clone();
    assert!(status.success(), "exit {status}\n{err}");
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .filter(|l| cfg!(tokio_unstable) || !l.contains("tokio_unstable"))
        .collect();
    assert_eq!(warnings, Vec::<&str>::new(), "\n{err}");
}
