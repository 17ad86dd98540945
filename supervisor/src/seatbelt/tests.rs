//! Golden profiles and property checks for the Seatbelt generator.
//! `UPDATE_GOLDEN=1 cargo test -p airlock` rewrites the golden files.

use std::collections::BTreeMap;
use std::path::PathBuf;

use proptest::prelude::*;

use super::*;

fn plan(
    net: Net,
    read: &[&str],
    write: &[&str],
    deny_read: &[&str],
    deny_write: &[&str],
    globs: &[&str],
) -> Plan {
    let paths = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
    Plan {
        argv: vec!["npm".into(), "install".into()],
        env: BTreeMap::new(),
        cwd: PathBuf::from("/Users/dev/project"),
        net,
        read: paths(read),
        write: paths(write),
        tmp_binds: vec![],
        deny_read: paths(deny_read),
        deny_write: paths(deny_write),
        deny_read_globs: globs.iter().map(|s| s.to_string()).collect(),
        unsupported: vec![],
        allow_degraded: false,
        degraded: None,
        unix_sockets: vec![],
        limits: Default::default(),
    }
}

fn golden(name: &str, profile: &Profile) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/seatbelt/golden");
    let params: String = profile
        .params
        .iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect();
    let rendered = format!(
        "{}\n;; -D parameters:\n{}",
        profile.text,
        params
            .lines()
            .map(|l| format!(";; {l}\n"))
            .collect::<String>()
    );
    let path = dir.join(format!("{name}.sb"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &rendered).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        rendered, want,
        "golden {name}.sb differs (UPDATE_GOLDEN=1 to accept)"
    );
}

fn npm_project() -> Plan {
    plan(
        Net::Proxy,
        &["/"],
        &["/Users/dev/project", "/Users/dev/.npm"],
        &[
            "/Users/dev/.ssh",
            "/Users/dev/.aws",
            "/Users/dev/project/.env",
        ],
        &[
            "/Users/dev/project/.git/hooks",
            "/Users/dev/project/.git/config",
            "/Users/dev/.zshrc",
        ],
        &[],
    )
}

#[test]
fn golden_npm_project() {
    golden("npm-project", &profile(&npm_project(), Some(50123)));
}

#[test]
fn golden_offline_narrow_read() {
    let p = plan(
        Net::None,
        &["/usr", "/bin", "/Users/dev/project"],
        &["/Users/dev/project"],
        &["/Users/dev/project/secrets"],
        &[],
        &["/Users/dev/project/config/*/credentials.json"],
    );
    golden("offline-narrow-read", &profile(&p, None));
}

#[test]
fn golden_hostile_paths() {
    let p = plan(
        Net::Proxy,
        &["/"],
        &["/Users/dev/we\"ird (dir)\n(allow network*)"],
        &["/Users/dev/ünïcødé dir/.ssh"],
        &["/Users/dev/we\"ird (dir)\n(allow network*)/.git/hooks"],
        &["/Users/dev/a\"b/*/c"],
    );
    golden("hostile-paths", &profile(&p, Some(8080)));
}

/// Parentheses balance outside string and regex literals.
fn balanced(text: &str) -> bool {
    let mut depth = 0i64;
    let mut in_string = false;
    let mut escaped = false;
    for c in text.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => {}
        }
    }
    depth == 0 && !in_string
}

fn check(plan: &Plan, port: Option<u16>) {
    let prof = profile(plan, port);
    assert!(prof.text.starts_with("(version 1)\n(deny default)\n"));
    assert!(balanced(&prof.text), "unbalanced:\n{}", prof.text);
    for line in prof.text.lines() {
        if line.contains("(allow network-outbound") {
            assert!(
                line.contains("(remote tcp \"localhost:"),
                "unfiltered outbound: {line}"
            );
        }
    }
    if plan.net != Net::Host {
        assert!(!prof.text.contains("(allow network*)"));
    }
    // Every deny_read path is a parameter used inside the deny rule.
    let deny_block = prof.text.split("(deny file-read*").nth(1).unwrap_or("");
    for d in &plan.deny_read {
        let (name, _) = prof
            .params
            .iter()
            .find(|(k, v)| k.starts_with("DENY_READ") && v == &d.display().to_string())
            .expect("deny_read path passed as a parameter");
        assert!(
            deny_block.contains(&format!("(param \"{name}\")")),
            "{name} not denied"
        );
    }
    // No path text leaks into the profile: only parameter names do. (The
    // escaped regexes of deny_read globs are the one path-derived text.)
    let without_regexes: String = prof
        .text
        .lines()
        .filter(|l| !l.contains("(regex #"))
        .collect::<Vec<_>>()
        .join("\n");
    for (_, v) in &prof.params {
        if v.len() > 1 {
            assert!(
                !without_regexes.contains(v.as_str()),
                "path {v:?} inlined into the profile"
            );
        }
    }
}

#[test]
fn properties_hold_for_the_goldens() {
    check(&npm_project(), Some(3128));
}

#[test]
fn a_backslash_path_next_to_a_glob_is_still_a_parameter() {
    let p = plan(
        Net::Proxy,
        &["/"],
        &["/Users/dev/\\"],
        &["/Users/dev/\\"],
        &[],
        &["/Users/dev/\\/*"],
    );
    check(&p, Some(3128));
}

#[test]
fn glob_regexes_escape_everything() {
    assert_eq!(glob_regex("/a.b/*/c"), "^/a\\.b/[^/]*/c(/.*)?$");
    assert_eq!(glob_regex("/x/**"), "^/x/.*(/.*)?$");
    assert_eq!(sbpl_string("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
}

#[test]
fn protected_parents_cannot_be_renamed() {
    let prof = profile(&npm_project(), Some(3128));
    let parent = prof
        .params
        .iter()
        .find(|(_, v)| v == "/Users/dev/project/.git")
        .expect(".git protected");
    assert!(parent.0.starts_with("PROTECT_PARENT"));
    assert!(prof.text.contains("(deny file-write-unlink"));
}

proptest! {
    #[test]
    fn hostile_paths_never_break_the_profile(
        segs in proptest::collection::vec("[ -~\\n\\t\u{e9}\u{4e2d}]{1,12}", 1..4),
        glob in "[ -~]{0,12}",
        port in 1u16..,
    ) {
        let path = format!("/Users/dev/{}", segs.join("/"));
        let p = plan(
            Net::Proxy,
            &["/"],
            &[path.as_str()],
            &[path.as_str(), "/Users/dev/.ssh"],
            &[format!("{path}/.git/hooks").as_str()],
            &[format!("/Users/dev/{glob}/*").as_str()],
        );
        check(&p, Some(port));
    }
}
