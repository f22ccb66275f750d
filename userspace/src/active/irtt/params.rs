//! irtt test parameters: the payload of the open request and of its reply.
//!
//! Each parameter is a type number (unsigned LEB128 varint) followed by a
//! zig-zag signed varint value, except the server fill, which is a varint
//! length and that many bytes (at most 32). Zero-valued parameters are
//! omitted. The client sends what it wants; the server answers with what it
//! grants (restricted by its own limits). Unknown parameter types are ignored,
//! as irtt does.
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// irtt's protocol version (irtt 0.9.x).
pub const PROTOCOL_VERSION: i64 = 1;
/// Longest server fill string irtt accepts.
pub const MAX_SERVER_FILL_LEN: usize = 32;
/// Longest parameter block irtt writes.
pub const PARAMS_MAX_LEN: usize = 128;

const P_PROTOCOL_VERSION: u64 = 1;
const P_DURATION: u64 = 2;
const P_INTERVAL: u64 = 3;
const P_LENGTH: u64 = 4;
const P_RECEIVED_STATS: u64 = 5;
const P_STAMP_AT: u64 = 6;
const P_CLOCK: u64 = 7;
const P_DSCP: u64 = 8;
const P_SERVER_FILL: u64 = 9;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ParamError {
    #[error("parameter block ends inside a varint")]
    Short,
    #[error("parameter varint overflows 64 bits")]
    Overflow,
    #[error("server fill string too long ({0} > 32 bytes)")]
    FillTooLong(u64),
    #[error("server fill is not UTF-8")]
    FillNotUtf8,
    #[error("invalid value {value} for parameter {name}")]
    BadValue { name: &'static str, value: i64 },
}

/// Server statistics on received packets (`--stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ReceivedStats {
    None,
    Count,
    Window,
    Both,
}

impl ReceivedStats {
    pub fn bits(self) -> i64 {
        match self {
            Self::None => 0,
            Self::Count => 1,
            Self::Window => 2,
            Self::Both => 3,
        }
    }
    pub fn from_bits(v: i64) -> Option<Self> {
        Some(match v {
            0 => Self::None,
            1 => Self::Count,
            2 => Self::Window,
            3 => Self::Both,
            _ => return None,
        })
    }
    pub fn count(self) -> bool {
        self.bits() & 1 != 0
    }
    pub fn window(self) -> bool {
        self.bits() & 2 != 0
    }
    pub fn name(self) -> &'static str {
        ["none", "count", "window", "both"][self.bits() as usize]
    }
}

/// When the server timestamps (`--tstamp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum StampAt {
    None,
    Send,
    Receive,
    Both,
    Midpoint,
}

impl StampAt {
    pub fn bits(self) -> i64 {
        match self {
            Self::None => 0,
            Self::Send => 1,
            Self::Receive => 2,
            Self::Both => 3,
            Self::Midpoint => 4,
        }
    }
    pub fn from_bits(v: i64) -> Option<Self> {
        Some(match v {
            0 => Self::None,
            1 => Self::Send,
            2 => Self::Receive,
            3 => Self::Both,
            4 => Self::Midpoint,
            _ => return None,
        })
    }
    pub fn receive(self) -> bool {
        matches!(self, Self::Receive | Self::Both)
    }
    pub fn send(self) -> bool {
        matches!(self, Self::Send | Self::Both)
    }
    pub fn name(self) -> &'static str {
        ["none", "send", "receive", "both", "midpoint"][self.bits() as usize]
    }
}

/// Which server clocks the timestamps carry (`--clock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    Wall,
    Monotonic,
    Both,
}

impl Clock {
    pub fn bits(self) -> i64 {
        match self {
            Self::Wall => 1,
            Self::Monotonic => 2,
            Self::Both => 3,
        }
    }
    pub fn from_bits(v: i64) -> Option<Self> {
        Some(match v {
            1 => Self::Wall,
            2 => Self::Monotonic,
            3 => Self::Both,
            _ => return None,
        })
    }
    pub fn wall(self) -> bool {
        self.bits() & 1 != 0
    }
    pub fn mono(self) -> bool {
        self.bits() & 2 != 0
    }
    pub fn name(self) -> &'static str {
        ["none", "wall", "monotonic", "both"][self.bits() as usize]
    }
}

/// The negotiated test parameters, in irtt's units (ns, bytes, ToS byte).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Params {
    pub protocol_version: i64,
    pub duration_ns: i64,
    pub interval_ns: i64,
    /// Requested packet length (0: as small as the headers allow).
    pub length: i64,
    pub received_stats: ReceivedStats,
    pub stamp_at: StampAt,
    /// `None` only when the server sent no clock parameter (no timestamps).
    pub clock: Option<Clock>,
    pub dscp: i64,
    pub server_fill: String,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            protocol_version: 0,
            duration_ns: 0,
            interval_ns: 0,
            length: 0,
            received_stats: ReceivedStats::None,
            stamp_at: StampAt::None,
            clock: None,
            dscp: 0,
            server_fill: String::new(),
        }
    }
}

pub fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub fn put_varint(out: &mut Vec<u8>, v: i64) {
    let ux = ((v as u64) << 1) ^ ((v >> 63) as u64);
    put_uvarint(out, ux);
}

/// Read an unsigned varint: (value, bytes used).
pub fn read_uvarint(b: &[u8]) -> Result<(u64, usize), ParamError> {
    let mut x: u64 = 0;
    let mut shift = 0u32;
    for (i, &byte) in b.iter().enumerate() {
        if i == 10 {
            return Err(ParamError::Overflow);
        }
        if byte < 0x80 {
            if i == 9 && byte > 1 {
                return Err(ParamError::Overflow);
            }
            return Ok((x | (u64::from(byte) << shift), i + 1));
        }
        x |= u64::from(byte & 0x7f) << shift;
        shift += 7;
    }
    Err(ParamError::Short)
}

pub fn read_varint(b: &[u8]) -> Result<(i64, usize), ParamError> {
    let (ux, n) = read_uvarint(b)?;
    let mut x = (ux >> 1) as i64;
    if ux & 1 != 0 {
        x = !x;
    }
    Ok((x, n))
}

impl Params {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(PARAMS_MAX_LEN);
        let num = |b: &mut Vec<u8>, t: u64, v: i64| {
            if v != 0 {
                put_uvarint(b, t);
                put_varint(b, v);
            }
        };
        num(&mut b, P_PROTOCOL_VERSION, self.protocol_version);
        num(&mut b, P_DURATION, self.duration_ns);
        num(&mut b, P_INTERVAL, self.interval_ns);
        num(&mut b, P_LENGTH, self.length);
        num(&mut b, P_RECEIVED_STATS, self.received_stats.bits());
        num(&mut b, P_STAMP_AT, self.stamp_at.bits());
        num(&mut b, P_CLOCK, self.clock.map(Clock::bits).unwrap_or(0));
        num(&mut b, P_DSCP, self.dscp);
        if !self.server_fill.is_empty() {
            let fill =
                &self.server_fill.as_bytes()[..self.server_fill.len().min(MAX_SERVER_FILL_LEN)];
            put_uvarint(&mut b, P_SERVER_FILL);
            put_uvarint(&mut b, fill.len() as u64);
            b.extend_from_slice(fill);
        }
        b
    }

    /// Parse a parameter block. Never panics on arbitrary input.
    pub fn decode(mut b: &[u8]) -> Result<Params, ParamError> {
        let mut p = Params::default();
        while !b.is_empty() {
            let (t, n) = read_uvarint(b)?;
            b = &b[n..];
            if t == P_SERVER_FILL {
                let (len, n) = read_uvarint(b)?;
                b = &b[n..];
                if len > MAX_SERVER_FILL_LEN as u64 {
                    return Err(ParamError::FillTooLong(len));
                }
                let len = len as usize;
                if b.len() < len {
                    return Err(ParamError::Short);
                }
                p.server_fill = std::str::from_utf8(&b[..len])
                    .map_err(|_| ParamError::FillNotUtf8)?
                    .to_string();
                b = &b[len..];
                continue;
            }
            let (v, n) = read_varint(b)?;
            b = &b[n..];
            let bad = |name| ParamError::BadValue { name, value: v };
            match t {
                P_PROTOCOL_VERSION => p.protocol_version = v,
                P_DURATION if v <= 0 => return Err(bad("duration")),
                P_DURATION => p.duration_ns = v,
                P_INTERVAL if v <= 0 => return Err(bad("interval")),
                P_INTERVAL => p.interval_ns = v,
                P_LENGTH => p.length = v,
                P_RECEIVED_STATS => {
                    p.received_stats =
                        ReceivedStats::from_bits(v).ok_or_else(|| bad("received_stats"))?
                }
                P_STAMP_AT => p.stamp_at = StampAt::from_bits(v).ok_or_else(|| bad("stamp_at"))?,
                P_CLOCK => p.clock = Some(Clock::from_bits(v).ok_or_else(|| bad("clock"))?),
                P_DSCP => p.dscp = v,
                _ => {} // unknown parameters are ignored, as irtt does
            }
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The open request irtt 0.9.0 sent for `irtt client -i 100ms -d 300ms` (captured with tcpdump).
    const IRTT_OPEN_PARAMS: &[u8] = &[
        0x01, 0x02, 0x02, 0x80, 0x8c, 0x8d, 0x9e, 0x02, 0x03, 0x80, 0x84, 0xaf, 0x5f, 0x05, 0x06,
        0x06, 0x06, 0x07, 0x06,
    ];

    fn irtt_default(duration_ns: i64, interval_ns: i64) -> Params {
        Params {
            protocol_version: 1,
            duration_ns,
            interval_ns,
            length: 0,
            received_stats: ReceivedStats::Both,
            stamp_at: StampAt::Both,
            clock: Some(Clock::Both),
            dscp: 0,
            server_fill: String::new(),
        }
    }

    #[test]
    fn decodes_irtt_capture() {
        let p = Params::decode(IRTT_OPEN_PARAMS).unwrap();
        assert_eq!(p, irtt_default(300_000_000, 100_000_000));
    }

    #[test]
    fn encodes_like_irtt() {
        assert_eq!(
            irtt_default(300_000_000, 100_000_000).encode(),
            IRTT_OPEN_PARAMS
        );
    }

    #[test]
    fn round_trip_all_fields() {
        let p = Params {
            length: 172,
            dscp: 46,
            server_fill: "rand".into(),
            stamp_at: StampAt::Midpoint,
            clock: Some(Clock::Wall),
            received_stats: ReceivedStats::Window,
            ..irtt_default(5_000_000_000, 10_000_000)
        };
        assert_eq!(Params::decode(&p.encode()).unwrap(), p);
    }

    #[test]
    fn varints() {
        for v in [0i64, 1, -1, 63, -64, 64, 300, i64::MAX, i64::MIN] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(read_varint(&b).unwrap(), (v, b.len()));
        }
        assert_eq!(read_uvarint(&[0x80]), Err(ParamError::Short));
        assert_eq!(read_uvarint(&[0xff; 11]), Err(ParamError::Overflow));
    }

    #[test]
    fn rejects_bad_values() {
        // stamp_at = 9
        assert!(matches!(
            Params::decode(&[0x06, 0x12]),
            Err(ParamError::BadValue {
                name: "stamp_at",
                ..
            })
        ));
        // negative interval
        assert!(Params::decode(&[0x03, 0x01]).is_err());
        // unknown parameter 20 is ignored
        assert_eq!(Params::decode(&[0x14, 0x02]).unwrap(), Params::default());
    }

    proptest! {
        #[test]
        fn decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Params::decode(&b);
        }
    }
}
