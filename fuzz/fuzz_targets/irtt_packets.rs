#![no_main]
// Harness and what it checks: rttscope::fuzzing::irtt_packets (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::irtt_packets(data));
