//! The limits' state: stateless UDP cookies, the per-source UDP token
//! buckets, and the live TCP connections per source.
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use md5::Md5;

pub(super) type HmacMd5 = Hmac<Md5>;

/// Stateless UDP cookies: HMAC-MD5, keyed with 32 random bytes made at server
/// start, of (time window, peer address, peer port), truncated to 64 bits. A
/// cookie is accepted in its window and the next one, so it lives between one
/// and two windows. Nothing is stored per peer.
pub(super) struct Cookies {
    pub(super) mac: HmacMd5,
    pub(super) start: Instant,
    pub(super) window: Duration,
}

impl Cookies {
    pub(super) fn new(window: Duration) -> Self {
        let key: [u8; 32] = rand::random();
        Cookies {
            mac: <HmacMd5 as Mac>::new_from_slice(&key).expect("HMAC takes any key length"),
            start: Instant::now(),
            window: window.max(Duration::from_millis(1)),
        }
    }

    pub(super) fn window_at(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.start).as_nanos() / self.window.as_nanos()) as u64
    }

    pub(super) fn make(&self, peer: SocketAddr, window: u64) -> u64 {
        let mut m = self.mac.clone();
        m.update(&window.to_be_bytes());
        match source(peer.ip()) {
            IpAddr::V4(a) => {
                m.update(&[4]);
                m.update(&a.octets());
            }
            IpAddr::V6(a) => {
                m.update(&[6]);
                m.update(&a.octets());
            }
        }
        m.update(&peer.port().to_be_bytes());
        let tag = m.finalize().into_bytes();
        u64::from_be_bytes(tag[..8].try_into().unwrap())
    }

    pub(super) fn current(&self, peer: SocketAddr, now: Instant) -> u64 {
        self.make(peer, self.window_at(now))
    }

    pub(super) fn valid(&self, cookie: u64, peer: SocketAddr, now: Instant) -> bool {
        let w = self.window_at(now);
        cookie == self.make(peer, w) || (w > 0 && cookie == self.make(peer, w - 1))
    }
}

/// Per-source token buckets in a bounded table.
pub(super) struct RateLimiter {
    /// Tokens per nanosecond.
    pub(super) per_ns: f64,
    pub(super) burst: f64,
    pub(super) cap: usize,
    pub(super) table: HashMap<IpAddr, Bucket>,
}

#[derive(Clone, Copy)]
pub(super) struct Bucket {
    pub(super) tokens: f64,
    pub(super) last: Instant,
}

impl RateLimiter {
    /// None when `rate` is 0 (no limit).
    pub(super) fn new(rate: u32, burst: u32, cap: usize) -> Option<Self> {
        (rate > 0).then(|| RateLimiter {
            per_ns: rate as f64 / 1e9,
            burst: burst.max(1) as f64,
            cap: cap.max(1),
            table: HashMap::new(),
        })
    }

    /// Take a token for `ip` at `now`: true when a reply may be sent. `evicted`
    /// counts sources forgotten with a partly spent bucket to make room.
    pub(super) fn allow(&mut self, ip: IpAddr, now: Instant, evicted: &mut u64) -> bool {
        if !self.table.contains_key(&ip) && self.table.len() >= self.cap {
            *evicted += self.make_room(now);
        }
        let (per_ns, burst) = (self.per_ns, self.burst);
        let b = self.table.entry(ip).or_insert(Bucket {
            tokens: burst,
            last: now,
        });
        let dt = now.saturating_duration_since(b.last).as_nanos() as f64;
        b.tokens = (b.tokens + dt * per_ns).min(burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// The table is full: forget every source whose bucket has refilled (it
    /// holds nothing a new entry would not), then, if that freed less than a
    /// quarter, the stalest sources down to three quarters of the cap.
    /// Returns how many of the latter (state lost) there were. A source being
    /// flooded is the freshest in the table, so it is never the one forgotten.
    pub(super) fn make_room(&mut self, now: Instant) -> u64 {
        let (per_ns, burst) = (self.per_ns, self.burst);
        self.table.retain(|_, b| {
            let dt = now.saturating_duration_since(b.last).as_nanos() as f64;
            b.tokens + dt * per_ns < burst
        });
        let keep = (self.cap - self.cap / 4).min(self.cap - 1);
        if self.table.len() <= keep {
            return 0;
        }
        let mut ages: Vec<Instant> = self.table.values().map(|b| b.last).collect();
        let drop = self.table.len() - keep;
        let (_, cutoff, _) = ages.select_nth_unstable(drop - 1);
        let cutoff = *cutoff;
        let before = self.table.len();
        self.table.retain(|_, b| b.last > cutoff);
        (before - self.table.len()) as u64
    }
}

/// Live TCP connections per source address (entries only while a connection lives).
#[derive(Default)]
pub(super) struct PeerConns(Mutex<HashMap<IpAddr, usize>>);

/// One live connection's share of its source's count; released on drop.
pub(super) struct PeerSlot {
    pub(super) conns: Arc<PeerConns>,
    pub(super) ip: IpAddr,
}

impl PeerConns {
    pub(super) fn try_take(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<PeerSlot> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(ip).or_insert(0);
        if limit > 0 && *n >= limit {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            conns: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut m = self.conns.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// IPv4-mapped IPv6 addresses count as the IPv4 address they carry.
pub(super) fn source(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}
