#![no_main]
// Harness and what it checks: rttscope::fuzzing::nfqueue (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::nfqueue(data));
