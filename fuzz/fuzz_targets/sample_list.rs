#![no_main]
// Harness and what it checks: rttscope::fuzzing::sample_list (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::sample_list(data));
