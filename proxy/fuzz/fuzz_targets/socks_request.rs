//! Arbitrary bytes as a SOCKS5 client: a reply code or a close, never a panic.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut bytes = vec![5u8];
    bytes.extend_from_slice(data);
    common::feed(&bytes, true)
});
