//! `rttscope sample` (hidden): the sampler view on its own, for testing the
//! kernel side before `observe --view sampler` folds it in. Prints per-flow
//! sampler statistics, counters and settings, as a table or JSON Lines.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Value};

use crate::analysis::hist::{bucket_bounds, Hist};
use crate::analysis::units::{duration_arg, fmt_ms};
use crate::views::sampler::{AttachMode, IfaceSpec, Matching, SamplerConfig, SamplerFlowStats};

#[derive(Debug, Clone, Args)]
pub struct SampleArgs {
    /// Interface to sample at ingress and egress: NAME (current namespace) or NETNS:NAME; repeatable.
    #[arg(long = "iface", value_name = "[NETNS:]NAME", required = true)]
    pub ifaces: Vec<IfaceSpec>,
    /// Sample each packet, in each direction, with probability 1/N.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub sample_every: u32,
    /// How segments and acknowledgements are paired.
    #[arg(long = "match", value_enum, default_value = "seq")]
    pub matching: Matching,
    /// tcx links (kernel >= 6.6), clsact filters, or tcx falling back to clsact.
    #[arg(long, value_enum, default_value = "auto")]
    pub attach: AttachMode,
    /// Report interval.
    #[arg(long, default_value = "1s", value_parser = duration_arg)]
    pub interval: Duration,
    /// Stop after this long (default: until Ctrl-C / SIGTERM).
    #[arg(long, value_parser = duration_arg)]
    pub duration: Option<Duration>,
    /// JSON Lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also print every raw sample.
    #[arg(long)]
    pub raw: bool,
    /// Flows kept in the kernel's flow table (histogram and pending segments per flow, 1 KiB each;
    /// rounded up to a power of two, LRU within each set of 4).
    #[arg(long, default_value_t = 16384)]
    pub max_flows: u32,
    /// Kept for compatibility: the flow table holds max(--max-flows, --max-pending) flows.
    #[arg(long, default_value_t = 16384)]
    pub max_pending: u32,
    /// Drop a pending segment not acknowledged within this time.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    pub pending_timeout: Duration,
}

fn settings_json(cfg: &SamplerConfig) -> Value {
    json!({
        "view": "sampler",
        "sample_every": cfg.sample_every,
        "match": cfg.matching.as_str(),
        "pending_timeout_ms": cfg.pending_timeout.as_secs_f64() * 1000.0,
        "max_flows": cfg.max_flows,
        "max_pending": cfg.max_pending,
        "table_entries": cfg.table_entries(),
        "raw": cfg.raw,
        "attach_mode": cfg.attach,
    })
}

/// Non-empty buckets as [lower bound us, upper bound us, count].
fn sparse(h: &Hist) -> Vec<Value> {
    h.counts
        .iter()
        .enumerate()
        .filter(|(_, &c)| c > 0)
        .map(|(i, &c)| {
            let (lo, hi) = bucket_bounds(i);
            json!([
                lo,
                if hi.is_finite() {
                    json!(hi)
                } else {
                    Value::Null
                },
                c
            ])
        })
        .collect()
}

fn flow_json(f: &SamplerFlowStats, prev: Option<&SamplerFlowStats>) -> Value {
    let s = f.hist.summary();
    let interval = prev
        .map(|p| f.hist.delta(&p.hist))
        .unwrap_or_else(|| f.hist.clone());
    let num = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
    json!({
        "netns": f.flow.netns,
        "local": f.flow.local.to_string(),
        "remote": f.flow.remote.to_string(),
        "iface": f.iface,
        "samples": f.samples,
        "interval_samples": interval.count(),
        "interval_min_us": f.interval_min_us,
        "interval_max_us": f.interval_max_us,
        "last_rtt_us": f.last_rtt_us,
        "min_us": num(s.min_us),
        "mean_us": num(s.mean_us),
        "p50_us": num(s.p50_us),
        "p90_us": num(s.p90_us),
        "p99_us": num(s.p99_us),
        "max_us": num(s.max_us),
        "hist": sparse(&f.hist),
    })
}

fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(t) => t,
                    Err(_) => return,
                };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            }
            s2.store(true, Ordering::Relaxed);
        });
    });
    stop
}

pub fn run(args: SampleArgs) -> Result<()> {
    let cfg = SamplerConfig {
        sample_every: args.sample_every,
        matching: args.matching,
        raw: args.raw,
        max_flows: args.max_flows,
        max_pending: args.max_pending,
        pending_timeout: args.pending_timeout,
        attach: args.attach,
    };
    if args.interval.is_zero() {
        anyhow::bail!("--interval must be positive");
    }
    let stop = stop_flag();
    // The raw-sample stream registers its fd with a tokio reactor.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _rt = rt.enter();
    let mut view =
        crate::views::attach_sampler(crate::views::LoaderKind::DEFAULT, &args.ifaces, cfg.clone())
            .context("starting the sampler view")?;
    let mut raw = if args.raw {
        Some(view.raw_samples()?)
    } else {
        None
    };
    let settings = settings_json(&cfg);
    let attach = serde_json::to_value(view.attach_info())?;
    let progs: Vec<Value> = view
        .prog_ids()
        .into_iter()
        .map(|(n, id)| json!({"name": n, "id": id}))
        .collect();
    if args.json {
        println!(
            "{}",
            json!({"type": "sampler_start", "settings": settings, "attach": attach, "progs": progs})
        );
    } else {
        println!(
            "view sampler | sample 1/{} | match {} | pending timeout {} ms",
            cfg.sample_every,
            cfg.matching.as_str(),
            cfg.pending_timeout.as_millis()
        );
        for a in view.attach_info() {
            println!(
                "  {} (netns {} inode {}, ifindex {}): {}",
                a.iface, a.netns, a.netns_inode, a.ifindex, a.how
            );
        }
    }
    let start = Instant::now();
    let mut prev: Vec<SamplerFlowStats> = Vec::new();
    loop {
        let elapsed = start.elapsed();
        let mut wait = args.interval;
        let mut last = false;
        if let Some(d) = args.duration {
            if elapsed + wait >= d {
                wait = d.saturating_sub(elapsed);
                last = true;
            }
        }
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            let step = (deadline - Instant::now()).min(Duration::from_millis(100));
            std::thread::sleep(step);
            if let Some(r) = raw.as_mut() {
                let mut evs = Vec::new();
                r.drain_now(&mut evs)?;
                for s in evs
                    .iter()
                    .filter_map(crate::views::sampler::SamplerSample::from_event)
                {
                    if args.json {
                        println!("{}", json!({"type": "sampler_sample", "sample": s}));
                    } else {
                        println!(
                            "  sample {} {} rtt {} ms",
                            s.flow,
                            s.ts_ns,
                            fmt_ms(s.rtt_us as f64)
                        );
                    }
                }
            }
        }
        let stopping = last || stop.load(Ordering::Relaxed);
        let flows = view.read_flows()?;
        let counters = view.counters()?;
        if args.json {
            let fl: Vec<Value> = flows
                .iter()
                .map(|f| flow_json(f, prev.iter().find(|p| p.flow == f.flow)))
                .collect();
            println!(
                "{}",
                json!({
                    "type": "sampler_report",
                    "final": stopping,
                    "elapsed_s": start.elapsed().as_secs_f64(),
                    "settings": settings,
                    "attach": attach,
                    "flows": fl,
                    "counters": counters,
                })
            );
        } else {
            println!(
                "-- {:.1}s | view sampler | sample 1/{} | match {}",
                start.elapsed().as_secs_f64(),
                cfg.sample_every,
                cfg.matching.as_str()
            );
            println!(
                "  {:<8} {:<44} {:>8} {:>9} {:>9} {:>9} {:>9}",
                "iface",
                "flow (data sender -> receiver)",
                "samples",
                "min ms",
                "p50 ms",
                "p90 ms",
                "max ms"
            );
            for f in &flows {
                let s = f.hist.summary();
                println!(
                    "  {:<8} {:<44} {:>8} {:>9} {:>9} {:>9} {:>9}",
                    f.iface,
                    f.flow.to_string(),
                    s.n,
                    fmt_ms(s.min_us),
                    fmt_ms(s.p50_us),
                    fmt_ms(s.p90_us),
                    fmt_ms(s.max_us)
                );
            }
            let nz: Vec<String> = counters
                .iter()
                .filter(|(_, &v)| v > 0)
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            println!("  counters: {}", nz.join(" "));
        }
        prev = flows;
        if stopping {
            break;
        }
    }
    Ok(())
}
