//! Every attached view's raw samples through one reader (`observe --raw`,
//! `compare`): each ring-buffer record as its view decoded it
//! ([`RawSample`]), with the side of a flow whose handshake its view did not
//! see resolved as the flow's row has it ([`resolve_sides`]: the view's own
//! label, else what the views before it found, else its own last resort).
//! Records a view could not decode are counted per view
//! ([`RawStreams::bad_records`]), never dropped silently. The session's
//! `drain_raw`, `next_raw` and `raw_records_bad_total` are these.
use anyhow::Result;

use crate::analysis::flow::Side;
use crate::views::view::{Ask, View};
use crate::views::{PassiveView, RawSample, RawSamples, ViewKind};

/// The raw-sample streams of the attached views, in attach order (none
/// unless raw samples were asked for).
#[derive(Default)]
pub(crate) struct RawStreams(Vec<RawSamples>);

impl RawStreams {
    /// Each attached view's stream, when raw samples were asked for. Must be
    /// called inside a tokio runtime.
    pub(super) fn open(asked: bool, views: Vec<&mut dyn PassiveView>) -> Result<Self> {
        let mut streams = Vec::new();
        if asked {
            for v in views.into_iter().filter(|v| v.has_raw_samples()) {
                streams.push(v.raw_samples()?);
            }
        }
        Ok(RawStreams(streams))
    }

    /// Every record available now, of every stream (in attach order),
    /// without waiting; returns how many were read (bad ones included).
    pub(super) fn drain_now(&mut self, out: &mut Vec<RawSample>) -> Result<usize> {
        let mut n = 0;
        for s in self.0.iter_mut() {
            n += s.drain_now(out)?;
        }
        Ok(n)
    }

    /// Wait until some stream is readable (never, with none). Cancel-safe.
    pub(super) async fn readable(&mut self) -> Result<()> {
        let streams = &mut self.0;
        std::future::poll_fn(|cx| {
            let mut ready = false;
            for s in streams.iter_mut() {
                match s.poll_readable(cx) {
                    std::task::Poll::Ready(Err(e)) => return std::task::Poll::Ready(Err(e)),
                    std::task::Poll::Ready(Ok(())) => ready = true,
                    std::task::Poll::Pending => {}
                }
            }
            if ready {
                std::task::Poll::Ready(Ok(()))
            } else {
                std::task::Poll::Pending
            }
        })
        .await
    }

    /// A view's raw records that were too short or that it could not decode
    /// (None: its raw samples are not read).
    pub(super) fn bad_records(&self, view: ViewKind) -> Option<u64> {
        self.0
            .iter()
            .find(|s| s.view() == view)
            .map(|s| s.bad_records)
    }

    /// Every view's bad raw records together (0 when raw samples are not read).
    pub(super) fn bad_total(&self) -> u64 {
        self.0.iter().map(|s| s.bad_records).sum()
    }
}

/// Each sample's side: the view's label, else (a TCP flow whose handshake
/// its view did not see) what the views before it found, else its own
/// view's last resort (the sampler: the socket table).
pub(super) fn resolve_sides(views: &mut [Box<dyn View>], samples: &mut [RawSample]) {
    for s in samples.iter_mut() {
        if s.proto.is_some() || s.side != Side::Unknown {
            continue;
        }
        let Some(i) = views.iter().position(|v| v.kind() == s.view) else {
            continue;
        };
        let (earlier, rest) = views.split_at_mut(i);
        s.side = match earlier
            .iter()
            .find_map(|v| v.knows(Ask::Flow(&s.flow)).side)
        {
            Some(known) => known,
            None => rest[0].resolve_side(&s.flow),
        };
    }
}
