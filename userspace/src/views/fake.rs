//! A fake view for the glue's unit tests (the session, observe's report loop): no kernel, a
//! script of samples per read. It plays one of the registry's kinds (its column in the rows),
//! fills rows, totals, counters, handshakes and the sink through [`ReadCtx`] as a real view
//! does, leaves what it held before the window's start out of its whole run as the real views
//! do, and counts what it was asked. The kernel side is the privileged suite's.
use std::collections::{BTreeMap, VecDeque};

use anyhow::Result;

use crate::analysis::flow::{Flow, Side};
use crate::analysis::hist::Hist;
use crate::analysis::records::{EndFlow, EndView, FlowRow, ViewStats};
use crate::views::view::{
    Ask, Attached, Counters, Known, ReadCtx, RunFlows, SideTotals, View, ViewRead,
};
use crate::views::{LoaderKind, PassiveView, RawSamples, ViewKind};

/// One flow's samples in one read of the script.
pub type Step = Vec<(Flow, Side, Vec<u32>)>;

/// A view that reads its script, one step per interval (nothing once it runs out).
pub struct FakeView {
    kind: ViewKind,
    script: VecDeque<Step>,
    /// Samples taken before the window's start (the window-start read returns them).
    pub before: Step,
    /// Handshakes by read: the window-start read takes the first, each interval the next
    /// (none once it runs out); the summary takes `handshakes_at_end`.
    pub handshakes: VecDeque<SideTotals>,
    pub handshakes_at_end: SideTotals,
    /// Every flow's samples since the start, for the summary.
    whole: BTreeMap<Flow, (Side, Hist)>,
    /// Notices it has to say at the next ask.
    pub notices: Vec<String>,
    /// What it was asked: reads, reads between reports.
    pub reads: u64,
    pub between: u64,
    /// The sides it answers later views (side_of).
    pub knows: BTreeMap<Flow, Side>,
}

impl FakeView {
    /// A fake playing `kind`, reading `script`.
    pub fn new(kind: ViewKind, script: Vec<Step>) -> FakeView {
        FakeView {
            kind,
            script: script.into(),
            before: Vec::new(),
            handshakes: VecDeque::new(),
            handshakes_at_end: SideTotals::new(),
            whole: BTreeMap::new(),
            notices: Vec::new(),
            reads: 0,
            between: 0,
            knows: BTreeMap::new(),
        }
    }

    /// A flow on loopback from `port` to 80, in the observer's namespace 1.
    pub fn flow(port: u16) -> Flow {
        Flow::new(
            1,
            format!("127.0.0.1:{port}").parse().unwrap(),
            "127.0.0.1:80".parse().unwrap(),
        )
    }

    fn samples(&self) -> u64 {
        self.whole.values().map(|(_, h)| h.count()).sum()
    }
}

/// A histogram of these samples.
pub fn hist(rtts: &[u32]) -> Hist {
    let mut h = Hist::default();
    for &r in rtts {
        h.record(r);
    }
    h
}

impl PassiveView for FakeView {
    fn kind(&self) -> ViewKind {
        self.kind
    }

    fn loader(&self) -> LoaderKind {
        LoaderKind::DEFAULT
    }

    fn prog_ids(&self) -> Vec<(String, u32)> {
        Vec::new()
    }

    fn counters(&self) -> Result<Counters> {
        Ok(BTreeMap::from([
            ("reads", self.reads),
            ("samples", self.samples()),
        ]))
    }

    fn raw_samples(&mut self) -> Result<RawSamples> {
        anyhow::bail!("the fake view has no raw samples")
    }

    fn has_raw_samples(&self) -> bool {
        false
    }
}

impl View for FakeView {
    fn attached(&self) -> Result<Attached> {
        Ok(Attached {
            notes: vec!["a fake view".into()],
            ..Attached::new(
                self.kind,
                "fake".into(),
                serde_json::json!({ "fake": true }),
                |c| format!("{} samples", c.get("samples").copied().unwrap_or(0)),
            )
        })
    }

    fn between_reads(&mut self, _ctx: &mut ReadCtx<'_, '_>) -> Result<()> {
        self.between += 1;
        Ok(())
    }

    /// The script's next step (the window's start: the samples before it): each flow's samples
    /// into its row (the side a view read before this one found wins over the script's), the
    /// totals and the sink.
    fn read(&mut self, ctx: &mut ReadCtx<'_, '_>) -> Result<ViewRead> {
        self.reads += 1;
        let mut totals = SideTotals::new();
        let step = match ctx.window_start {
            true => std::mem::take(&mut self.before),
            false => self.script.pop_front().unwrap_or_default(),
        };
        for (flow, side, rtts) in step {
            let side = match ctx.side_of(&flow) {
                Side::Unknown => side,
                s => s,
            };
            let h = hist(&rtts);
            totals.entry(side).or_default().merge(&h);
            if ctx.keep_rows {
                ctx.row(&flow, side)
                    .views
                    .set(self.kind, ViewStats::from_hist(&h));
            }
            ctx.export(self.kind, &flow, side, None, &h);
            if !ctx.window_start {
                let w = self.whole.entry(flow).or_insert((side, Hist::default()));
                w.1.merge(&h);
            }
        }
        Ok(ViewRead {
            totals,
            counters: ctx.finish_counters(self.counters()?),
            hooks: Vec::new(),
            handshakes: self.handshakes.pop_front().unwrap_or_default(),
        })
    }

    fn summary(&mut self, ctx: &mut ReadCtx<'_, '_>, flows: &mut RunFlows) -> Result<ViewRead> {
        let mut totals = SideTotals::new();
        for (flow, (side, h)) in &self.whole {
            totals.entry(*side).or_default().merge(h);
            let name = ctx.names.get(flow.netns);
            let entry = flows.entry(*flow).or_insert_with(|| {
                let e = EndFlow::new(flow, name.clone(), *side);
                (e, FlowRow::new(flow, name, *side))
            });
            entry.0.views.set(self.kind, EndView::of(h));
            entry.1.views.set(self.kind, ViewStats::from_hist(h));
        }
        Ok(ViewRead {
            totals,
            counters: ctx.finish_counters(self.counters()?),
            hooks: Vec::new(),
            handshakes: std::mem::take(&mut self.handshakes_at_end),
        })
    }

    fn notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// The sides in `knows`; its flows by their ends: those it knows a side of.
    fn knows(&self, ask: Ask<'_>) -> Known {
        match ask {
            Ask::Flow(flow) => Known {
                side: self.knows.get(flow).copied(),
                ..Known::default()
            },
            Ask::Ends => Known {
                by_ends: self
                    .knows
                    .keys()
                    .map(|f| ((f.local, f.remote), *f))
                    .collect(),
                ..Known::default()
            },
        }
    }
}
