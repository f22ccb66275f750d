#![no_main]
// Harness and what it checks: rttscope::fuzzing::names_file (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::names_file(data));
