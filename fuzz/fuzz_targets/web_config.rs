#![no_main]
// Harness and what it checks: rttscope::fuzzing::web_config (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::web_config(data));
