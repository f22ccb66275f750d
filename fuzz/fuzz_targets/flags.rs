#![no_main]
// Harness and what it checks: rttscope::fuzzing::flags (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::flags(data));
