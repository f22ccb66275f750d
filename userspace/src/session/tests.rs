//! The session against fake views (no kernel, no root): what it reads into rows, totals,
//! counters, handshakes and the sink, in registry order, the window's start, and the whole run.
use super::*;
use crate::analysis::flow::Side;
use crate::views::fake::FakeView;

fn config(keep_rows: bool) -> SessionConfig {
    SessionConfig {
        loader: LoaderKind::DEFAULT,
        views: Vec::new(),
        keep_rows,
        workloads: false,
        keep_summary: true,
        raw_samples: false,
    }
}

/// Two fakes in registry order: the first (playing TCP) knows flow 1000's side and has
/// samples of it; the second (playing the sampler) has samples of flow 1000 without a side,
/// and of flow 2000 on the server side, over two reads.
fn two_views() -> Vec<Box<dyn View>> {
    let (a, b) = (FakeView::flow(1000), FakeView::flow(2000));
    let mut first = FakeView::new(
        ViewKind::Tcp,
        vec![vec![(a, Side::Client, vec![1000, 3000])], vec![]],
    );
    first.knows.insert(a, Side::Client);
    first.notices.push("first view's notice".into());
    let second = FakeView::new(
        ViewKind::Sampler,
        vec![
            vec![(a, Side::Unknown, vec![2000]), (b, Side::Server, vec![500])],
            vec![(b, Side::Server, vec![700, 900])],
        ],
    );
    vec![Box::new(first), Box::new(second)]
}

/// Every flow delta the sink was handed: (view, local port, side, samples).
#[derive(Default)]
struct Deltas(Vec<(ViewKind, u16, Side, u64)>);

impl FlowSink for Deltas {
    fn flow_delta(&mut self, view: ViewKind, d: &FlowDelta<'_>) {
        self.0
            .push((view, d.flow.local.port(), d.side, d.delta.count()));
    }
}

#[test]
fn an_interval_is_each_views_column_of_each_flow() {
    let mut s = Session::of_views(two_views(), &config(true)).unwrap();
    assert_eq!(s.check_vanished(), ["first view's notice"]);
    let mut sink = Deltas::default();
    let read = s.read_interval(Some(&mut sink)).unwrap();
    let iv = &read.interval;
    assert_eq!(iv.flows.len(), 2, "{:?}", iv.flows);
    let row = |port: u16| {
        let f = iv
            .flows
            .iter()
            .find(|r| r.local.ends_with(&format!(":{port}")));
        f.unwrap_or_else(|| panic!("no row of :{port}: {:?}", iv.flows))
    };
    // flow 1000: both columns, the side the first view found (the second's script had none)
    let a = row(1000);
    assert_eq!(a.side, Side::Client);
    assert_eq!(a.views.get(ViewKind::Tcp).unwrap().summary.n, 2);
    assert_eq!(a.views.get(ViewKind::Sampler).unwrap().summary.n, 1);
    let b = row(2000);
    assert!(b.views.get(ViewKind::Tcp).is_none());
    assert_eq!(
        (b.side, b.views.get(ViewKind::Sampler).unwrap().summary.n),
        (Side::Server, 1)
    );
    // totals by view and side, counters by view, the merged histogram of each
    assert_eq!(iv.totals["tcp"]["client"].summary.n, 2);
    assert_eq!(iv.totals["sampler"]["client"].summary.n, 1);
    assert_eq!(iv.totals["sampler"]["server"].summary.n, 1);
    // the window's start, then this one
    assert_eq!(iv.counters["sampler"]["reads"], 2);
    assert_eq!(read.totals_hist["sampler"].count(), 2);
    assert_eq!(
        sink.0,
        [
            (ViewKind::Tcp, 1000, Side::Client, 2),
            (ViewKind::Sampler, 1000, Side::Client, 1),
            (ViewKind::Sampler, 2000, Side::Server, 1)
        ]
    );
    // nothing new to say
    assert!(s.check_vanished().is_empty());
}

#[test]
fn the_whole_run_holds_every_read() {
    let mut s = Session::of_views(two_views(), &config(true)).unwrap();
    s.between_reads(None).unwrap();
    for _ in 0..2 {
        s.read_interval(None).unwrap();
    }
    let run = s.summary().unwrap();
    assert_eq!(run.flows.len(), 2);
    assert_eq!(run.counters["tcp"]["reads"], 3);
    assert_eq!(run.counters["sampler"]["samples"], 4);
    assert_eq!(run.totals["sampler"][&Side::Server].count(), 3);
    let iv = run.as_interval(2.0);
    assert_eq!(iv.t, 2.0);
    assert_eq!(iv.totals["sampler"]["server"].summary.n, 3);
    let b = iv
        .flows
        .iter()
        .find(|r| r.local.ends_with(":2000"))
        .unwrap();
    assert_eq!(b.views.get(ViewKind::Sampler).unwrap().summary.n, 3);
}

#[test]
fn without_rows_only_totals_and_counters() {
    let mut s = Session::of_views(two_views(), &config(false)).unwrap();
    let read = s.read_interval(None).unwrap();
    assert!(read.interval.flows.is_empty());
    assert_eq!(read.interval.totals["tcp"]["client"].summary.n, 2);
    assert_eq!(s.view(ViewKind::Sampler).unwrap().kind(), ViewKind::Sampler);
    assert!(s.has_views());
}

/// A histogram by side of these samples.
fn by_side(side: Side, rtts: &[u32]) -> SideTotals {
    SideTotals::from([(side, crate::views::fake::hist(rtts))])
}

#[test]
fn what_came_before_the_window_is_counted_and_left_out() {
    let (a, b) = (FakeView::flow(1000), FakeView::flow(2000));
    let mut views = two_views();
    let mut first = FakeView::new(ViewKind::Tcp, vec![vec![(a, Side::Client, vec![1000])]]);
    first.before = vec![(a, Side::Client, vec![5000, 6000])];
    let mut second = FakeView::new(ViewKind::Sampler, vec![]);
    second.before = vec![(b, Side::Server, vec![100])];
    (views[0], views[1]) = (Box::new(first), Box::new(second));
    let mut s = Session::of_views(views, &config(true)).unwrap();
    assert!(s.window_start_ns() > 0);
    let mut sink = Deltas::default();
    let read = s.read_interval(Some(&mut sink)).unwrap();
    let iv = &read.interval;
    assert_eq!(sink.0, [(ViewKind::Tcp, 1000, Side::Client, 1)]);
    assert_eq!(
        iv.flows.len(),
        1,
        "no row of the window's start: {:?}",
        iv.flows
    );
    assert_eq!(iv.totals["tcp"]["client"].summary.n, 1);
    assert!(iv.totals["sampler"].is_empty(), "{:?}", iv.totals);
    assert_eq!(iv.counters["tcp"]["samples_before_window"], 2);
    assert_eq!(iv.counters["sampler"]["samples_before_window"], 1);
    let run = s.summary().unwrap();
    assert_eq!(run.totals["tcp"][&Side::Client].count(), 1);
    assert!(
        !run.totals.contains_key("sampler"),
        "{:?}",
        run.totals.keys()
    );
    assert_eq!(run.counters["tcp"]["samples_before_window"], 2);
    assert_eq!(run.counters["sampler"]["samples_before_window"], 1);
    assert_eq!(run.flows.len(), 1);
}

#[test]
fn handshakes_by_interval_and_over_the_run() {
    let mut views = two_views();
    let mut first = FakeView::new(ViewKind::Tcp, vec![]);
    first.handshakes = [
        by_side(Side::Client, &[100]), // before the window: left out
        by_side(Side::Client, &[200, 300]),
        SideTotals::new(),
    ]
    .into();
    first.handshakes_at_end = by_side(Side::Server, &[400]);
    views[0] = Box::new(first);
    let mut s = Session::of_views(views, &config(false)).unwrap();
    let one = s.read_interval(None).unwrap();
    assert_eq!(one.handshakes[&ViewKind::Tcp][&Side::Client].count(), 2);
    assert!(!one.handshakes.contains_key(&ViewKind::Sampler));
    assert_eq!(one.interval.handshakes["tcp"]["client"].summary.n, 2);
    let two = s.read_interval(None).unwrap();
    assert!(two.handshakes.is_empty() && two.interval.handshakes.is_empty());
    let run = s.summary().unwrap();
    assert_eq!(run.handshakes.len(), 1, "{:?}", run.handshakes.keys());
    let tcp = &run.handshakes[&ViewKind::Tcp];
    assert_eq!(tcp[&Side::Client].count(), 2, "the window's start left out");
    assert_eq!(tcp[&Side::Server].count(), 1, "the summary's own");
    let iv = run.as_interval(2.0);
    assert_eq!(iv.handshakes["tcp"]["server"].summary.n, 1);
}
