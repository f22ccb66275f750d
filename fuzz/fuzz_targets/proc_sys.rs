#![no_main]
// Harness and what it checks: rttscope::fuzzing::proc_sys (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::proc_sys(data));
