//! One direction through the router and its impairment (delay, jitter, loss, bottleneck).
use std::time::Duration;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::lab::testbed::{RTR_CLI_IF, RTR_SRV_IF};

/// A direction through the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// client -> server
    Up,
    /// server -> client
    Down,
}

impl Direction {
    pub const BOTH: [Direction; 2] = [Direction::Up, Direction::Down];

    pub(super) fn idx(self) -> usize {
        match self {
            Direction::Up => 0,
            Direction::Down => 1,
        }
    }
    /// Router interface the direction's packets arrive on.
    pub fn ingress_if(self) -> &'static str {
        match self {
            Direction::Up => RTR_CLI_IF,
            Direction::Down => RTR_SRV_IF,
        }
    }
    /// Router interface the direction's packets leave by (where tbf goes).
    pub fn egress_if(self) -> &'static str {
        match self {
            Direction::Up => RTR_SRV_IF,
            Direction::Down => RTR_CLI_IF,
        }
    }
}

/// One direction's impairment. `Default` is a clean link.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct LinkConfig {
    /// Added one-way delay.
    #[serde(serialize_with = "ser_us", rename = "delay_us")]
    pub delay: Duration,
    /// Jitter: each packet's delay is `delay` plus uniform in [-jitter, +jitter] (floored at 0).
    #[serde(serialize_with = "ser_us", rename = "jitter_us")]
    pub jitter: Duration,
    /// Random loss in percent (0..=100), resolution 0.01 %.
    pub loss_pct: f64,
    /// Bottleneck rate in bits per second (None: unlimited).
    pub rate_bps: Option<u64>,
    /// Bottleneck queue limit in bytes (tbf `limit`; only with a rate). Default 64 KiB.
    #[serde(rename = "queue_limit_bytes")]
    pub queue_limit: Option<u64>,
}

fn ser_us<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_micros() as u64)
}

impl LinkConfig {
    pub fn delay(d: Duration) -> Self {
        LinkConfig {
            delay: d,
            ..Default::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        if !(0.0..=100.0).contains(&self.loss_pct) || self.loss_pct.is_nan() {
            bail!(
                "loss must be between 0 and 100 percent, not {}",
                self.loss_pct
            );
        }
        if self.delay > Duration::from_secs(10) || self.jitter > Duration::from_secs(10) {
            bail!("delay and jitter are limited to 10 s");
        }
        if let Some(r) = self.rate_bps {
            if r < 8_000 {
                bail!("a bottleneck rate below 8 kbit/s is not supported ({r} bit/s)");
            }
        }
        if self.queue_limit.is_some() && self.rate_bps.is_none() {
            bail!("a queue limit needs a bottleneck rate");
        }
        Ok(())
    }

    pub(super) fn needs_queue(&self) -> bool {
        !self.delay.is_zero() || !self.jitter.is_zero()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates() {
        assert!(LinkConfig {
            loss_pct: 101.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(LinkConfig {
            queue_limit: Some(1000),
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(LinkConfig::delay(Duration::from_millis(50))
            .validate()
            .is_ok());
    }
}
