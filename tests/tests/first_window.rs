//! The same window from the first interval (issue 45 item 5): a paced request/response flow
//! opened before `observe` starts, seen by the TCP view and the sampler, has the same sample
//! count in every interval of both views, the first one included, and each count is the
//! number of transactions the client completed in that interval.
//!
//! Before the fix the TCP view counted from its own attach, about half a second before the
//! sampler's programs were verified and attached: at 100 transactions/s and 2 s intervals the
//! first interval read TCP 249 vs sampler 196 (then 194/194, 195/195).
//!
//! Tolerances, from what the records say of their reads. At the window's start and at every
//! interval's end the session switches every view's pool generation, waits once, then reads
//! the views one after the other (the TCP view, then the sampler); each start and interval
//! record says how long that took (`read_s`, from its `ts`), and each view's edge lies in
//! `ts` .. `ts + read_s` (near its start now that the switches come first; before, each view
//! switched and waited in its own read, 23-27 ms apart on an idle machine). A sample of a transaction the client
//! completed in that span (or the one in flight) can be in an interval of one view and the next
//! of the other: an edge's slack is 1 + the transactions the client completed in its span (the
//! client's counter is polled every 2 ms). The sampler times an ACK at tc ingress, before TCP
//! processes it, and is read after TCP, so at each edge it can only be ahead: over the run, the
//! totals differ by at most the larger of the first and the last edge's slack. Each interval,
//! the views against each other and each against the transactions (from the previous record's
//! `ts` to its own): the two edges' slacks, at least 3 (one transaction at each end, one for a
//! request in flight at a read). The bound of the totals grows by the flow's retransmissions
//! (TCP takes no sample of a retransmitted request, Karn; the sampler does): under load a
//! stalled server makes the client send a tail loss probe now and then. A loss of the sampler
//! under load (seen once beside the handshake tests: 7 fewer over the run) fails the test,
//! printing the sampler's counters. Seen in CI on a 2-core machine at a load of 6, when each view
//! still switched and waited in its own read: TCP 195 / sampler 194 in the first interval and
//! 47 / 46 in the last, which the fixed ±1 of the totals this test had then failed on. With the
//! switches first: quiet, spans of 8-19 ms (slacks 2-3) and the views equal in every interval;
//! under load (2 `yes` and a gzip loop on the 2 cores), slacks 3-5 and the views equal. The bug
//! moved the first interval by ~50.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rttscope_e2e::*;

const PORT: u16 = 7945;
const THINK: Duration = Duration::from_millis(10);

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The transactions the client completed between two Unix times, from the polled series.
fn done_between(series: &[(f64, u32)], from: f64, to: f64) -> i64 {
    let at = |t: f64| {
        series
            .iter()
            .take_while(|(ts, _)| *ts <= t)
            .last()
            .map_or(0, |s| s.1 as i64)
    };
    at(to) - at(from)
}

/// Per interval: its start and end (Unix time: the previous record's `ts`, the first one's the
/// start record's, when every view's window started) and the client side's samples of the flow
/// from `lport`, per view.
fn client_counts(
    lines: &[serde_json::Value],
    lport: u16,
) -> Vec<(f64, f64, BTreeMap<String, u64>)> {
    let local = format!("{A_ADDR}:{lport}");
    let mut from = lines[0]["ts"].as_f64().expect("the start record's ts");
    lines
        .iter()
        .filter(|l| l["type"] == "interval")
        .map(|l| {
            let mut per_view = BTreeMap::new();
            for f in l["flows"].as_array().into_iter().flatten() {
                if f["local"] != local.as_str() {
                    continue;
                }
                for view in ["tcp", "sampler"] {
                    let n = f[view]["n"].as_u64().unwrap_or(0);
                    *per_view.entry(view.to_string()).or_insert(0) += n;
                }
            }
            let to = l["ts"].as_f64().unwrap();
            (std::mem::replace(&mut from, to), to, per_view)
        })
        .collect()
}

/// Each edge's slack (the window's start, then every interval's end): 1 + the transactions the
/// client completed while the views were read (`ts` .. `ts + read_s` of the start and interval
/// records).
fn edge_slacks(lines: &[serde_json::Value], series: &[(f64, u32)]) -> Vec<i64> {
    lines
        .iter()
        .filter(|l| l["type"] == "start" || l["type"] == "interval")
        .map(|l| {
            let ts = l["ts"].as_f64().unwrap();
            let read = l["read_s"]
                .as_f64()
                .expect("read_s in every start and interval record");
            1 + done_between(series, ts, ts + read)
        })
        .collect()
}

/// The client's transaction count, polled every 2 ms with its Unix time until the flag is set.
fn poll(
    done: Arc<std::sync::atomic::AtomicU32>,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<Vec<(f64, u32)>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let poller = std::thread::spawn(move || {
        let mut series = Vec::new();
        while !stop2.load(Ordering::Relaxed) {
            series.push((unix_now(), done.load(Ordering::Relaxed)));
            std::thread::sleep(Duration::from_millis(2));
        }
        series
    });
    (stop, poller)
}

/// The two views' totals over the run, when they differ by more than `bound`.
fn totals_differ(counts: &[(f64, f64, BTreeMap<String, u64>)], bound: i64) -> Option<String> {
    let total = |v: &str| -> i64 {
        counts
            .iter()
            .map(|c| c.2.get(v).copied().unwrap_or(0) as i64)
            .sum()
    };
    ((total("tcp") - total("sampler")).abs() > bound).then(|| {
        format!(
            "the run's totals differ by more than {bound}: tcp {}, sampler {}",
            total("tcp"),
            total("sampler")
        )
    })
}

#[test]
fn a_flow_running_before_observe_has_the_same_first_window_in_both_views() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:{PORT}").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 1).unwrap();
    let client = RrClient::start(&p.a, server, 1, THINK).unwrap();
    let (stop, poller) = poll(client.transactions.clone());
    std::thread::sleep(Duration::from_secs(1)); // the flow runs before observe starts
    let iface = format!("{}:{}", p.a.name, p.a_if);
    let lines = observe_json(
        &[
            "--netns",
            &p.a.name,
            "--view",
            "tcp,sampler",
            "--iface",
            &iface,
            "--port",
            &PORT.to_string(),
            "--interval",
            "2s",
            "--duration",
            "6500ms",
        ],
        Duration::from_secs(90),
    )
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    let series = poller.join().unwrap();
    let counts = client_counts(&lines, client.local.port());
    let before = &last_interval_counters(&lines, "tcp")["samples_before_window"];
    let slack = edge_slacks(&lines, &series);
    assert_eq!(slack.len(), counts.len() + 1, "{lines:#?}");
    eprintln!("edge slacks (1 + transactions completed while the views were read): {slack:?}");
    let mut failures = Vec::new();
    for (i, (from, to, per_view)) in counts.iter().enumerate() {
        let (tcp, sam) = (
            per_view.get("tcp").copied().unwrap_or(0),
            per_view.get("sampler").copied().unwrap_or(0),
        );
        let truth = done_between(&series, *from, *to);
        let len = to - from;
        let bound = (slack[i] + slack[i + 1]).max(3);
        let what = format!(
            "interval {i} ({len:.3} s): tcp {tcp}, sampler {sam}, transactions {truth} (bound {bound})"
        );
        eprintln!("{what}");
        if (tcp as i64 - sam as i64).abs() > bound {
            failures.push(format!("{what}: the views differ by more than {bound}"));
        }
        for (view, n) in [("tcp", tcp), ("sampler", sam)] {
            if (n as i64 - truth).abs() > bound {
                failures.push(format!(
                    "{what}: {view} differs from the transactions by more than {bound}"
                ));
            }
        }
    }
    // A request TCP sent again (a tail loss probe when the host stalls the server) gives TCP no
    // sample (Karn) and the sampler one: the flow's own retransmissions widen the bound.
    let local = format!("{A_ADDR}:{}", client.local.port());
    let retrans = end_flow(&lines, &p.a.name, &local)
        .and_then(|f| f["tcp"]["retrans"].as_i64())
        .unwrap_or(0);
    let edges = slack[0].max(slack[slack.len() - 1]);
    failures.extend(totals_differ(&counts, edges + retrans));
    eprintln!("tcp samples_before_window: {before}");
    assert!(counts.len() >= 3, "fewer than 3 intervals: {lines:#?}");
    assert!(
        before.as_u64().unwrap_or(0) > 0,
        "the TCP view, attached first, took no sample before the window: {before}"
    );
    let sampler: Vec<String> = last_interval_counters(&lines, "sampler")
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| v.as_u64().unwrap_or(0) > 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    assert!(
        failures.is_empty(),
        "{}\nthe sampler's counters: {}",
        failures.join("\n"),
        sampler.join(", ")
    );
}
