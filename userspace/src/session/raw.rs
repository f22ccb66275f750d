//! Every attached view's raw samples through one reader (`observe --raw`,
//! `compare`): each ring-buffer record as its view decoded it
//! ([`RawSample`]), with the side of a sampler flow whose handshake the
//! programs did not see resolved as the flow's row has it
//! (`raw_side`: the programs' label, else the TCP view's, else the socket
//! table's). Records a view could not decode are counted per view
//! ([`Session::raw_records_bad`]), never dropped silently.
use anyhow::Result;

use super::{Session, SessionConfig};
use crate::views::flow::Side;
use crate::views::{PassiveView, RawSample, RawSamples, ViewKind};

/// The raw-sample streams of the attached views, in attach order (none
/// unless [`SessionConfig::raw_samples`]).
#[derive(Default)]
pub(crate) struct RawStreams(Vec<RawSamples>);

impl RawStreams {
    /// Each attached view's stream, when raw samples were asked for. Must be
    /// called inside a tokio runtime.
    pub(super) fn open(asked: bool, views: Vec<&mut dyn PassiveView>) -> Result<Self> {
        let mut streams = Vec::new();
        if asked {
            for v in views {
                streams.push(v.raw_samples()?);
            }
        }
        Ok(RawStreams(streams))
    }
}

/// A view's raw records that were too short or that it could not decode
/// (None: its raw samples are not read).
pub(super) fn bad_records(raw: &RawStreams, view: ViewKind) -> Option<u64> {
    raw.0
        .iter()
        .find(|s| s.view() == view)
        .map(|s| s.bad_records)
}

impl SessionConfig {
    /// With raw samples asked for, every view asked for is loaded with its
    /// raw-sample ring buffer on.
    pub(super) fn with_raw_views(mut self) -> SessionConfig {
        if self.raw_samples {
            for v in self.views.iter_mut() {
                v.set_raw();
            }
        }
        self
    }
}

impl Session {
    /// Every raw sample available now, of every view (in attach order),
    /// without waiting; returns how many records were read (bad ones
    /// included). Nothing when raw samples were not asked for.
    pub fn drain_raw(&mut self, out: &mut Vec<RawSample>) -> Result<usize> {
        let from = out.len();
        let mut n = 0;
        for s in self.raw.0.iter_mut() {
            n += s.drain_now(out)?;
        }
        for s in out[from..].iter_mut() {
            s.side = self.raw_side(s);
        }
        Ok(n)
    }

    /// Wait until some view's raw samples arrive, then take every one
    /// available ([`Session::drain_raw`]). Never returns when raw samples were
    /// not asked for. Cancel-safe: nothing is read before the wait ends.
    pub async fn next_raw(&mut self, out: &mut Vec<RawSample>) -> Result<usize> {
        loop {
            let streams = &mut self.raw.0;
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
            .await?;
            let n = self.drain_raw(out)?;
            if n > 0 {
                return Ok(n);
            }
        }
    }

    /// A view's raw records that were too short or that it could not decode
    /// (None: its raw samples are not read).
    pub fn raw_records_bad(&self, view: ViewKind) -> Option<u64> {
        bad_records(&self.raw, view)
    }

    /// Every view's raw records that were too short or that it could not
    /// decode, together (0 when raw samples are not read).
    pub fn raw_records_bad_total(&self) -> u64 {
        self.raw.0.iter().map(|s| s.bad_records).sum()
    }

    /// A raw sample's side: the view's label, else (a TCP flow whose
    /// handshake its view did not see) what the views before it found,
    /// else its own view's last resort (the sampler: the socket table).
    fn raw_side(&mut self, s: &RawSample) -> Side {
        if s.proto.is_some() || s.side != Side::Unknown {
            return s.side;
        }
        let Some(i) = self.views.iter().position(|v| v.kind() == s.view) else {
            return s.side;
        };
        let (earlier, rest) = self.views.split_at_mut(i);
        match earlier.iter().find_map(|v| v.side_of(&s.flow)) {
            Some(known) => known,
            None => rest[0].resolve_side(&s.flow),
        }
    }
}
