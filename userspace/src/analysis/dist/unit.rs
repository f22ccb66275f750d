//! The unit of a distribution's values.
use std::fmt;

use serde::{Deserialize, Serialize};

/// The unit of a distribution's values (the cloud metric uses milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ValueUnit {
    Us,
    #[default]
    Ms,
    S,
}

impl ValueUnit {
    /// Microseconds per one of this unit.
    pub fn us_per_unit(self) -> f64 {
        match self {
            ValueUnit::Us => 1.0,
            ValueUnit::Ms => 1e3,
            ValueUnit::S => 1e6,
        }
    }
    /// Convert microseconds into this unit.
    pub fn from_us(self, us: f64) -> f64 {
        us / self.us_per_unit()
    }
    /// Convert a value in this unit into microseconds.
    pub fn to_us(self, v: f64) -> f64 {
        v * self.us_per_unit()
    }
    pub fn as_str(self) -> &'static str {
        match self {
            ValueUnit::Us => "us",
            ValueUnit::Ms => "ms",
            ValueUnit::S => "s",
        }
    }
}

impl fmt::Display for ValueUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
