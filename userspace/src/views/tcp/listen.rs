//! Listen-queue drops of the observed namespaces (issue 45): handshakes a listener never
//! completed because its accept queue was full (`ListenOverflows`) or for any reason
//! (`ListenDrops`, which includes the overflows), from each namespace's `/proc/net/netstat`
//! (`TcpExt:` lines). No BPF program sees them without kprobes. Each namespace's file is opened
//! once at attach from a thread inside it (a /proc/net file stays bound to the namespace it was
//! opened in), so reading it later needs no privilege; counted from attach.
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use crate::sys::netns::{self, NetNs};

/// The namespaces' netstat files and their counts at attach.
pub(super) struct ListenDrops {
    files: Vec<File>,
    base: (u64, u64),
}

impl ListenDrops {
    /// Open each namespace's netstat (one it cannot enter or read is left out: its drops are
    /// not counted).
    pub(super) fn open(namespaces: &[NetNs]) -> ListenDrops {
        let files = namespaces
            .iter()
            .filter_map(|ns| {
                netns::scoped(ns, || Ok(File::open("/proc/thread-self/net/netstat")?)).ok()
            })
            .collect();
        let mut l = ListenDrops {
            files,
            base: (0, 0),
        };
        l.base = l.total();
        l
    }

    /// (ListenOverflows, ListenDrops) summed over the namespaces now.
    fn total(&mut self) -> (u64, u64) {
        let mut sum = (0, 0);
        let mut text = String::new();
        for f in self.files.iter_mut() {
            text.clear();
            if f.seek(SeekFrom::Start(0)).is_err() || f.read_to_string(&mut text).is_err() {
                continue;
            }
            if let Some((o, d)) = parse(&text) {
                sum = (sum.0 + o, sum.1 + d);
            }
        }
        sum
    }

    /// (ListenOverflows, ListenDrops) since attach.
    pub(super) fn since_attach(&mut self) -> (u64, u64) {
        let now = self.total();
        (
            now.0.saturating_sub(self.base.0),
            now.1.saturating_sub(self.base.1),
        )
    }
}

/// ListenOverflows and ListenDrops of a netstat text (a `TcpExt:` line of names, then one of
/// values).
fn parse(text: &str) -> Option<(u64, u64)> {
    let mut tcpext = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (tcpext.next()?, tcpext.next()?);
    let pairs: Vec<(&str, &str)> = names
        .split_whitespace()
        .zip(values.split_whitespace())
        .collect();
    let get = |k: &str| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .and_then(|(_, v)| v.parse().ok())
    };
    Some((get("ListenOverflows")?, get("ListenDrops")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_listen_overflows_and_drops_of_tcpext() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPHPHits\n\
TcpExt: 0 3 5 100\n\
IpExt: InNoRoutes InTruncatedPkts\n\
IpExt: 0 0\n";
        assert_eq!(parse(text), Some((3, 5)));
        assert_eq!(parse("IpExt: A\nIpExt: 1\n"), None);
    }
}
