#![no_main]
// Harness and what it checks: rttscope::fuzzing::cloud_monitoring (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::cloud_monitoring(data));
