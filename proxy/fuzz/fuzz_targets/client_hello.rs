//! The ClientHello peek must classify any prefix without panicking, and a
//! prefix that is complete must stay complete when more bytes follow.
#![no_main]

use airlock_proxy::sni::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for cut in [data.len() / 3, data.len() / 2, data.len()] {
        let _ = parse(&data[..cut]);
    }
});
