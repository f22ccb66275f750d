//! A fake view for the glue's unit tests (the session, observe's report loop): no kernel, a
//! script of samples per read. It plays one of the registry's kinds (its column in the rows),
//! fills rows, totals, counters and the sink through [`ReadCtx`] as a real view does, and
//! counts what it was asked. The kernel side is the privileged suite's.
use std::collections::{BTreeMap, VecDeque};

use anyhow::Result;

use crate::analysis::flow::{Flow, Side};
use crate::analysis::hist::Hist;
use crate::analysis::records::{EndFlow, EndView, FlowRow, ViewStats};
use crate::views::view::{
    Attached, Counters, Known, ReadCtx, RunFlows, SideTotals, View, ViewRead,
};
use crate::views::{LoaderKind, PassiveView, RawSamples, ViewKind};

/// One flow's samples in one read of the script.
pub type Step = Vec<(Flow, Side, Vec<u32>)>;

/// A view that reads its script, one step per interval (nothing once it runs out).
pub struct FakeView {
    kind: ViewKind,
    script: VecDeque<Step>,
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
            whole: BTreeMap::new(),
            notices: Vec::new(),
            reads: 0,
            between: 0,
            knows: BTreeMap::new(),
        }
    }

    /// A flow on loopback from `port` to 80, in the observer's namespace 1.
    pub fn flow(port: u16) -> Flow {
        Flow {
            netns: 1,
            local: format!("127.0.0.1:{port}").parse().unwrap(),
            remote: "127.0.0.1:80".parse().unwrap(),
        }
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

    /// The script's next step: each flow's samples into its row (the side a view read before
    /// this one found wins over the script's), the totals and the sink.
    fn read(&mut self, ctx: &mut ReadCtx<'_, '_>) -> Result<ViewRead> {
        self.reads += 1;
        let mut totals = SideTotals::new();
        for (flow, side, rtts) in self.script.pop_front().unwrap_or_default() {
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
            let w = self.whole.entry(flow).or_insert((side, Hist::default()));
            w.1.merge(&h);
        }
        Ok(ViewRead {
            totals,
            counters: ctx.finish_counters(self.counters()?),
            hooks: Vec::new(),
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
        })
    }

    fn notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    fn knows(&self, flow: &Flow) -> Known {
        Known {
            side: self.knows.get(flow).copied(),
            owner: None,
        }
    }
}
