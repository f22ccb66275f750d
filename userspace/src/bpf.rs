//! The kernel objects' skeletons and the types generated from `bpf/rttscope.h`.
#[allow(
    clippy::all,
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    unsafe_op_in_unsafe_fn
)]
pub mod tcp {
    include!(concat!(env!("OUT_DIR"), "/tcp.skel.rs"));
}
