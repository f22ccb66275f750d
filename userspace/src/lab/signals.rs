//! Ctrl-C / SIGTERM / SIGHUP handling for the lab: the first signal sets a
//! flag that every loop of the run checks (the run then returns an error and
//! the guards — emulator, testbed — clean up as they drop); a second signal
//! gets the default action (the next start removes what is left).
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static CANCELLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    CANCELLED.store(true, Ordering::SeqCst);
    // Second signal: default action. Restoring it is async-signal-safe.
    if let Ok(s) = Signal::try_from(sig) {
        let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
        // SAFETY: installing SIG_DFL.
        let _ = unsafe { sigaction(s, &dfl) };
    }
}

/// Install the handlers (idempotent).
pub fn install() -> anyhow::Result<()> {
    let act = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores into an atomic and calls sigaction.
        unsafe { sigaction(s, &act) }
            .map_err(|e| anyhow::anyhow!("installing the {s} handler: {e}"))?;
    }
    Ok(())
}

/// Has a stop signal arrived?
pub fn cancelled() -> bool {
    CANCELLED.load(Ordering::SeqCst)
}

/// `Err("interrupted")` once a stop signal has arrived.
pub fn check() -> anyhow::Result<()> {
    if cancelled() {
        anyhow::bail!("interrupted (the testbed was removed)");
    }
    Ok(())
}

/// Sleep up to `d`, waking early (with an error) when cancelled.
pub fn sleep(d: std::time::Duration) -> anyhow::Result<()> {
    let end = std::time::Instant::now() + d;
    loop {
        check()?;
        let now = std::time::Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(std::time::Duration::from_millis(50)));
    }
}
