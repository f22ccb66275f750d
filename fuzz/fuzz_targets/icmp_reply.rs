#![no_main]
// Harness and what it checks: rttscope::fuzzing::icmp_reply (docs/fuzzing.md).
libfuzzer_sys::fuzz_target!(|data: &[u8]| rttscope::fuzzing::icmp_reply(data));
