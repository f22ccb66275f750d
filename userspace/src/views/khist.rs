//! The kernel's per-flow histograms, made cumulative again.
//!
//! The programs do not keep a flow's 1,280 log-linear counters (5 KiB per
//! flow and view): they keep the buckets the flow hit in the current report
//! interval, sparse, in one of two halves (`struct rttscope_hist_half` in
//! `bpf/rttscope.h`): `half[epoch & 1]`, cleared by the first sample of a
//! new epoch. Userspace reads every flow at least once per interval before
//! it moves the epoch on, so a half is read complete (its epoch over) before
//! the programs can clear it, two epochs later. [`KernelHists`] adds each
//! finished half once into the flow's running total and hands the readers
//! the same cumulative counts (in the userspace layout, `hist::BUCKETS`
//! wide) the kernel used to keep: the bucket of every sample is the same,
//! so nothing downstream changes and nothing is approximated.
use std::collections::HashMap;

use crate::analysis::hist::BUCKETS;

/// Bits of an entry that hold the count (the rest: bucket + 1).
const COUNT_BITS: u32 = crate::bpf::consts::HIST_COUNT_BITS;
const COUNT_MASK: u32 = (1 << COUNT_BITS) - 1;

/// One half of a flow's kernel histogram, as read.
#[derive(Debug, Clone, Copy)]
pub struct Half<'a> {
    pub epoch: u32,
    pub entries: &'a [u32],
}

impl Half<'_> {
    /// (bucket, count) of every used entry.
    fn counts(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        self.entries.iter().filter(|&&v| v != 0).filter_map(|&v| {
            let b = (v >> COUNT_BITS) as usize;
            (1..=BUCKETS)
                .contains(&b)
                .then_some((b - 1, v & COUNT_MASK))
        })
    }
}

/// The running total of one flow (one slot or way, one generation).
#[derive(Debug, Default)]
struct FlowAcc {
    gen: u64,
    /// Epoch of the last half added, per half index.
    done: [Option<u32>; 2],
    /// Cumulative (bucket, count), sorted by bucket.
    acc: Vec<(u16, u32)>,
    seen: bool,
}

impl FlowAcc {
    fn add(&mut self, h: &Half<'_>) {
        for (b, c) in h.counts() {
            match self.acc.binary_search_by_key(&(b as u16), |&(i, _)| i) {
                Ok(i) => self.acc[i].1 = self.acc[i].1.wrapping_add(c),
                Err(i) => self.acc.insert(i, (b as u16, c)),
            }
        }
    }
}

/// Running totals of every flow of a view, keyed by its slot (TCP) or way
/// (sampler) and generation.
#[derive(Debug, Default)]
pub struct KernelHists {
    flows: HashMap<u32, FlowAcc>,
}

impl KernelHists {
    /// Start a full read of the view's table.
    pub fn begin(&mut self) {
        self.flows.values_mut().for_each(|f| f.seen = false);
    }

    /// After a full read: forget the flows it did not see (freed slots, re-keyed ways).
    pub fn end(&mut self) {
        self.flows.retain(|_, f| f.seen);
    }

    /// Cumulative counts of the flow in slot/way `idx` with generation `gen`, `epoch` being the
    /// current report epoch: the finished halves are added into the flow's total (each once), the
    /// current one is added to the copy returned.
    pub fn counts(&mut self, idx: u32, gen: u64, halves: [Half<'_>; 2], epoch: u32) -> Box<[u32]> {
        let f = self.flows.entry(idx).or_default();
        if f.gen != gen {
            *f = FlowAcc {
                gen,
                ..Default::default()
            };
        }
        f.seen = true;
        let mut current = None;
        for (i, h) in halves.iter().enumerate() {
            // A half holds samples only of an epoch whose parity is its index (a new flow's
            // other half is empty, stamped with the epoch it was created in).
            if h.epoch as usize & 1 != i {
                continue;
            }
            if h.epoch == epoch {
                current = Some(*h);
            } else if f.done[i] != Some(h.epoch) {
                f.add(h);
                f.done[i] = Some(h.epoch);
            }
        }
        let mut out = vec![0u32; BUCKETS].into_boxed_slice();
        for &(b, c) in &f.acc {
            out[b as usize] = c;
        }
        if let Some(h) = current {
            for (b, c) in h.counts() {
                out[b] = out[b].wrapping_add(c);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::hist::bucket_of;
    const ENTRIES: usize = crate::bpf::consts::HIST_ENTRIES;

    /// The kernel's insertion (bpf/rttscope.h: rttscope_hist_add), for the tests.
    fn put(e: &mut [u32], b: usize) -> bool {
        let tag = ((b + 1) as u32) << COUNT_BITS;
        let mut j = b % e.len();
        for _ in 0..e.len() {
            if e[j] == 0 {
                e[j] = tag | 1;
                return true;
            }
            if e[j] & !COUNT_MASK == tag {
                e[j] += 1;
                return true;
            }
            j = (j + 1) % e.len();
        }
        false
    }

    /// Halves filled over several epochs and read once per epoch (before the move on, as the
    /// session does) give exactly the counts of a full histogram of every sample.
    #[test]
    fn halves_read_each_interval_sum_to_the_full_histogram() {
        let mut h = [[0u32; ENTRIES]; 2];
        let mut ep = [0u32; 2];
        let mut kh = KernelHists::default();
        let mut want = vec![0u32; BUCKETS];
        let mut got = Box::default();
        for epoch in 0..6u32 {
            let i = (epoch & 1) as usize;
            if ep[i] != epoch {
                h[i] = [0; ENTRIES];
                ep[i] = epoch;
            }
            for k in 0..500u32 {
                let v = 900 + (k * 37 + epoch * 11) % 400 + if k % 50 == 0 { 40_000 } else { 0 };
                assert!(put(&mut h[i], bucket_of(v)));
                want[bucket_of(v)] += 1;
                if k == 250 {
                    // a read in the middle of the interval (closed flows are read early)
                    kh.begin();
                    let halves = [0, 1].map(|j| Half {
                        epoch: ep[j],
                        entries: &h[j],
                    });
                    kh.counts(3, 2, halves, epoch);
                    kh.end();
                }
            }
            kh.begin();
            let halves = [0, 1].map(|j| Half {
                epoch: ep[j],
                entries: &h[j],
            });
            got = kh.counts(3, 2, halves, epoch);
            kh.end();
            assert_eq!(&got[..], &want[..], "epoch {epoch}");
        }
        // a new generation of the slot starts from zero
        let halves = [0, 1].map(|j| Half {
            epoch: ep[j],
            entries: &h[j],
        });
        let fresh = kh.counts(3, 4, halves, 6);
        assert!(fresh.iter().sum::<u32>() < got.iter().sum::<u32>());
    }

    /// A half holds at most its entries' worth of distinct buckets: the kernel says so (false).
    #[test]
    fn a_full_half_refuses_a_new_bucket() {
        let mut e = [0u32; ENTRIES];
        for b in 0..ENTRIES {
            assert!(put(&mut e, 300 + b));
        }
        assert!(put(&mut e, 300), "a bucket already held still counts");
        assert!(!put(&mut e, 1000));
    }
}
