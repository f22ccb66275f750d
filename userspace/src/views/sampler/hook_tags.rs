//! Where each hook's packets are counted (issue 44): `sampler_hooks`, a per-CPU array of
//! (key, packets) entries (struct rttscope_hook_tag) that the programs search from the key's
//! home for at most [`PROBES`] entries (bpf/sampler.bpf.c count_hook()), an array lookup the
//! verifier inlines, with the key and its count on one cache line. This is the userspace half:
//! which entry each hook gets. An entry never used holds key 0 (the programs' search stops
//! there); a released one holds [`RELEASED`] (the search goes on past it) and is taken again by
//! the next key whose search reaches it. The array has 4 entries per hook or more, so a key is
//! placed within its [`PROBES`] entries unless 8 entries in a row are taken, live or released:
//! with at most a quarter of the entries live and released ones free to take again, that never
//! happened in the unit test's 100,000 placements under churn; if it does, the interface is
//! refused as unattachable, in one sentence.
use anyhow::{bail, Result};

use crate::bpf::sampler::types as t;

/// How far from its home the programs look for a key.
pub const PROBES: usize = t::rttscope_consts::RTTSCOPE_HOOK_PROBES.0 as usize;
/// The key of a released entry (never a hook's: netns inode and ifindex all ones).
pub const RELEASED: u64 = u64::MAX;
/// Entries per hook.
const SPREAD: usize = 4;
/// Bytes of one entry on one CPU (struct rttscope_hook_tag).
pub const ENTRY_BYTES: usize = 16;

/// A hook's key: netns inode << 32 | ifindex << 1 | direction (0 ingress, 1 egress).
pub fn key(netns: u32, ifindex: u32, dir: usize) -> u64 {
    ((netns as u64) << 32) | ((ifindex as u64) << 1) | dir as u64
}

/// Where the search for `key` starts (bpf/sampler.bpf.c hook_home()).
pub fn home(key: u64, mask: u32) -> u32 {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32 & mask
}

/// The number of entries for `hooks` hooks: a power of two, 4 per hook or more.
pub fn entries_for(hooks: u32) -> u32 {
    (hooks.max(1) as usize * SPREAD).next_power_of_two() as u32
}

/// An entry's value on every CPU: `key` with a count of 0.
pub fn entry_bytes(key: u64, cpus: usize) -> Vec<u8> {
    let mut one = [0u8; ENTRY_BYTES];
    one[..8].copy_from_slice(&key.to_ne_bytes());
    one.repeat(cpus)
}

/// The packets of `key` in an entry's per-CPU value (CPUs whose copy holds another key, as
/// while it is being written, count nothing).
pub fn packets(value: &[u8], key: u64) -> u64 {
    value
        .chunks_exact(ENTRY_BYTES)
        .filter(|c| u64::from_ne_bytes(c[..8].try_into().unwrap()) == key)
        .map(|c| u64::from_ne_bytes(c[8..16].try_into().unwrap()))
        .sum()
}

/// Where `key` goes: the first entry from its home, within [`PROBES`], that is unused or
/// released (`key_at`: the key an entry holds now), or None.
pub fn free_entry(key: u64, mask: u32, mut key_at: impl FnMut(u32) -> u64) -> Option<u32> {
    let h = home(key, mask);
    (0..PROBES as u32)
        .map(|i| (h + i) & mask)
        .find(|&e| matches!(key_at(e), 0 | RELEASED))
}

/// The array as userspace keeps it (the map is written to match, entry by entry).
pub struct HookTags {
    keys: Vec<u64>,
}

impl HookTags {
    /// For `hooks` hooks (2 per interface).
    pub fn new(hooks: u32) -> HookTags {
        HookTags {
            keys: vec![0; entries_for(hooks) as usize],
        }
    }

    pub fn mask(&self) -> u32 {
        self.keys.len() as u32 - 1
    }

    /// Place `key` (not placed already): the first entry from its home that is unused or
    /// released, within [`PROBES`]. The caller writes it ([`entry_bytes`]) before any packet
    /// can reach the hook.
    pub fn place(&mut self, key: u64) -> Result<u32> {
        debug_assert!(key != 0 && key != RELEASED);
        let Some(entry) = free_entry(key, self.mask(), |e| self.keys[e as usize]) else {
            bail!(
                "the hook counters have no free entry within {PROBES} of this interface's place; release some interfaces or raise --max-ifaces"
            );
        };
        self.keys[entry as usize] = key;
        Ok(entry)
    }

    /// Let a placed hook's entry go (the caller writes [`RELEASED`] to the map).
    pub fn release(&mut self, entry: u32) {
        self.keys[entry as usize] = RELEASED;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The programs' search (count_hook()) over the array as userspace wrote it.
    fn search(tags: &HookTags, key: u64) -> Option<u32> {
        let mask = tags.mask();
        let h = home(key, mask);
        (0..PROBES as u32)
            .map(|i| (h + i) & mask)
            .take_while(|&e| tags.keys[e as usize] != 0)
            .find(|&e| tags.keys[e as usize] == key)
    }

    #[test]
    fn sizes_are_powers_of_two_with_four_entries_per_hook() {
        assert_eq!(entries_for(0), 4);
        assert_eq!(entries_for(2), 8);
        assert_eq!(entries_for(512), 2048);
        assert_eq!(entries_for(513), 4096);
        assert_eq!(HookTags::new(512).mask(), 2047);
    }

    #[test]
    fn the_home_is_the_programs_arithmetic() {
        // bpf/sampler.bpf.c hook_home(): (k * 0x9E3779B97F4A7C15) >> 32, masked
        let k = key(4026531840, 7, 1);
        assert_eq!(k, (4026531840u64 << 32) | 15);
        let want = ((k as u128 * 0x9E37_79B9_7F4A_7C15u128) as u64 >> 32) as u32 & 1023;
        assert_eq!(home(k, 1023), want);
    }

    #[test]
    fn entries_are_the_c_struct_on_every_cpu() {
        let b = entry_bytes(0x0102_0304_0506_0708, 3);
        assert_eq!(b.len(), 3 * ENTRY_BYTES);
        assert_eq!(&b[16..24], &0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(&b[24..32], &[0; 8]);
        // a count on two CPUs; the third holds another key (being rewritten)
        let mut v = b.clone();
        v[8..16].copy_from_slice(&5u64.to_ne_bytes());
        v[24..32].copy_from_slice(&7u64.to_ne_bytes());
        v[32..40].copy_from_slice(&RELEASED.to_ne_bytes());
        v[40..48].copy_from_slice(&100u64.to_ne_bytes());
        assert_eq!(packets(&v, 0x0102_0304_0506_0708), 12);
    }

    /// Interfaces of a busy node come and go (veths with ever larger ifindexes in two
    /// namespaces, the bound always full): every live hook is found by the programs' search,
    /// a released one is not, and no two live hooks share an entry.
    #[test]
    fn churn_keeps_every_live_hook_reachable() {
        let max_ifaces = 256u32;
        let mut tags = HookTags::new(2 * max_ifaces);
        let mut live: std::collections::VecDeque<[(u64, u32); 2]> = Default::default();
        let mut next_ifindex = 2u32;
        for round in 0..50_000u32 {
            if live.len() == max_ifaces as usize {
                for (k, e) in live.pop_front().unwrap() {
                    tags.release(e);
                    assert_eq!(search(&tags, k), None, "released {k:#x} still found");
                }
            }
            let ns = [4026531840u32, 4026532000][round as usize % 2];
            let ifindex = next_ifindex;
            next_ifindex += 1 + round % 3;
            let pair = [0, 1].map(|d| {
                let k = key(ns, ifindex, d);
                (k, tags.place(k).expect("a free entry within the probes"))
            });
            live.push_back(pair);
        }
        let mut entries = std::collections::BTreeSet::new();
        for (k, e) in live.iter().flatten() {
            assert_eq!(search(&tags, *k), Some(*e), "{k:#x}");
            assert!(entries.insert(*e), "entry {e} given twice");
        }
        assert_eq!(entries.len(), 2 * max_ifaces as usize);
    }

    #[test]
    fn no_free_entry_within_the_probes_is_one_sentence() {
        let mut tags = HookTags::new(2); // 8 entries: all taken by released ones and live ones
        tags.keys.iter_mut().for_each(|k| *k = 42);
        let e = tags.place(key(1, 2, 0)).unwrap_err().to_string();
        assert!(e.contains("no free entry within 8"), "{e}");
        tags.release(3);
        assert!(tags.place(key(1, 2, 0)).is_ok());
    }
}
