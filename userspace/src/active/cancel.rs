//! Cancellation of a probe or a server: a watch channel, and the Ctrl-C /
//! SIGTERM hook that sets it; the single-threaded runtime they run on.
use anyhow::{Context, Result};

/// Cancellation: a run stops when the value becomes `true`. Dropping the
/// sender does not cancel.
pub type Cancel = tokio::sync::watch::Receiver<bool>;

/// A (sender, receiver) pair for [`Cancel`].
pub fn cancel_pair() -> (tokio::sync::watch::Sender<bool>, Cancel) {
    tokio::sync::watch::channel(false)
}

/// Resolves when cancelled; never if the sender is gone without cancelling.
pub async fn cancelled(c: &mut Cancel) {
    if c.wait_for(|v| *v).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Cancel on Ctrl-C or SIGTERM.
pub fn on_signals(tx: tokio::sync::watch::Sender<bool>) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => return,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = tx.send(true);
    });
}

pub fn runtime() -> Result<tokio::runtime::Runtime> {
    // One thread: the probe's transactions are sequential, and a single
    // thread keeps wake-ups on the syscall path (no cross-thread hand-off).
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
