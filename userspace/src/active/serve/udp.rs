//! UDP: the answer to each datagram (response or cookie), the per-source
//! rate limit, and the receive loop.
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Result;
use tokio::net::UdpSocket;
use tracing::{debug, warn};

use super::config::ServeConfig;
use super::limits::{source, Cookies, RateLimiter};
use super::stats::{inc, log_nth, ServeStats};
use crate::active::framing::{
    carried_cookie, encode_cookie, is_cookie_request, write_cookie, FrameError, UdpHeader,
    UDP_COOKIE_REQ_MIN, UDP_HEADER_LEN,
};

/// What the UDP sockets share: cookies and the per-source rate table.
pub(super) struct UdpShared {
    pub(super) cookies: Cookies,
    pub(super) limiter: Option<Mutex<RateLimiter>>,
}

/// What a UDP datagram gets back.
pub(super) enum UdpAnswer {
    /// The response: `resp` bytes starting with the request's header; bytes
    /// 16..24 carry this cookie when one was verified.
    Response { resp: usize, cookie: Option<u64> },
    /// A 16-byte cookie datagram.
    Cookie(u64),
}

/// Decide the answer to one datagram (None: dropped, counted and logged).
pub(super) fn udp_answer(
    d: &[u8],
    peer: SocketAddr,
    now: Instant,
    cfg: &ServeConfig,
    cookies: &Cookies,
    stats: &ServeStats,
) -> Option<UdpAnswer> {
    match is_cookie_request(d) {
        Some(true) => {
            inc(&stats.udp_cookie_requests);
            return Some(UdpAnswer::Cookie(cookies.current(peer, now)));
        }
        Some(false) => {
            let c = inc(&stats.udp_bad);
            log_udp_bad(peer, &FrameError::Short(d.len()), c);
            return None;
        }
        None => {}
    }
    let h = match UdpHeader::decode_request(d, cfg.max_size) {
        Ok(h) => h,
        Err(e) => {
            let c = inc(&stats.udp_bad);
            log_udp_bad(peer, &e, c);
            return None;
        }
    };
    inc(&stats.udp_requests);
    let resp = h.resp as usize;
    if resp <= d.len() {
        // Never larger than the request: no proof needed.
        return Some(UdpAnswer::Response { resp, cookie: None });
    }
    match carried_cookie(d) {
        Some(c) if cookies.valid(c, peer, now) => Some(UdpAnswer::Response {
            resp,
            cookie: Some(cookies.current(peer, now)),
        }),
        _ => {
            // Maybe a spoofed source: answer with no more than was received.
            let c = inc(&stats.udp_cookie_required);
            if log_nth(c) {
                warn!(
                    "{peer}: UDP request of {} bytes asks for {resp} without a valid cookie; answered with a cookie (so far: {c})",
                    d.len()
                );
            }
            Some(UdpAnswer::Cookie(cookies.current(peer, now)))
        }
    }
}

pub(super) async fn udp_loop(
    u: UdpSocket,
    cfg: Arc<ServeConfig>,
    shared: Arc<UdpShared>,
    stats: Arc<ServeStats>,
) -> Result<()> {
    let mut buf = vec![0u8; 65536];
    let mut out = vec![b'r'; 65536];
    loop {
        let (n, peer) = match u.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                // ICMP errors from earlier sends surface here; they are not ours to act on.
                debug!("udp recv: {e}");
                continue;
            }
        };
        let now = Instant::now();
        let Some(answer) = udp_answer(&buf[..n], peer, now, &cfg, &shared.cookies, &stats) else {
            continue;
        };
        if !rate_allows(&shared, peer, now, &cfg, &stats) {
            continue;
        }
        let sent = match answer {
            UdpAnswer::Cookie(c) => u.send_to(&encode_cookie(c), peer).await,
            UdpAnswer::Response { resp, cookie } => {
                out[..UDP_HEADER_LEN].copy_from_slice(&buf[..UDP_HEADER_LEN]);
                // Bytes 16..24: this peer's fresh cookie, or plain filler (never
                // another peer's cookie left over in the buffer).
                match cookie {
                    Some(c) if resp >= UDP_COOKIE_REQ_MIN => write_cookie(&mut out, c),
                    _ => out[UDP_HEADER_LEN..UDP_COOKIE_REQ_MIN].fill(b'r'),
                }
                u.send_to(&out[..resp], peer).await
            }
        };
        if let Err(e) = sent {
            let c = inc(&stats.udp_send_errors);
            if c <= 10 {
                debug!("udp send to {peer}: {e}");
            }
        }
    }
}

/// The source's token bucket allows a reply now (no limiter: always); evictions from
/// the full table and refusals are counted and logged.
pub(super) fn rate_allows(
    shared: &UdpShared,
    peer: SocketAddr,
    now: Instant,
    cfg: &ServeConfig,
    stats: &ServeStats,
) -> bool {
    let Some(limiter) = &shared.limiter else {
        return true;
    };
    let mut evicted = 0;
    let ok = limiter.lock().unwrap_or_else(|e| e.into_inner()).allow(
        source(peer.ip()),
        now,
        &mut evicted,
    );
    if evicted > 0 {
        let before = stats
            .udp_rate_evictions
            .fetch_add(evicted, Ordering::Relaxed);
        if before == 0 || (before / 1000) != ((before + evicted) / 1000) {
            warn!(
                "UDP rate table full ({} sources): forgot {evicted} of the stalest (so far: {})",
                cfg.udp_rate_sources,
                before + evicted
            );
        }
    }
    if !ok {
        let c = inc(&stats.udp_rate_limited);
        if log_nth(c) {
            warn!(
                "{peer}: over the UDP rate of {}/s (burst {}); dropped (so far: {c})",
                cfg.udp_rate, cfg.udp_burst
            );
        }
    }
    ok
}

/// Bad datagrams are logged for the first ten and then every thousandth, so a flood cannot flood the log.
pub(super) fn log_udp_bad(peer: SocketAddr, e: &FrameError, count: u64) {
    if log_nth(count) {
        warn!("{peer}: bad UDP request ({e}); dropped (bad datagrams so far: {count})");
    }
}
