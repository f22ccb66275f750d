//! What both views' aya loaders share: error chains on one line and the
//! ring-buffer source.
use std::os::fd::{AsRawFd, RawFd};

use anyhow::Result;
use aya::maps::{MapData, RingBuf};

use super::RingSource;

/// An error and its causes on one line (aya's errors keep the errno and the
/// verifier log in their sources). Multi-line parts (a verifier log) are cut
/// to their first line here and logged whole, shown with -v (as libbpf's log).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    while let Some(c) = cur {
        let cs = c.to_string();
        if !parts.iter().any(|p| p.contains(&cs)) {
            parts.push(cs);
        }
        cur = c.source();
    }
    let full = parts.join(": ");
    if !full.contains('\n') {
        return full;
    }
    tracing::info!(target: "aya", "{full}");
    let short: Vec<&str> = parts
        .iter()
        .map(|p| {
            p.lines()
                .next()
                .unwrap_or("")
                .trim_end_matches(['.', ':', ' '])
        })
        .collect();
    format!("{} (details with -v)", short.join(": "))
}

/// A ring buffer loaded by aya (TCP view and sampler).
pub(crate) struct AyaRing(pub(crate) RingBuf<MapData>);

impl RingSource for AyaRing {
    fn poll_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
    fn drain(&mut self, f: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let mut n = 0;
        while let Some(item) = self.0.next() {
            f(&item);
            n += 1;
        }
        Ok(n)
    }
}
