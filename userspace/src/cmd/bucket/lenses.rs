//! The three lenses of one sample set: exact percentiles (nearest rank), the cloud metric's
//! bucketed distribution (Cloud Monitoring's ALIGN_PERCENTILE interpolation, also per alignment
//! period) and netperf's histogram.
use serde::Serialize;

use crate::analysis::dist::{self, align, BucketOptions, Distribution, ValueUnit};
use crate::analysis::input::SampleSet;
// The one percentile of exact samples (docs/results.md): the nearest rank, an observed value.
use crate::analysis::stats::percentile_sorted as nearest_rank;

/// Which way a percentile was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Lens {
    /// From the samples themselves (nearest rank).
    Exact,
    /// From the Cloud Monitoring distribution (bucket interpolation).
    Cloud,
    /// From netperf's log-linear histogram.
    Netperf,
}

/// The requested percentiles through one lens; `values_us[i]` belongs to `percentiles[i]` of the
/// enclosing report (`None` when there are no samples).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LensValues {
    pub lens: Lens,
    /// How the lens computes a percentile, for the reader.
    pub method: String,
    pub values_us: Vec<Option<f64>>,
    /// True where the value is only a lower limit (percentile in the cloud overflow bucket).
    pub open_above: Vec<bool>,
}

/// One aligned period of the cloud series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AlignedRow {
    pub start_s: f64,
    pub end_s: f64,
    pub count: u64,
    pub values_us: Vec<Option<f64>>,
}

/// Everything `bucket` reports about one sample set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BucketReport {
    pub name: String,
    pub count: usize,
    pub min_us: Option<f64>,
    pub mean_us: Option<f64>,
    pub max_us: Option<f64>,
    pub percentiles: Vec<f64>,
    pub lenses: Vec<LensValues>,
    /// The cloud distribution of all samples.
    pub distribution: Distribution,
    /// Per alignment period (timed input only).
    pub alignment_period_s: f64,
    pub aligned: Vec<AlignedRow>,
}

/// The lenses for one sample set.
pub fn analyze(
    set: &SampleSet,
    layout: &BucketOptions,
    unit: ValueUnit,
    percentiles: &[f64],
    period_s: f64,
) -> anyhow::Result<BucketReport> {
    let mut sorted: Vec<f64> = set.samples.iter().map(|s| s.rtt_us).collect();
    sorted.sort_by(f64::total_cmp);
    let count = sorted.len();

    let exact = LensValues {
        lens: Lens::Exact,
        method: "nearest rank over the sorted samples".into(),
        values_us: percentiles
            .iter()
            .map(|&p| (count > 0).then(|| nearest_rank(&sorted, p)))
            .collect(),
        open_above: vec![false; percentiles.len()],
    };

    let mut distribution = Distribution::new(layout.clone(), unit);
    for s in &set.samples {
        distribution.add_us(s.rtt_us);
    }
    let cloud = cloud_lens(&distribution, percentiles, unit)?;
    let netperf = netperf_lens(set, percentiles);
    let lenses = vec![exact, netperf, cloud];

    let aligned = if set.timed {
        aligned_rows(set, period_s, layout, unit, percentiles)?
    } else {
        Vec::new()
    };

    let mean = (count > 0).then(|| sorted.iter().sum::<f64>() / count as f64);
    Ok(BucketReport {
        name: set.name.clone(),
        count,
        min_us: sorted.first().copied(),
        mean_us: mean,
        max_us: sorted.last().copied(),
        percentiles: percentiles.to_vec(),
        lenses,
        distribution,
        alignment_period_s: period_s,
        aligned,
    })
}

/// The cloud's lens: Cloud Monitoring's interpolation in the distribution's buckets.
fn cloud_lens(
    distribution: &Distribution,
    percentiles: &[f64],
    unit: ValueUnit,
) -> anyhow::Result<LensValues> {
    let cloud_points = percentiles
        .iter()
        .map(|&p| distribution.percentile(p))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LensValues {
        lens: Lens::Cloud,
        method: "Cloud Monitoring ALIGN_PERCENTILE: linear interpolation inside the bucket".into(),
        values_us: cloud_points
            .iter()
            .map(|c| c.map(|c| unit.to_us(c.value)))
            .collect(),
        open_above: cloud_points
            .iter()
            .map(|c| c.is_some_and(|c| c.open_above))
            .collect(),
    })
}

/// netperf's lens: its log-linear histogram, whole microseconds.
fn netperf_lens(set: &SampleSet, percentiles: &[f64]) -> LensValues {
    let count = set.samples.len();
    let mut np = crate::analysis::stats::NetperfHist::new();
    for s in &set.samples {
        np.record_us(s.rtt_us.max(0.0) as u64);
    }
    LensValues {
        lens: Lens::Netperf,
        method: "netperf's log-linear histogram (100 buckets per decade from 1 us), HIST_get_percentile walk; whole microseconds".into(),
        values_us: percentiles.iter().map(|&p| (count > 0).then(|| np.percentile_us(p / 100.0) as f64)).collect(),
        open_above: vec![false; percentiles.len()],
    }
}

/// The cloud's percentiles per alignment period of timed samples.
fn aligned_rows(
    set: &SampleSet,
    period_s: f64,
    layout: &BucketOptions,
    unit: ValueUnit,
    percentiles: &[f64],
) -> anyhow::Result<Vec<AlignedRow>> {
    Ok(align(
        set.samples.iter().map(|s| (s.t_s(), s.rtt_us)),
        period_s,
        layout,
        unit,
    )?
    .into_iter()
    .map(|pt| {
        let values_us = percentiles
            .iter()
            .map(|&p| {
                pt.distribution
                    .percentile(p)
                    .map(|o| o.map(|c| unit.to_us(c.value)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(AlignedRow {
            start_s: pt.start_s,
            end_s: pt.end_s,
            count: pt.distribution.count,
            values_us,
        })
    })
    .collect::<Result<Vec<_>, dist::DistError>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_definition() {
        let s = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(nearest_rank(&s, 0.0), 1.0);
        assert_eq!(nearest_rank(&s, 10.0), 1.0);
        assert_eq!(nearest_rank(&s, 10.1), 2.0);
        assert_eq!(nearest_rank(&s, 50.0), 5.0);
        assert_eq!(nearest_rank(&s, 95.0), 10.0);
        assert_eq!(nearest_rank(&s, 100.0), 10.0);
        assert_eq!(nearest_rank(&[7.0], 99.0), 7.0);
    }
}
