//! Accepting connections as hyper-util's and `axum::serve`'s loops do: an accept
//! error (out of file descriptors, say) is logged — at most once a second, with the
//! number left out — and retried after a backoff (5 ms doubling to 1 s), instead of
//! ending the accept loop and leaving the port dead while the process lives on.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};

/// First wait after an accept error.
pub const MIN_BACKOFF: Duration = Duration::from_millis(5);
/// Longest wait between accept attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A listener whose `accept` never gives up.
#[derive(Debug)]
pub struct Acceptor {
    listener: TcpListener,
    service: &'static str,
    backoff: Duration,
    errors: u64,
    logged_at: Option<Instant>,
    not_logged: u64,
}

impl Acceptor {
    /// Accepts on `listener` for `service` (named in the logs).
    pub fn new(listener: TcpListener, service: &'static str) -> Self {
        Acceptor {
            listener,
            service,
            backoff: MIN_BACKOFF,
            errors: 0,
            logged_at: None,
            not_logged: 0,
        }
    }

    /// The next connection; errors are logged and retried.
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok(conn) => {
                    self.backoff = MIN_BACKOFF;
                    return conn;
                }
                // The peer gave up before we accepted: nothing wrong here.
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    self.errors += 1;
                    self.log(&e);
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// Accept errors so far.
    pub fn errors(&self) -> u64 {
        self.errors
    }

    fn log(&mut self, e: &io::Error) {
        let now = Instant::now();
        if self
            .logged_at
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            self.not_logged += 1;
            return;
        }
        tracing::warn!(
            errors = self.errors,
            not_logged = self.not_logged,
            "{}: accept failed: {e}; retrying in {:?}",
            self.service,
            self.backoff
        );
        self.logged_at = Some(now);
        self.not_logged = 0;
    }

    /// The connections as a stream (for `tonic`'s `serve_with_incoming`).
    pub fn into_stream(self) -> impl futures_util::Stream<Item = io::Result<TcpStream>> {
        futures_util::stream::unfold(self, |mut a| async move {
            let (io, _) = a.accept().await;
            Some((Ok(io), a))
        })
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
