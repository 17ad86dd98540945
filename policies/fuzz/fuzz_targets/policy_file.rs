//! Loading arbitrary policy text must give a policy or diagnostics, never a panic.
#![no_main]

use airlock_policy::{load_str, Layer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = load_str(s, "fuzz.toml", Layer::Project);
    }
});
