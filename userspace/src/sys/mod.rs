//! The system calls and host facts, each in one place: bpf(2) calls the
//! loaders lack, entering a network namespace, capabilities, preflight
//! checks and the monotonic clock.
pub mod bpf;
pub mod bpfprog;
pub mod btf;
pub mod caps;
pub mod cgroup;
pub mod clock;
pub mod files;
pub mod netns;
pub mod preflight;
pub mod sockdiag;
