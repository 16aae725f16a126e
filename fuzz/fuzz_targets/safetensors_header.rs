//! Fuzz the safetensors header reader on raw file bytes (length prefix + JSON).
#![no_main]

use libfuzzer_sys::fuzz_target;
use memplan_model::safetensors;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = safetensors::parse_prefixed("fuzz.safetensors", data) {
        assert!(s.per_rank(4) <= s.total());
    }
});
