#![no_main]
// Harness and what it checks: rttscope::fuzzing::bucket_layout (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::bucket_layout(data));
