#![no_main]
// Harness and what it checks: rttscope::fuzzing::rr_frames (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::rr_frames(data));
