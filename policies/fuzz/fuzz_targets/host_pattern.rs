//! Host canonicalisation and pattern parsing must never panic, and a
//! canonical host must be a fixed point.
#![no_main]

use airlock_policy::{Host, Pattern, PatternList, Target};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(h) = Host::parse(s) {
        let again = Host::parse(&h.to_string()).expect("canonical form reparses");
        assert_eq!(again, h);
    }
    for list in [PatternList::Allow, PatternList::Deny, PatternList::Inspect] {
        if let Ok(p) = Pattern::parse(s, list) {
            if let Ok(t) = Target::parse(s, Some(443)) {
                let _ = p.matches(&t);
            }
        }
    }
    let _ = Target::parse(s, None);
});
