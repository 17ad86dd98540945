//! Decision order and merge precedence (SPEC §3.2 and §3.3).

use airlock_policy::*;

fn frag(layer: Layer, path: &str, text: &str) -> Fragment {
    load_str(text, path, layer).unwrap_or_else(|e| panic!("{e:?}"))
}

fn policy(frags: Vec<Fragment>) -> Policy {
    let mut all = vec![Fragment::built_in()];
    all.extend(frags);
    Policy::build(all, &airlock_policy::preset::Offline)
}

fn d(p: &Policy, t: &str) -> Decision {
    decide(p, &Target::parse(t, Some(443)).unwrap())
}

#[test]
fn unknown_hosts_ask_by_default() {
    let p = policy(vec![]);
    let dec = d(&p, "example.com");
    assert_eq!(dec.verdict, Verdict::Ask);
}

#[test]
fn deny_beats_allow_and_names_its_rule() {
    let p = policy(vec![frag(
        Layer::Project,
        "/w/airlock.toml",
        "[network]\nallow = [\"*.example.com\"]\ndeny = [\"uploads.example.com\"]\n",
    )]);
    let dec = d(&p, "uploads.example.com");
    assert_eq!(
        (dec.verdict, dec.reason),
        (Verdict::Deny, Reason::Denylisted)
    );
    assert_eq!(dec.rule.unwrap().origin.to_string(), "/w/airlock.toml:3");
    assert_eq!(d(&p, "api.example.com").verdict, Verdict::Allow);
}

#[test]
fn port_specific_rules() {
    let p = policy(vec![frag(
        Layer::Project,
        "a.toml",
        "[network]\nallow = [\"git.example.com:22\"]\nunknown = \"deny\"\n",
    )]);
    assert!(d(&p, "git.example.com:22").is_allow());
    let dec = d(&p, "git.example.com:443");
    assert_eq!(dec.reason, Reason::PortNotAllowed);
    assert_eq!(d(&p, "other.example.com").reason, Reason::NotAllowlisted);
}

#[test]
fn managed_deny_beats_user_allow_and_is_reported() {
    let p = policy(vec![
        frag(
            Layer::User,
            "/home/u/.config/airlock/policy.toml",
            "[network]\nallow = [\"x.evil.test\"]\n",
        ),
        frag(
            Layer::Managed,
            "/etc/airlock/managed.toml",
            "[network]\n\ndeny = [\"*.evil.test\"]\n",
        ),
    ]);
    let dec = d(&p, "x.evil.test");
    assert_eq!(
        (dec.verdict, dec.reason),
        (Verdict::Deny, Reason::ManagedDeny)
    );
    assert_eq!(
        dec.rule.unwrap().origin.to_string(),
        "/etc/airlock/managed.toml:3"
    );
    assert_eq!(p.conflicts.len(), 1);
    assert!(p.conflicts[0]
        .to_string()
        .contains("/etc/airlock/managed.toml:3"));
}

#[test]
fn managed_allow_beats_lower_deny() {
    let p = policy(vec![
        frag(Layer::Project, "p.toml", "[network]\ndeny = [\"*\"]\n"),
        frag(
            Layer::Managed,
            "m.toml",
            "[network]\nallow = [\"corp.test\"]\n",
        ),
    ]);
    // Any deny (step 2) comes before managed allow (step 3).
    assert_eq!(d(&p, "corp.test").reason, Reason::Denylisted);
}

#[test]
fn managed_unknown_deny_and_user_allow_off() {
    let p = policy(vec![
        frag(
            Layer::User,
            "u.toml",
            "[network]\nallow = [\"a.test\"]\nunknown = \"ask\"\n",
        ),
        frag(
            Layer::Managed,
            "m.toml",
            "[network]\nunknown = \"deny\"\nuser_allow = false\nallow = [\"b.test\"]\n",
        ),
    ]);
    assert!(!p.asks());
    assert_eq!(d(&p, "a.test").reason, Reason::NotAllowlisted);
    assert_eq!(d(&p, "b.test").reason, Reason::ManagedAllow);
    assert_eq!(p.conflicts.len(), 2, "{:?}", p.conflicts);
}

/// With `user_allow = false`, a lower layer's `resolve` cannot send a name
/// the managed policy allows to another address (red team round 13); the
/// managed layer's own pins stand.
#[test]
fn user_allow_off_ignores_lower_layers_resolve() {
    let p = policy(vec![
        frag(
            Layer::User,
            "u.toml",
            "[network]\nresolve = { \"ok.test\" = \"203.0.113.9\", \"pinned.test\" = \"203.0.113.8\" }\n",
        ),
        frag(
            Layer::Managed,
            "m.toml",
            "[network]\nunknown = \"deny\"\nuser_allow = false\nallow = [\"ok.test\", \"pinned.test\"]\nresolve = { \"pinned.test\" = \"198.51.100.1\" }\n",
        ),
    ]);
    let pins: Vec<(String, String)> = p
        .resolve
        .iter()
        .map(|(h, ip)| (h.to_string(), ip.value.to_string()))
        .collect();
    assert_eq!(
        pins,
        vec![("pinned.test".to_string(), "198.51.100.1".to_string())]
    );
    assert!(
        p.conflicts
            .iter()
            .any(|c| c.message.contains("resolve \"ok.test\" is ignored")),
        "{:?}",
        p.conflicts
    );
}

#[test]
fn require_sandbox_conflicts_with_host_mode() {
    let p = policy(vec![
        frag(Layer::Project, "p.toml", "[network]\nmode = \"host\"\n"),
        frag(Layer::Managed, "m.toml", "require_sandbox = true\n"),
    ]);
    assert!(p.sandbox_required());
    assert_eq!(p.conflicts.len(), 1);
}

#[test]
fn scalars_later_wins_lists_accumulate() {
    let p = policy(vec![
        frag(
            Layer::User,
            "u.toml",
            "[network]\nask_timeout = \"5s\"\nallow = [\"a.test\"]\n",
        ),
        frag(
            Layer::Project,
            "p.toml",
            "[network]\nask_timeout = \"7s\"\nallow = [\"b.test\"]\n",
        ),
    ]);
    assert_eq!(p.ask_timeout, std::time::Duration::from_secs(7));
    assert!(d(&p, "a.test").is_allow() && d(&p, "b.test").is_allow());
    assert!(p.deny_read.iter().any(|e| e.value == "~/.ssh"));
    assert!(p.deny_write.iter().any(|e| e.value == ".git/hooks"));
}

#[test]
fn ip_literals_match_only_ip_rules() {
    let p = policy(vec![frag(
        Layer::Project,
        "p.toml",
        "[network]\nallow = [\"127.0.0.1\", \"*.example.com\"]\nunknown = \"deny\"\n",
    )]);
    for t in [
        "2130706433:443",
        "127.1:443",
        "0x7f.0.0.1:80",
        "[::ffff:127.0.0.1]:443",
    ] {
        assert!(d(&p, t).is_allow(), "{t}");
    }
    assert!(!d(&p, "127.0.0.2").is_allow());
}

#[test]
fn flags_sit_between_project_and_managed() {
    let mut f = Fragment::empty(Layer::CommandLine, "command line");
    f.allow
        .push(flag_rule("--allow", "flag.test", PatternList::Allow).unwrap());
    let p = policy(vec![
        frag(
            Layer::Project,
            "p.toml",
            "[network]\ndeny = [\"flag.test\"]\n",
        ),
        f,
    ]);
    assert_eq!(d(&p, "flag.test").reason, Reason::Denylisted);
    assert!(flag_rule("--allow", "*", PatternList::Allow).is_err());
}

#[test]
fn env_inherit_none_at_any_layer_wins() {
    assert_eq!(policy(vec![]).env_inherit.value, EnvInherit::All);
    let p = policy(vec![
        frag(Layer::User, "u.toml", "[env]\ninherit = \"none\"\n"),
        frag(Layer::Project, "p.toml", "[env]\ninherit = \"all\"\n"),
    ]);
    assert_eq!(p.env_inherit.value, EnvInherit::None);
    assert_eq!(
        p.env_inherit.origin,
        Origin::File {
            path: "u.toml".into(),
            line: 2
        }
    );
    assert!(p.conflicts.is_empty());
    let p = policy(vec![
        frag(Layer::Project, "p.toml", "[env]\ninherit = \"all\"\n"),
        frag(Layer::Managed, "m.toml", "[env]\ninherit = \"none\"\n"),
    ]);
    assert_eq!(p.env_inherit.value, EnvInherit::None);
    assert_eq!(p.conflicts.len(), 1, "{:?}", p.conflicts);
}

#[test]
fn env_inherit_unknown_values_are_errors_with_their_place() {
    let e = load_str("[env]\ninherit = \"some\"\n", "p.toml", Layer::Project).unwrap_err();
    let text = e[0].to_string();
    assert!(text.starts_with("p.toml:2:11:"), "{text}");
    assert!(text.contains("some") || text.contains("variant"), "{text}");
    let e = load_str("[env]\ninherit = true\n", "p.toml", Layer::Project).unwrap_err();
    assert!(e[0].to_string().starts_with("p.toml:2:11:"), "{e:?}");
    let e = load_str("[env]\ninherits = \"none\"\n", "p.toml", Layer::Project).unwrap_err();
    assert!(e[0].to_string().starts_with("p.toml:2:1:"), "{e:?}");
}
