//! The kernel objects' skeletons and the types generated from `bpf/rttscope.h`.
//!
//! Never mirror a kernel-side struct by hand: the types below come from the
//! objects' BTF through libbpf-cargo. Raw bytes from the kernel are turned
//! into those types here and only here (`decode`).
#[allow(
    clippy::all,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    unsafe_op_in_unsafe_fn
)]
#[cfg(feature = "libbpf")]
pub mod tcp {
    include!(concat!(env!("OUT_DIR"), "/tcp.skel.rs"));
}
/// Without libbpf-rs: the same generated `types` module, extracted from the
/// skeleton by build.rs (the skeleton's other parts need libbpf-rs).
#[allow(
    clippy::all,
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unsafe_op_in_unsafe_fn
)]
#[cfg(not(feature = "libbpf"))]
pub mod tcp {
    include!(concat!(env!("OUT_DIR"), "/tcp.types.rs"));
}

/// The sampler view's object (bpf/sampler.bpf.c).
#[allow(
    clippy::all,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    unsafe_op_in_unsafe_fn
)]
#[cfg(feature = "libbpf")]
pub mod sampler {
    //! Loaded once per attached interface through `SamplerSkelBuilder` (see views/sampler/libbpf.rs).
    include!(concat!(env!("OUT_DIR"), "/sampler.skel.rs"));
}
/// Without libbpf-rs: the sampler object's generated types only.
#[allow(
    clippy::all,
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unsafe_op_in_unsafe_fn
)]
#[cfg(not(feature = "libbpf"))]
pub mod sampler {
    include!(concat!(env!("OUT_DIR"), "/sampler.types.rs"));
}

pub use sampler::types::{
    rodata as SamplerRodata, rttscope_sampler_flow as SamplerFlow,
    rttscope_sampler_pending as SamplerPending,
};

pub use tcp::types::{
    rttscope_event as Event, rttscope_flow_key as FlowKey, rttscope_tcp_flow as TcpFlow,
};

/// Constants of `enum rttscope_consts`, as usize.
pub mod consts {
    use super::tcp::types::rttscope_consts as C;
    pub const HIST_SUB_BITS: usize = C::RTTSCOPE_HIST_SUB_BITS.0 as usize;
    pub const HIST_SUB: usize = C::RTTSCOPE_HIST_SUB.0 as usize;
    pub const HIST_MAX_EXP: usize = C::RTTSCOPE_HIST_MAX_EXP.0 as usize;
    pub const HIST_BUCKETS: usize = C::RTTSCOPE_HIST_BUCKETS.0 as usize;
    pub const MAX_NETNS: u32 = C::RTTSCOPE_MAX_NETNS.0;
    pub const MAX_PORTS: u32 = C::RTTSCOPE_MAX_PORTS.0;
    pub const MAX_CIDRS: u32 = C::RTTSCOPE_MAX_CIDRS.0;
}

// Size checks: the C side asserts the same numbers (_Static_assert).
const _: () = assert!(std::mem::size_of::<FlowKey>() == 44);
const _: () = assert!(std::mem::size_of::<TcpFlow>() == 104 + 40 + 4 * consts::HIST_BUCKETS);
const _: () = assert!(std::mem::size_of::<Event>() == 72);

// SAFETY: the generated types are plain C structs of integers and arrays.
unsafe impl plain::Plain for FlowKey {}
unsafe impl plain::Plain for TcpFlow {}
unsafe impl plain::Plain for Event {}
unsafe impl plain::Plain for SamplerFlow {}
unsafe impl plain::Plain for SamplerPending {}
unsafe impl plain::Plain for SamplerRodata {}

const _: () = assert!(std::mem::size_of::<SamplerFlow>() == 24 + 40 + 4 * consts::HIST_BUCKETS);
const _: () = assert!(
    std::mem::size_of::<SamplerPending>()
        == 8 * sampler::types::rttscope_sampler_consts::RTTSCOPE_SAMPLER_SLOTS.0 as usize + 16
);

/// Errors decoding bytes that came from the kernel.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {got} bytes is shorter than {want}")]
    Short { got: usize, want: usize },
}

/// Copy a kernel record out of a byte slice (ring buffer, map value).
pub fn decode<T: plain::Plain + Default + Copy>(bytes: &[u8]) -> Result<T, DecodeError> {
    let want = std::mem::size_of::<T>();
    if bytes.len() < want {
        return Err(DecodeError::Short {
            got: bytes.len(),
            want,
        });
    }
    let mut out = T::default();
    plain::copy_from_bytes(&mut out, bytes).map_err(|_| DecodeError::Short {
        got: bytes.len(),
        want,
    })?;
    Ok(out)
}

/// The bytes of a key, for map lookups.
pub fn as_bytes<T: plain::Plain>(v: &T) -> &[u8] {
    // SAFETY: T is Plain (no padding-sensitive invariants, no pointers).
    unsafe { plain::as_bytes(v) }
}
