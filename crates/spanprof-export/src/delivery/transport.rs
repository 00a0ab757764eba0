//! What a network sink implements to send one payload.

use std::future::Future;
use std::pin::Pin;

use super::SendError;

/// A boxed send future.
pub type SendFuture<'a> = Pin<Box<dyn Future<Output = Result<(), SendError>> + Send + 'a>>;

/// Sends one payload. Implemented by each network sink.
pub trait Transport: Send + Sync + 'static {
    /// Sends `payload` once.
    fn send<'a>(&'a self, payload: &'a [u8]) -> SendFuture<'a>;
}
