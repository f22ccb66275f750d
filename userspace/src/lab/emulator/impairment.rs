//! All impairment of one testbed's router: the delay emulator, the loss and queue rules and the
//! bottleneck, set per direction at run time, reported with their counters, removed at the end.
use anyhow::{Context, Result};
use serde::Serialize;

use super::delay::{DelayEmulator, EmulatorStats, DEFAULT_MAX_HELD};
use super::link::{Direction, LinkConfig};
use super::rules::{
    feed, iptables_rules, nft_ruleset, parse_iptables_save, parse_nft_counters, tbf_args, NFT_TABLE,
};
use crate::lab::testbed::{self, Role, Testbed};

/// What the lab changed on the router, with counters read back.
#[derive(Debug, Clone, Serialize)]
pub struct ImpairmentReport {
    pub up: LinkConfig,
    pub down: LinkConfig,
    pub emulator: EmulatorStats,
    /// Packets dropped by the random-loss rules [up, down].
    pub loss_dropped: [u64; 2],
    /// Packets sent to the delay queues [up, down] (by the nft counters).
    pub queued: [u64; 2],
}

/// All impairment of one testbed's router.
pub struct Impairment {
    rtr_ns: String,
    shut: bool,
    cfg: [LinkConfig; 2],
    emu: DelayEmulator,
}

/// NFQUEUE numbers used in the router namespace (its own netns: no clash with other testbeds).
pub const QUEUES: [u16; 2] = [10, 11];

impl Impairment {
    /// Start the emulator in the router namespace of `tb`; the link starts clean.
    pub fn new(tb: &Testbed) -> Result<Self> {
        Self::with_capacity(tb, DEFAULT_MAX_HELD)
    }

    pub fn with_capacity(tb: &Testbed, max_held: usize) -> Result<Self> {
        let emu = DelayEmulator::start(Some(tb.ns_path(Role::Rtr)), QUEUES, max_held)
            .context("starting the delay emulator in the router namespace")?;
        let mut imp = Impairment {
            rtr_ns: tb.ns(Role::Rtr),
            shut: false,
            cfg: Default::default(),
            emu,
        };
        imp.apply_nft()?;
        imp.apply_queue_rules()?;
        Ok(imp)
    }

    pub fn config(&self, dir: Direction) -> LinkConfig {
        self.cfg[dir.idx()]
    }

    /// Set one direction's impairment.
    pub fn set(&mut self, dir: Direction, c: LinkConfig) -> Result<()> {
        c.validate()?;
        let old = self.cfg[dir.idx()];
        // The emulator first, so the queue rule never points at a stale delay.
        self.emu.set(dir, c.delay, c.jitter);
        self.cfg[dir.idx()] = c;
        if old.loss_pct != c.loss_pct {
            self.apply_nft()?;
        }
        if old.needs_queue() != c.needs_queue() {
            self.apply_queue_rules()?;
        }
        if old.rate_bps != c.rate_bps || old.queue_limit != c.queue_limit {
            self.apply_tbf(dir)?;
        }
        Ok(())
    }

    /// Set both directions to the same impairment.
    pub fn set_both(&mut self, c: LinkConfig) -> Result<()> {
        self.set(Direction::Up, c)?;
        self.set(Direction::Down, c)
    }

    fn apply_nft(&mut self) -> Result<()> {
        feed(&self.rtr_ns, &["nft", "-f", "-"], &nft_ruleset(&self.cfg))
            .context("loading the loss rules into the router")
    }

    fn apply_queue_rules(&mut self) -> Result<()> {
        let rules = iptables_rules(&self.cfg, QUEUES);
        feed(&self.rtr_ns, &["iptables-restore"], &rules)
            .context("loading the delay-queue rules into the router (iptables)")?;
        feed(&self.rtr_ns, &["ip6tables-restore"], &rules)
            .context("loading the delay-queue rules into the router (ip6tables)")
    }

    fn apply_tbf(&mut self, dir: Direction) -> Result<()> {
        let c = self.cfg[dir.idx()];
        let dev = dir.egress_if();
        match c.rate_bps {
            Some(rate) => {
                let mut args: Vec<String> = ["tc", "qdisc", "replace", "dev", dev, "root"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                args.extend(tbf_args(rate, c.queue_limit));
                let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
                testbed::run_in(&self.rtr_ns, &a).context("setting the bottleneck (tbf)")?;
            }
            None => {
                // Back to the default qdisc; no error if there was none of ours.
                let _ = testbed::run_in(&self.rtr_ns, &["tc", "qdisc", "del", "dev", dev, "root"]);
            }
        }
        Ok(())
    }

    /// Configuration and counters now.
    pub fn report(&self) -> ImpairmentReport {
        let (loss, queued) = self.nft_counters().unwrap_or_default();
        ImpairmentReport {
            up: self.cfg[0],
            down: self.cfg[1],
            emulator: self.emu.stats(),
            loss_dropped: loss,
            queued,
        }
    }

    pub fn emulator(&self) -> &DelayEmulator {
        &self.emu
    }

    /// Stop only the emulator thread, leaving the steering rules in place
    /// (what a crash does); `--queue-bypass` then passes packets undelayed.
    pub fn stop_emulator(&mut self) -> Result<()> {
        self.emu.stop()
    }

    /// Read the rule counters: (loss drops, queued) per direction.
    fn nft_counters(&self) -> Result<([u64; 2], [u64; 2])> {
        let out = testbed::run_in(
            &self.rtr_ns,
            &["nft", "-j", "list", "table", "inet", NFT_TABLE],
        )?;
        let loss = parse_nft_counters(&String::from_utf8_lossy(&out.stdout));
        let mut queued = [0u64; 2];
        for prog in ["iptables-save", "ip6tables-save"] {
            let out = testbed::run_in(&self.rtr_ns, &[prog, "-c", "-t", "mangle"])?;
            let q = parse_iptables_save(&String::from_utf8_lossy(&out.stdout), QUEUES);
            queued[0] += q[0];
            queued[1] += q[1];
        }
        Ok((loss, queued))
    }

    /// Stop the emulator and remove the rules and qdiscs (the testbed's
    /// namespace removal would also remove them).
    pub fn shutdown(&mut self) -> Result<()> {
        if self.shut {
            return Ok(());
        }
        self.shut = true;
        // Emulator last: until the steering rules are gone it keeps the delay.
        let _ = testbed::run_in(&self.rtr_ns, &["nft", "delete", "table", "inet", NFT_TABLE]);
        let old = std::mem::take(&mut self.cfg);
        let _ = self.apply_queue_rules();
        for d in Direction::BOTH {
            if old[d.idx()].rate_bps.is_some() {
                let _ = testbed::run_in(
                    &self.rtr_ns,
                    &["tc", "qdisc", "del", "dev", d.egress_if(), "root"],
                );
            }
        }
        self.cfg = Default::default();
        self.emu.stop()
    }
}

impl Drop for Impairment {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
