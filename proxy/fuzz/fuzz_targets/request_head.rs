//! Arbitrary bytes as an HTTP client: a refusal or an error, never a panic.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| common::feed(data, false));
