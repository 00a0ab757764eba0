//! One stop signal the shop's parts wait on: the load generator stops sending, the
//! servers stop accepting and finish what is in flight.

use tokio::sync::watch;

/// Triggers a [`Stop`].
#[derive(Debug)]
pub struct StopTrigger(watch::Sender<bool>);

/// Waits for a [`StopTrigger`]; cheap to clone.
#[derive(Debug, Clone)]
pub struct Stop(watch::Receiver<bool>);

/// A new stop signal and its trigger.
pub fn channel() -> (StopTrigger, Stop) {
    let (tx, rx) = watch::channel(false);
    (StopTrigger(tx), Stop(rx))
}

impl StopTrigger {
    /// Stops everything waiting on the signal.
    pub fn stop(&self) {
        self.0.send_replace(true);
    }
}

impl Stop {
    /// A signal that never fires.
    pub fn never() -> Stop {
        channel().1
    }

    /// Whether it fired.
    pub fn is_stopped(&self) -> bool {
        *self.0.borrow()
    }

    /// Completes when it fires (never, if its trigger was dropped unfired).
    pub async fn stopped(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|stopped| *stopped).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
