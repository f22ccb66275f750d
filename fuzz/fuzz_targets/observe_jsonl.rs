#![no_main]
// Harness and what it checks: rttscope::fuzzing::observe_jsonl (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::observe_jsonl(data));
