//! The fine-histogram pool, read once for both views and both loaders.
//!
//! Kernel side: `bpf/rttscope.h` (`rttscope_fine_get`). A flow's 1,280-bucket
//! histogram is not kept per flow in the kernel: in each pool generation,
//! the flows that have samples take an entry of that generation's half of the
//! view's pool (an mmapable array), and userspace, at each read, starts the
//! next generation (the other half), waits for programs still running on the
//! old one, copies the old half's entries out into each flow's cumulative
//! histogram kept here (sparse: a flow fills a few buckets), and zeroes them.
//! The views then hand out the same cumulative per-flow histograms as before
//! (`TcpFlowState::counts`, `SamplerFlowStats::hist`), so everything above
//! the views is unchanged. Memory: docs/metrics.md, "Kernel memory".
use crate::sys::mmap::Mapping;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::bpf::{consts, FineHist, FineOverflow};
use crate::views::loader::Object;
use crate::views::RingSource;

/// Maps keyed by kernel table positions (slot or way, and its
/// generation), which no remote peer chooses: hashed with foldhash, not
/// std's SipHash (which took ~10% of each read at 100,000 flows). Maps keyed
/// by addresses keep SipHash.
pub type SlotMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// How long to wait after the switch where the kernel cannot wait for the
/// programs itself (see `wait_for_programs`).
const GRACE: Duration = Duration::from_millis(5);

/// Wait until no program that may have read the old generation is still
/// running. tc and sock_ops programs run inside an RCU read-side critical
/// section, and `membarrier(MEMBARRIER_CMD_GLOBAL)` is `synchronize_rcu()`:
/// it returns once every such section that began before it has ended,
/// including one preempted in process context (sock_ops on a PREEMPT
/// kernel, where a fixed wait would not be a bound). ~8 ms here. Where the
/// kernel refuses it (nohz_full CPUs: EINVAL), GRACE: the programs run in
/// microseconds, and softirq context is not preempted.
pub(crate) fn wait_for_programs() {
    const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
    // SAFETY: membarrier(2) takes no pointers.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
    if r != 0 {
        std::thread::sleep(GRACE);
    }
}

/// The pool's maps, the same in both objects (bpf/fine_pool.bpf.h).
pub(crate) const POOL: &str = "fine_pool";
const CTL: &str = "fine_pool_ctl";
pub(crate) const OVERFLOW: &str = "fine_ring";

/// Fine histograms per half of a view's pool for a table of `flows`
/// entries: every flow when the table is small (up to 256), else one in
/// 16 (1,024 at the default 16,384), at most 4,096 (40 MiB a view), so that
/// kernel memory stays under ~1 KiB per tracked flow. The samples of more
/// flows with samples between two reads go through the overflow ring.
pub fn pool_entries(flows: u32) -> u32 {
    flows.min((flows / 16).clamp(256, 4096)).max(1)
}

/// Bytes of kernel memory of one view's pool of `entries` per half.
pub fn pool_bytes(entries: u32) -> u64 {
    2 * entries as u64 * std::mem::size_of::<FineHist>() as u64
}

/// One flow's histogram as read so far (cumulative), and its min/max in the
/// current report interval.
#[derive(Debug, Clone, Default)]
pub struct FineAcc {
    /// Non-empty buckets, ascending.
    buckets: crate::analysis::hist::Buckets,
    pub count: u64,
    pub sum_us: u64,
    pub min_us: u32,
    pub max_us: u32,
    /// Report interval the interval min/max belong to.
    interval: u32,
    interval_min_us: u32,
    interval_max_us: u32,
    /// The table scan that last asked for it ([`FinePool::get`]).
    scan: std::cell::Cell<u32>,
}

impl FineAcc {
    /// Add one generation's entry.
    pub(crate) fn add(&mut self, h: &FineHist, interval: u32) {
        if h.count == 0 {
            return;
        }
        if self.count == 0 || h.min_us < self.min_us {
            self.min_us = h.min_us;
        }
        self.max_us = self.max_us.max(h.max_us);
        if self.count == 0
            || self.interval != interval
            || self.interval_min_us > self.interval_max_us
        {
            (self.interval, self.interval_min_us, self.interval_max_us) = (interval, u32::MAX, 0);
        }
        self.interval_min_us = self.interval_min_us.min(h.min_us);
        self.interval_max_us = self.interval_max_us.max(h.max_us);
        self.count += h.count;
        self.sum_us += h.sum_us;
        merge_dense(&mut self.buckets, &h.hist);
    }

    /// Add one sample that came through the overflow ring.
    fn add_one(&mut self, rtt: u32, interval: u32) {
        if self.count == 0 || rtt < self.min_us {
            self.min_us = rtt;
        }
        self.max_us = self.max_us.max(rtt);
        if self.count == 0
            || self.interval != interval
            || self.interval_min_us > self.interval_max_us
        {
            (self.interval, self.interval_min_us, self.interval_max_us) = (interval, u32::MAX, 0);
        }
        self.interval_min_us = self.interval_min_us.min(rtt);
        self.interval_max_us = self.interval_max_us.max(rtt);
        self.count += 1;
        self.sum_us += rtt as u64;
        let b = crate::analysis::hist::bucket_of(rtt) as u16;
        match self.buckets.binary_search_by_key(&b, |x| x.0) {
            Ok(j) => self.buckets[j].1 = self.buckets[j].1.saturating_add(1),
            Err(j) => self.buckets.insert(j, (b, 1)),
        }
    }

    /// The cumulative counts: non-empty buckets (index, count), ascending.
    pub fn buckets(&self) -> &[(u16, u32)] {
        &self.buckets
    }

    /// The cumulative counts as the kernel's array layout.
    #[cfg(test)]
    pub fn dense(&self) -> Box<[u32; consts::HIST_BUCKETS]> {
        let mut out = Box::new([0u32; consts::HIST_BUCKETS]);
        for &(i, c) in &self.buckets {
            out[i as usize] = c;
        }
        out
    }

    /// Life min/max (None before the first sample).
    pub fn range(&self) -> (Option<u32>, Option<u32>) {
        if self.count == 0 {
            (None, None)
        } else {
            (Some(self.min_us), Some(self.max_us))
        }
    }

    /// Min/max of the samples read in report interval `interval` (None: none).
    pub fn interval_range(&self, interval: u32) -> Option<(u32, u32)> {
        (self.count > 0
            && self.interval == interval
            && self.interval_min_us <= self.interval_max_us)
            .then_some((self.interval_min_us, self.interval_max_us))
    }
}

/// Add the dense counts `h` into the sorted sparse `buckets`.
fn merge_dense(buckets: &mut crate::analysis::hist::Buckets, h: &[u32]) {
    let mut added = Vec::new();
    for (i, &c) in h.iter().enumerate().filter(|(_, &c)| c > 0) {
        match buckets.binary_search_by_key(&(i as u16), |b| b.0) {
            Ok(j) => buckets[j].1 = buckets[j].1.saturating_add(c),
            Err(_) => added.push((i as u16, c)),
        }
    }
    if !added.is_empty() {
        buckets.extend(added);
        buckets.sort_unstable_by_key(|b| b.0);
    }
}

/// A view's pool: its memory mapping, the generation, and every flow's
/// cumulative histogram, keyed by (owner, owner_gen) as the programs write
/// them (TCP: slot and its gen; sampler: table way and its gen).
pub struct FinePool {
    entries: u32,
    /// Samples of flows that found their half used up (`*_pool_overflow`).
    overflow: Box<dyn RingSource>,
    /// Overflow records of the generation after the one read (written
    /// between the switch and the read): added at the next read.
    early: Vec<FineOverflow>,
    gen: u64,
    /// The next generation was started by [`FinePool::switch`] and the programs waited for by
    /// its caller: the next drain reads the one before without starting another.
    switched: bool,
    interval: u32,
    acc: SlotMap<(u32, u32), FineAcc>,
    /// The current whole-table read (`begin_scan`).
    scan: u32,
    /// Flow stays given back (`forget`), with the generation current then:
    /// their samples written between their last read and the give-back are
    /// drained afterwards and counted in `orphaned`, not added to a
    /// histogram nobody reads again (issue 26.4). Kept for 3 generations,
    /// the longest a sample can wait (its generation's half, or the
    /// overflow ring's records kept for the next read).
    forgotten: SlotMap<(u32, u32), u64>,
    orphaned: u64,
    /// The object built without BPF atomics (bpf/fine_pool.bpf.h,
    /// RTTSCOPE_NO_ATOMICS): each half's free entries are a stack
    /// (`fine_pool_free0`/`1`) that this side fills and refills.
    free_stacks: bool,
}

impl FinePool {
    /// Map the pool (`fine_pool`, 2 x `entries` entries) of `obj`, with its
    /// control array and overflow ring (bpf/fine_pool.bpf.h: the same names
    /// in every view's object).
    pub(crate) fn new(obj: &mut dyn Object, entries: u32) -> Result<FinePool> {
        // The pool is mapped only while a read copies its entries out (`drain`): a mapping kept
        // for the run put every page of both halves in the observer's resident set (RssFile,
        // 84 MB at 4,096 entries per half for two views), though the kernel already counts
        // them. One mapping now checks that the map can be mapped at all.
        let len = pool_bytes(entries) as usize;
        Mapping::new(obj.map_fd(POOL)?, 0, len.min(crate::sys::mmap::page_size()))
            .with_context(|| format!("mapping the fine-histogram pool ({len} bytes)"))?;
        let free_stacks = obj.map_fd(FREE[0]).is_ok();
        if free_stacks {
            for half in 0..2 {
                refill(&*obj, half, entries, 0)?;
            }
        }
        Ok(FinePool {
            free_stacks,
            entries,
            overflow: obj.ring(OVERFLOW)?,
            early: Vec::new(),
            gen: 0,
            switched: false,
            interval: 0,
            acc: SlotMap::default(),
            scan: 0,
            forgotten: SlotMap::default(),
            orphaned: 0,
        })
    }

    /// Start the next generation and fold the finished one into the flows'
    /// histograms (entries copied out, then zeroed for their next use).
    pub(crate) fn drain(&mut self, obj: &dyn Object) -> Result<()> {
        if !std::mem::take(&mut self.switched) {
            self.start_next(obj)?;
            wait_for_programs();
        }
        let ctl = obj.map(CTL)?;
        let old = self.gen - 1;
        let half = (old & 1) as u32;
        let next_key = (consts::POOL_CTL_NEXT + half).to_ne_bytes();
        let taken = taken(obj, old)?;
        let n = taken.min(self.entries as u64) as usize;
        let size = std::mem::size_of::<FineHist>();
        let base = half as usize * self.entries as usize;
        // only the taken entries of the finished half, mapped for this read
        crate::sys::mmap::for_each_element(obj.map_fd(POOL)?, base, n, size, |_, bytes| {
            if let Ok(h) = crate::bpf::decode::<FineHist>(bytes) {
                self.add_entry(&h);
            }
            bytes.fill(0);
        })
        .context("mapping the fine-histogram pool's finished half")?;
        if self.free_stacks {
            refill(obj, half, self.entries, n as u32)?;
        }
        ctl.update(&next_key, &0u64.to_ne_bytes())?;
        let r = self.drain_overflow(old as u32);
        tracing::debug!(
            "generation {old} read: {n} of {taken} entries, {} overflow records kept for the next, {} flows",
            self.early.len(),
            self.acc.len()
        );
        r
    }

    /// Start the next generation: the programs' samples from now on go to the other half.
    fn start_next(&mut self, obj: &dyn Object) -> Result<()> {
        self.gen += 1;
        obj.map(CTL)?
            .update(&consts::POOL_CTL_GEN.to_ne_bytes(), &self.gen.to_ne_bytes())
    }

    /// Start the next generation at an interval's edge without waiting for the programs still
    /// running on the old one: the caller waits ([`wait_for_programs`]) once for every view's
    /// pool it switched, so that the views' edges are the same instant (a sample's generation
    /// is its interval: the views' counts come from their pools) and one wait serves them all;
    /// the next [`FinePool::drain`] then reads the generation switched from. Once per drain.
    pub(crate) fn switch(&mut self, obj: &dyn Object) -> Result<()> {
        if !self.switched {
            self.start_next(obj)?;
            self.switched = true;
        }
        Ok(())
    }

    /// One pool entry of the finished generation into its flow's histogram.
    fn add_entry(&mut self, h: &FineHist) {
        if h.count == 0 {
            return;
        }
        if self.forgotten.contains_key(&(h.owner, h.owner_gen)) {
            self.orphaned += h.count;
        } else {
            self.acc
                .entry((h.owner, h.owner_gen))
                .or_default()
                .add(h, self.interval);
        }
    }

    /// Drain (see `drain`) when the current generation's half is at least
    /// half taken. Returns whether it did.
    pub(crate) fn drain_if_busy(&mut self, obj: &dyn Object) -> Result<bool> {
        if taken(obj, self.gen)? < (self.entries as u64).div_ceil(2) {
            return Ok(false);
        }
        self.drain(obj)?;
        Ok(true)
    }

    /// The overflow ring's records of generation `gen` (and older) into the
    /// flows' histograms; those of the next one are kept for the next read.
    fn drain_overflow(&mut self, gen: u32) -> Result<()> {
        let mut now = std::mem::take(&mut self.early);
        let mut later = Vec::new();
        self.overflow.drain(&mut |b| {
            if let Ok(r) = crate::bpf::decode::<FineOverflow>(b) {
                if r.pool_gen.wrapping_sub(gen) as i32 > 0 {
                    later.push(r);
                } else {
                    now.push(r);
                }
            }
        })?;
        tracing::debug!("{} overflow records of generation {gen}", now.len());
        for r in now {
            if self.forgotten.contains_key(&(r.owner, r.owner_gen)) {
                self.orphaned += 1;
                continue;
            }
            self.acc
                .entry((r.owner, r.owner_gen))
                .or_default()
                .add_one(r.rtt_us, self.interval);
        }
        self.early = later;
        let g = self.gen;
        self.forgotten.retain(|_, at| *at + 3 > g);
        Ok(())
    }

    /// The histogram read so far of the flow (owner, gen).
    ///
    /// Marks it as asked for in the current scan ([`FinePool::begin_scan`]).
    pub fn get(&self, owner: u32, gen: u32) -> Option<&FineAcc> {
        let a = self.acc.get(&(owner, gen))?;
        a.scan.set(self.scan);
        Some(a)
    }

    /// The generation the programs write now: everything of the earlier
    /// ones was read.
    pub fn generation(&self) -> u64 {
        self.gen
    }

    /// The current report interval (interval min/max belong to it).
    pub fn interval(&self) -> u32 {
        self.interval
    }

    /// A new report interval starts: interval min/max restart.
    pub fn next_interval(&mut self) {
        self.interval = self.interval.wrapping_add(1);
    }

    /// Forget a flow (its slot given back).
    pub fn forget(&mut self, owner: u32, gen: u32) {
        self.acc.remove(&(owner, gen));
        self.forgotten.insert((owner, gen), self.gen);
    }

    /// Samples of given-back flow stays that were drained after their last
    /// read (cumulative): the TCP view's `samples_evicted`.
    pub fn orphaned(&self) -> u64 {
        self.orphaned
    }

    /// Start a read of the whole table: [`FinePool::end_scan`] keeps the
    /// histograms asked for ([`FinePool::get`]) between the two.
    pub fn begin_scan(&mut self) {
        self.scan = self.scan.wrapping_add(1);
    }

    /// After a whole-table read: keep only the flows it found (the others
    /// were evicted or given back, and their histograms are not asked for
    /// again). A stamp per flow, not a set of the flows found built at each
    /// read (100,000 inserts and a rehash per read at 100,000 flows).
    pub fn end_scan(&mut self) {
        let scan = self.scan;
        self.acc.retain(|_, a| a.scan.get() == scan);
    }
}

/// The free-entry stacks of the halves in the object built without BPF
/// atomics (bpf/fine_pool.bpf.h).
const FREE: [&str; 2] = ["fine_pool_free0", "fine_pool_free1"];

/// Give the `taken` entries of `half` (0, 1, .. taken - 1: the stack's
/// pops, read and zeroed now) back to its free stack; with `taken` 0 on an
/// empty stack, fill it.
fn refill(obj: &dyn Object, half: u32, entries: u32, taken: u32) -> Result<()> {
    let fd = obj.map_fd(FREE[half as usize & 1])?;
    crate::sys::bpf::refill_stack(fd, entries, taken)
        .with_context(|| format!("refilling the fine-histogram pool's free stack {half}"))
}

/// Entries taken in generation `gen`'s half (the programs' counter; may
/// exceed the half's size: every flow that found it used up counted too).
fn taken(obj: &dyn Object, gen: u64) -> Result<u64> {
    let key = (consts::POOL_CTL_NEXT + (gen & 1) as u32).to_ne_bytes();
    Ok(obj
        .map(CTL)?
        .lookup(&key)?
        .and_then(|v| Some(u64::from_ne_bytes(v.get(..8)?.try_into().ok()?)))
        .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(owner: u32, samples: &[u32]) -> FineHist {
        let mut h: FineHist = crate::bpf::zeroed();
        h.owner = owner;
        for &s in samples {
            if h.count == 0 || s < h.min_us {
                h.min_us = s;
            }
            h.max_us = h.max_us.max(s);
            h.count += 1;
            h.sum_us += s as u64;
            h.hist[crate::analysis::hist::bucket_of(s)] += 1;
        }
        h
    }

    #[test]
    fn generations_add_up_to_the_same_histogram_as_one() {
        let (a, b) = ([40, 41, 5000, 40], [39, 70_000, 41]);
        let mut acc = FineAcc::default();
        acc.add(&entry(1, &a), 0);
        assert_eq!(acc.interval_range(0), Some((40, 5000)));
        acc.add(&entry(1, &b), 1);
        let all: Vec<u32> = a.iter().chain(&b).copied().collect();
        let one = entry(1, &all);
        assert_eq!(&acc.dense()[..], &one.hist[..]);
        assert_eq!((acc.count, acc.sum_us), (7, one.sum_us));
        assert_eq!(acc.range(), (Some(39), Some(70_000)));
        // interval 1 saw only b
        assert_eq!(acc.interval_range(1), Some((39, 70_000)));
        assert_eq!(acc.interval_range(0), None);
        acc.add(&entry(1, &[]), 2);
        assert_eq!(acc.count, 7);
        // one at a time (the overflow ring) is the same as a whole entry
        let mut one_by_one = FineAcc::default();
        for &v in &all {
            one_by_one.add_one(v, 1);
        }
        assert_eq!(&one_by_one.dense()[..], &one.hist[..]);
        assert_eq!((one_by_one.count, one_by_one.sum_us), (7, one.sum_us));
        assert_eq!(one_by_one.range(), acc.range());
    }

    #[test]
    fn pool_sizes() {
        assert_eq!(pool_entries(16384), 1024);
        assert_eq!(pool_entries(64), 64);
        assert_eq!(pool_entries(1000), 256);
        assert_eq!(pool_entries(131072), 4096);
        assert_eq!(pool_entries(100_000), 4096);
        // 1,024 x 2 x 5,152 bytes: 10.1 MiB per view at the default
        assert_eq!(pool_bytes(1024), 10_551_296);
    }
}
