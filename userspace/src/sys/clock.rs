//! The clocks, read in one place: CLOCK_MONOTONIC (what `Instant`, the
//! kernel programs' `bpf_ktime_get_ns()` and timerfd use) and CLOCK_REALTIME,
//! as plain nanosecond numbers.

fn read(id: libc::clockid_t) -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn mono_ns() -> u64 {
    let ts = read(libc::CLOCK_MONOTONIC);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_REALTIME in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> i64 {
    let ts = read(libc::CLOCK_REALTIME);
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC in nanoseconds: add it to a monotonic time for its Unix
/// time. Read as a monotonic, realtime, monotonic triple, the tightest of five (a triple the
/// scheduler interrupted would be off by the interruption).
pub fn realtime_minus_mono_ns() -> i64 {
    let mut best = (u64::MAX, 0i64);
    for _ in 0..5 {
        let a = mono_ns();
        let r = realtime_ns();
        let b = mono_ns();
        let mid = a + (b - a) / 2;
        if b - a < best.0 {
            best = (b - a, r - mid as i64);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    #[test]
    fn monotonic_moves_forward_and_realtime_is_recent() {
        let a = super::mono_ns();
        let b = super::mono_ns();
        assert!(b >= a);
        // After 2020-01-01.
        assert!(super::realtime_ns() > 1_577_836_800_000_000_000);
    }

    #[test]
    fn realtime_minus_mono_maps_now_to_now() {
        let off = super::realtime_minus_mono_ns();
        let mapped = super::mono_ns() as i64 + off;
        let real = super::realtime_ns();
        assert!((real - mapped).abs() < 50_000_000, "{real} vs {mapped}");
    }
}
