//! Raw safetensors file bytes (length prefix + JSON header) through the header reader: no
//! panic, and a rank's share never exceeds the whole.

use memplan_model::safetensors;

pub fn run(data: &[u8]) {
    if let Ok(s) = safetensors::parse_prefixed("fuzz.safetensors", data) {
        assert!(s.per_rank(4) <= s.total());
    }
}
