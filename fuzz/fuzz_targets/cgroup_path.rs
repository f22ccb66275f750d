#![no_main]
// Harness and what it checks: rttscope::fuzzing::cgroup_path (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::cgroup_path(data));
