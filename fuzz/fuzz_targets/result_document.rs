#![no_main]
// Harness and what it checks: rttscope::fuzzing::result_document (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::result_document(data));
