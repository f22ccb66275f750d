//! Link impairment on the lab's router: delay + jitter, random loss, and a
//! bottleneck rate with a queue limit, per direction, changeable at run time.
//!
//! The kernel here has no `netem` (KERNEL.md), so:
//!
//! - **Delay and jitter** come from our own emulator: rules in the router
//!   namespace's mangle FORWARD chain send each direction's forwarded
//!   packets to its own NFQUEUE (`-j NFQUEUE --queue-num N --queue-bypass`;
//!   iptables, because this kernel lacks the nftables `queue` expression,
//!   CONFIG_NFT_QUEUE, but has the xtables target); a thread of this process, which has
//!   `setns()`'d into the router namespace, receives each packet's id
//!   (metadata only, no payload copy) and issues the ACCEPT verdict when the
//!   packet is due. `bypass` means that if the emulator is gone (crash), the
//!   kernel accepts the packets instead of dropping them: the link loses its
//!   delay but never black-holes. We do *not* set fail-open: when the
//!   kernel's queue is full, packets are dropped (as a real bounded queue
//!   would) and counted by the kernel (`queue_dropped`).
//! - Packet order is kept when jitter is 0 (each release time is at least the
//!   previous one, also across a delay decrease); with jitter, packets are
//!   released in due order and may be reordered, as with netem.
//! - The emulator holds at most `max_held` packets per direction; a packet
//!   arriving at a full queue is dropped at once and counted (`dropped_full`).
//! - **Loss**: `numgen random mod 10000 < pct*100 counter drop` in our
//!   nftables table `inet rttscope_lab` at forward priority -200, before the
//!   queue rules at -150 (drops are counted by the rule).
//! - **Bottleneck**: `tbf rate R burst B limit L` as the root qdisc of the
//!   router's egress interface of that direction; a deep `limit` makes a
//!   standing queue (bufferbloat).
//!
//! Why a thread and not a child process: run-time changes (the rtt-step
//! scenario) are a store into shared state, statistics are read directly,
//! and the thread dies with the process, after which `bypass` keeps the
//!
//! The parts: [`link`] (a direction and its impairment), [`delay`] (the emulator thread),
//! [`rules`] (nftables, iptables, tbf), [`impairment`] (all of it for one router).
mod delay;
mod impairment;
mod link;
mod rules;

pub use delay::{DelayEmulator, DirStats, EmulatorStats, DEFAULT_MAX_HELD, RT_PRIORITY};
pub use impairment::{Impairment, ImpairmentReport, QUEUES};
pub use link::{Direction, LinkConfig};
pub use rules::{
    iptables_rules, nft_ruleset, parse_iptables_save, parse_nft_counters, tbf_args, NFT_TABLE,
};
