//! Values as drawn (NaN left out, huge and tiny values clamped, so no input can hang the axis
//! arithmetic) and the axes' ranges.
use std::ops::Range;

use crate::analysis::results::ViewSeries;

/// Largest magnitude drawn on the time and sweep-parameter axes; beyond it values are clamped
/// (`results::load` refuses them; library callers may pass anything).
const AXIS_MAX: f64 = crate::analysis::results::MAX_ABS_TIME;
/// Time and parameter values smaller than this in magnitude are drawn at 0.
const AXIS_TINY: f64 = 1e-9;
/// Positive RTTs are drawn between 1 ns and `MAX_RTT_US` (clamped): a subnormal RTT or an infinite
/// one must not reach the axis arithmetic, where plotters' tick loops never end.
const RTT_MIN_MS: f64 = 1e-6;
const RTT_MAX_MS: f64 = crate::analysis::results::MAX_RTT_US / 1000.0;

/// A time or parameter value as drawn: `None` for NaN, clamped to +-`AXIS_MAX`, tiny ones as 0.
pub(super) fn axis_value(v: f64) -> Option<f64> {
    if v.is_nan() {
        return None;
    }
    let v = v.clamp(-AXIS_MAX, AXIS_MAX);
    Some(if v.abs() < AXIS_TINY { 0.0 } else { v })
}

/// An RTT in microseconds as drawn, in ms: `None` for NaN or negative, 0 stays 0, positive
/// values clamped to `RTT_MIN_MS..=RTT_MAX_MS`.
pub(super) fn rtt_ms(us: f64) -> Option<f64> {
    if us.is_nan() || us < 0.0 {
        return None;
    }
    let ms = us / 1000.0;
    Some(if ms == 0.0 {
        0.0
    } else {
        ms.clamp(RTT_MIN_MS, RTT_MAX_MS)
    })
}

/// The drawable points of a view: (time s, RTT ms), cleaned as above.
pub(super) fn points(v: &ViewSeries) -> impl Iterator<Item = Pt> + '_ {
    v.samples
        .iter()
        .filter_map(|s| Some((axis_value(s.t_s())?, rtt_ms(s.rtt_us)?)))
}

/// Padded range for an axis; never empty, never narrower than a millionth of its values'
/// magnitude (narrower spans cannot be divided into ticks in f64), never beyond +-`AXIS_MAX`.
pub(super) fn pad(lo: f64, hi: f64) -> Range<f64> {
    if !(lo.is_finite() && hi.is_finite()) || lo > hi {
        return 0.0..1.0;
    }
    let (lo, hi) = (lo.clamp(-AXIS_MAX, AXIS_MAX), hi.clamp(-AXIS_MAX, AXIS_MAX));
    let span = hi - lo;
    let mag = lo.abs().max(hi.abs());
    let min_span = (mag * 1e-6).max(AXIS_TINY);
    if span < min_span {
        let d = if mag == 0.0 {
            1.0
        } else {
            (mag * 0.1).max(min_span)
        };
        return (lo - d)..(hi + d);
    }
    (lo - span * 0.03)..(hi + span * 0.05)
}

/// A point of a series: (x, y).
pub(super) type Pt = (f64, f64);

/// Views whose RTTs differ by more than this factor get a log RTT axis in the time series.
pub(super) const LOG_AXIS_RATIO: f64 = 30.0;
