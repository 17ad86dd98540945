//! Property tests for canonicalisation and matching.

use airlock_policy::*;
use proptest::prelude::*;
use std::net::Ipv4Addr;

fn spellings(ip: Ipv4Addr) -> Vec<String> {
    let o = ip.octets();
    let n = u32::from(ip);
    vec![
        ip.to_string(),
        n.to_string(),
        format!("0x{n:x}"),
        format!("0{n:o}"),
        format!("{}.{}", o[0], n & 0xff_ffff),
        format!("{}.{}.{}", o[0], o[1], n & 0xffff),
        format!("0x{:x}.0{:o}.{}.0x{:X}", o[0], o[1], o[2], o[3]),
        format!("[::ffff:{ip}]"),
        format!("{ip}."),
    ]
}

proptest! {
    #[test]
    fn every_ipv4_spelling_is_one_address(raw in any::<u32>()) {
        let ip = Ipv4Addr::from(raw);
        for s in spellings(ip) {
            prop_assert_eq!(Host::parse(&s).unwrap(), Host::Ip(ip.into()), "{}", s);
        }
    }

    #[test]
    fn wildcard_never_matches_apex_or_lookalike(
        label in "[a-z][a-z0-9-]{0,10}",
        domain in "[a-z]{1,10}\\.(test|example)",
        sub in "[a-z]{1,8}",
    ) {
        let wild = Pattern::parse(&format!("*.{domain}"), PatternList::Allow).unwrap();
        let apex = Target::parse(&domain, Some(443)).unwrap();
        prop_assert_eq!(wild.matches(&apex), PatternMatch::No);
        // A label with the IDN prefix that is no valid punycode ("xn--n-qecdsc")
        // is refused as a host at all, which matches nothing either.
        match Target::parse(&format!("{label}{domain}"), Some(443)) {
            Ok(lookalike) => prop_assert_eq!(wild.matches(&lookalike), PatternMatch::No),
            Err(e) => prop_assert!(label.starts_with("xn--"), "{}", e),
        }
        let suffixed = Target::parse(&format!("{sub}.{domain}.evil.net"), Some(443)).unwrap();
        prop_assert_eq!(wild.matches(&suffixed), PatternMatch::No);
        let good = Target::parse(&format!("{sub}.{domain}"), Some(443)).unwrap();
        prop_assert_eq!(wild.matches(&good), PatternMatch::Yes);
    }

    #[test]
    fn case_and_trailing_dot_do_not_matter(name in "[a-zA-Z]{1,10}\\.[a-zA-Z]{2,5}") {
        let lower = Host::parse(&name.to_ascii_lowercase()).unwrap();
        prop_assert_eq!(Host::parse(&name).unwrap(), lower.clone());
        prop_assert_eq!(Host::parse(&format!("{name}.")).unwrap(), lower);
    }

    #[test]
    fn deny_always_beats_allow(name in "[a-z]{1,10}\\.test", port in 1u16..) {
        let text = format!("[network]\nallow = [\"{name}:*\"]\ndeny = [\"{name}\"]\n");
        let frag = load_str(&text, "p.toml", Layer::Project).unwrap();
        let p = Policy::build(vec![Fragment::built_in(), frag], &airlock_policy::preset::Offline);
        let d = decide(&p, &Target::parse(&format!("{name}:{port}"), None).unwrap());
        prop_assert_eq!(d.verdict, Verdict::Deny);
    }

    #[test]
    fn host_parser_never_panics(s in ".{0,300}") {
        let _ = Host::parse(&s);
        let _ = Pattern::parse(&s, PatternList::Allow);
        let _ = Target::parse(&s, Some(443));
    }

    #[test]
    fn wildcards_never_match_ips(raw in any::<u32>()) {
        let wild = Pattern::parse("*.example.com", PatternList::Allow).unwrap();
        let t = Target::new(Host::Ip(Ipv4Addr::from(raw).into()), 443);
        prop_assert_eq!(wild.matches(&t), PatternMatch::No);
    }
}

proptest! {
    /// The fuzz target's invariant, kept in the ordinary test run: a
    /// canonical host reparses to itself.
    #[test]
    fn canonical_hosts_are_fixed_points(s in "\\PC{0,40}") {
        if let Ok(h) = Host::parse(&s) {
            prop_assert_eq!(Host::parse(&h.to_string()).unwrap(), h);
        }
    }
}
