//! libFuzzer target: the body shared with the stable driver
//! (`crates/memplan-model/tests/fuzz_bodies/config_json.rs`, which states the properties).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../crates/memplan-model/tests/fuzz_bodies/config_json.rs"]
mod body;

fuzz_target!(|data: &[u8]| body::run(data));
