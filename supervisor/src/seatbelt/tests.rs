//! Golden profiles, and checks of what the profile means: every test below
//! the goldens asks the SBPL interpreter in `eval.rs` whether an operation
//! on a path is allowed, with the profile's real regexes compiled.
//! `UPDATE_GOLDEN=1 cargo test -p airlock seatbelt` rewrites the goldens.

use std::collections::BTreeMap;
use std::path::PathBuf;

use proptest::prelude::*;

use super::eval::{self, Evaluator, Query, Target};
use super::*;
use crate::plan::macos::MacosPlan;

const HOME: &str = "/Users/dev";
const WS: &str = "/Users/dev/project";
const TMP: &str = "/private/var/folders/xy/abc/T/airlock-run1";
const TTY: &str = "/dev/ttys004";

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
        withheld_env: vec![],
        env_rule: None,
        env_warnings: vec![],
        cwd: PathBuf::from(WS),
        net,
        read: paths(read),
        write: paths(write),
        tmp_binds: vec![],
        tmp_read_binds: vec![],
        publish: vec![],
        deny_read: paths(deny_read),
        deny_write: paths(deny_write),
        pin: vec![],
        own_outputs: vec![],
        protected: vec![],
        deny_read_globs: globs.iter().map(|s| s.to_string()).collect(),
        deny_read_names: vec![],
        deny_read_env: vec![],
        deny_read_env_truncated: false,
        project_configs: vec![],
        deny_read_env_in_git: vec![],
        deny_read_masks: vec![],
        sanitised: vec![],
        unsupported: vec![],
        allow_degraded: false,
        degraded: None,
        macos: MacosPlan {
            home: Some(PathBuf::from(HOME)),
            tmpdir: Some(PathBuf::from(TMP)),
            terminal: Some(PathBuf::from(TTY)),
            ..MacosPlan::default()
        },
        unix_sockets: vec![],
        limits: Default::default(),
        log: String::new(),
        start_note: None,
        no_write_notes: false,
        session: false,
        review: vec![],
    }
}

fn golden(name: &str, profile: &Profile) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/seatbelt/golden");
    let params: String = profile
        .params
        .iter()
        .map(|(k, v)| format!(";; {k}={}\n", v.escape_debug()))
        .collect();
    let rendered = format!(
        "{}\n;; -D parameters (values escaped as Rust strings: \\\\ is one backslash):\n{params}",
        profile.text
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
        &[WS, "/Users/dev/.npm"],
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

fn offline_narrow_read() -> Plan {
    plan(
        Net::None,
        &["/usr", "/bin", WS],
        &[WS],
        &["/Users/dev/project/secrets"],
        &[],
        &[
            "/Users/dev/project/config/*/credentials.json",
            "/Users/dev/project/**/id_*.pem",
        ],
    )
}

fn hostile() -> Plan {
    plan(
        Net::Proxy,
        &["/"],
        &["/Users/dev/we\"ird (dir)\n(allow network*)"],
        &["/Users/dev/ünïcødé dir/.ssh"],
        &["/Users/dev/we\"ird (dir)\n(allow network*)/.git/hooks"],
        &["/Users/dev/a\"b/*/c", "/Users/dev/x\\y/[z]/**"],
    )
}

fn host_with_switches() -> Plan {
    let mut p = plan(Net::Host, &["/"], &[HOME], &[], &[], &[]);
    p.macos.keychain = true;
    p.macos.dnssd = true;
    p.macos.terminal = None;
    p.macos.deny_write_globs = vec!["/Users/dev/**/*.command".into()];
    p.macos.links = vec![PathBuf::from("/Users/dev/.zshrc")];
    p
}

#[test]
fn golden_npm_project() {
    golden("npm-project", &profile(&npm_project(), Some(50123)));
}

#[test]
fn golden_offline_narrow_read() {
    golden(
        "offline-narrow-read",
        &profile(&offline_narrow_read(), None),
    );
}

#[test]
fn golden_hostile_paths() {
    golden("hostile-paths", &profile(&hostile(), Some(8080)));
}

#[test]
fn golden_host_network_with_switches() {
    golden("host-with-switches", &profile(&host_with_switches(), None));
}

/// Structure every profile has, whatever the plan.
fn check(plan: &Plan, port: Option<u16>) -> Evaluator {
    let prof = profile(plan, port);
    assert!(prof.text.starts_with("(version 1)\n(deny default)\n"));
    for line in prof.text.lines() {
        if line.contains("(allow network-outbound") && plan.net != Net::Host {
            assert!(
                line.contains("(remote tcp \"localhost:") || line.contains("unix-socket"),
                "unfiltered outbound: {line}"
            );
        }
    }
    assert!(!prof.text.contains("network*"));
    // No path or regex text is inlined: only parameter names are.
    let rules: String = prof
        .text
        .lines()
        .filter(|l| !l.starts_with(";;"))
        .collect::<Vec<_>>()
        .join("\n");
    for (_, v) in &prof.params {
        if v.len() > 3 {
            assert!(
                !rules.contains(v.as_str()),
                "{v:?} inlined into the profile"
            );
        }
    }
    // Parses, every parameter is defined once, every regex compiles.
    Evaluator::new(&prof)
}

fn ev(plan: &Plan) -> Evaluator {
    check(plan, Some(3128))
}

fn can(e: &Evaluator, op: &str, p: &str) -> bool {
    e.allows(&eval::path(op, p))
}

const MOVE_OPS: &[&str] = &["file-write-unlink", "file-write-create"];

#[test]
fn properties_hold_for_the_goldens() {
    for p in [
        npm_project(),
        offline_narrow_read(),
        hostile(),
        host_with_switches(),
    ] {
        check(&p, Some(3128));
    }
}

#[test]
fn deny_read_cannot_be_read_renamed_or_linked() {
    let e = ev(&npm_project());
    for secret in [
        "/Users/dev/project/.env",
        "/Users/dev/project/.ENV",
        "/Users/dev/.ssh/id_ed25519",
        "/Users/dev/.SSH/id_ed25519",
        "/Users/dev/.aws",
    ] {
        assert!(!can(&e, "file-read-data", secret), "{secret} readable");
        for op in ["file-write-unlink", "file-write-create", "file-write-data"] {
            assert!(!can(&e, op, secret), "{op} {secret} allowed");
        }
    }
    // `mv .env x && cat x`: the rename itself is refused, and a hard link
    // to anything is.
    assert!(!can(&e, "file-link", "/Users/dev/project/x"));
    // The rest of the workspace is the agent's.
    assert!(can(&e, "file-read-data", "/Users/dev/project/.envrc"));
    assert!(can(&e, "file-read-data", "/Users/dev/project/.env.example"));
    assert!(can(
        &e,
        "file-write-data",
        "/Users/dev/project/.env.example"
    ));
    assert!(can(&e, "file-write-unlink", "/Users/dev/project/src/a.js"));
}

/// A `deny_read` path that does not exist when the run starts, outside
/// the writable roots, that the host creates during the run: Seatbelt
/// matches it by name (subpath and case-insensitive regex) at access time,
/// so the profile needs nothing to exist, and its neighbours stay readable
/// (unlike Linux, where Landlock splits the grant by inode).
#[test]
fn a_deny_read_path_absent_at_start_is_refused_by_name() {
    let p = plan(
        Net::None,
        &["/"],
        &[WS],
        &["/srv/secrets/key", "/Users/dev/.config/tool/token"],
        &[],
        &[],
    );
    let e = ev(&p);
    for secret in [
        "/srv/secrets/key",
        "/SRV/Secrets/KEY",
        "/srv/secrets/key/inner",
        "/Users/dev/.config/tool/token",
        "/users/DEV/.config/Tool/token",
    ] {
        assert!(!can(&e, "file-read-data", secret), "{secret} readable");
    }
    for open in [
        "/srv/secrets/key2",
        "/srv/secrets/other",
        "/Users/dev/.config/tool/other",
        "/Users/dev/new-file",
    ] {
        assert!(can(&e, "file-read-data", open), "{open} unreadable");
    }
}

#[test]
fn ancestors_up_to_root_cannot_be_moved_removed_or_created() {
    let e = ev(&npm_project());
    for a in [
        "/",
        "/Users",
        "/Users/dev",
        "/USERS/Dev",
        WS,
        "/Users/dev/project/.git",
        "/Users/dev/.ssh",
    ] {
        for op in MOVE_OPS {
            assert!(!can(&e, op, a), "{op} {a} allowed");
        }
    }
    // Ordinary directories in the workspace still move.
    assert!(can(&e, "file-write-unlink", "/Users/dev/project/src"));
    assert!(can(&e, "file-write-create", "/Users/dev/project/src2"));
}

#[test]
fn git_is_protected_at_any_depth_in_any_case() {
    let e = ev(&npm_project());
    for p in [
        "/Users/dev/project/.git/hooks/pre-commit",
        "/Users/dev/project/.GIT/HOOKS/pre-commit",
        "/Users/dev/project/.git/config",
        "/Users/dev/project/.git/Config",
        "/Users/dev/project/.git/config.worktree",
        "/Users/dev/project/.git/info/attributes",
        "/Users/dev/project/.git/commondir",
        "/Users/dev/project/.git/modules/lib/config",
        "/Users/dev/project/.git/modules/a/modules/b/hooks/post-checkout",
        "/Users/dev/project/.git/worktrees/wt/config.worktree",
        "/Users/dev/project/.git/worktrees/wt/gitdir",
        "/Users/dev/project/vendor/x/.git/hooks/pre-commit",
        "/Users/dev/project/a\nb/.git/config",
        "/Users/dev/.npm/_cacache/.git/config",
        "/Users/dev/project/.gitmodules",
        "/Users/dev/project/sub/.gitmodules",
        "/Users/dev/project/.envrc",
        "/Users/dev/project/sub/.envrc",
        "/Users/dev/project/sub/.vscode/tasks.json",
        "/Users/dev/project/.idea/workspace.xml",
        "/Users/dev/project/sub/airlock.toml",
    ] {
        for op in ["file-write-data", "file-write-create", "file-write-unlink"] {
            assert!(!can(&e, op, p), "{op} {p:?} allowed");
        }
    }
    // `.git` itself anywhere: no new repository, no gitdir pointer file,
    // no `mv x .git` into place, no symlink named `.git`.
    for p in [
        "/Users/dev/project/.git",
        "/Users/dev/project/sub/.git",
        "/Users/dev/project/sub/.Git",
    ] {
        for op in ["file-write-create", "file-write-unlink", "file-write-data"] {
            assert!(!can(&e, op, p), "{op} {p} allowed");
        }
    }
    // Commits still work: objects, refs, the index, HEAD, logs.
    for p in [
        "/Users/dev/project/.git/objects/ab/cdef0123",
        "/Users/dev/project/.git/refs/heads/main",
        "/Users/dev/project/.git/index",
        "/Users/dev/project/.git/HEAD",
        "/Users/dev/project/.git/logs/HEAD",
        "/Users/dev/project/.github/workflows/ci.yml",
        "/Users/dev/project/src/config",
        "/Users/dev/project/src/hooks/useThing.ts",
        "/Users/dev/project/.gitignore",
    ] {
        assert!(can(&e, "file-write-create", p), "{p} not writable");
        assert!(can(&e, "file-write-data", p), "{p} not writable");
    }
}

#[test]
fn shared_temporary_directories_are_not_writable_but_tmpdir_is() {
    let e = ev(&npm_project());
    for p in [
        "/private/tmp/x",
        "/private/var/folders/xy/abc/T/other",
        "/private/var/folders/xy/abc/C/com.apple.xx",
        "/private/var/folders/xy/abc/T/airlock-run10/x",
    ] {
        assert!(!can(&e, "file-write-create", p), "{p} writable");
    }
    // A workspace under /private/tmp cannot be renamed away.
    let mut under_tmp = npm_project();
    under_tmp.write = vec![PathBuf::from("/private/tmp/ws")];
    let t = ev(&under_tmp);
    for op in MOVE_OPS {
        assert!(!can(&t, op, "/private/tmp/ws"), "{op} workspace");
    }
    assert!(can(&t, "file-write-unlink", "/private/tmp/ws/build"));
    // What macos.rs asks of every process to find this run's: may create
    // in TMPDIR, may not read the marker there.
    assert!(can(&e, "file-write-create", &format!("{TMP}/probe")));
    assert!(!can(&e, "file-read-data", &format!("{TMP}/{RUN_MARKER}")));
    let mine = format!("{TMP}/cc-123.o");
    assert!(can(&e, "file-write-create", &mine));
    assert!(can(&e, "file-read-data", &mine));
    // Its own unix sockets work; the host's do not.
    let q = |t| Query {
        op: "network-outbound",
        target: t,
        pty_extension: false,
    };
    let sock = format!("{TMP}/pymp-1/listener");
    assert!(e.allows(&q(Target::Unix(&sock))));
    assert!(e.allows(&Query {
        op: "network-bind",
        target: Target::LocalUnix(&sock),
        pty_extension: false
    }));
    for host in [
        "/Users/dev/.docker/run/docker.sock",
        "/private/var/run/mDNSResponder",
        "/Users/dev/project/agent.sock",
        "/private/tmp/com.apple.launchd.x/Listeners",
    ] {
        assert!(!e.allows(&q(Target::Unix(host))), "{host} connectable");
    }
}

#[test]
fn only_the_controlling_terminal_and_own_ptys() {
    let e = ev(&npm_project());
    let tty = |p: &'static str, op: &'static str, ext: bool| Query {
        op,
        target: Target::Path(p),
        pty_extension: ext,
    };
    for op in ["file-read-data", "file-write-data", "file-ioctl"] {
        assert!(e.allows(&tty(TTY, op, false)), "controlling tty {op}");
        assert!(e.allows(&tty("/dev/tty", op, false)));
        assert!(!e.allows(&tty("/dev/ttys003", op, false)), "other tty {op}");
        assert!(!e.allows(&tty("/dev/ttys0040", op, false)));
        assert!(e.allows(&tty("/dev/ttys009", op, true)), "own pty {op}");
    }
    assert!(!can(&e, "file-write-data", "/dev/disk0"));
}

#[test]
fn keychain_and_dns_only_when_switched_on() {
    let mach = |e: &Evaluator, n: &str| {
        e.allows(&Query {
            op: "mach-lookup",
            target: Target::Mach(n),
            pty_extension: false,
        })
    };
    let keychain = "/Users/dev/Library/Keychains/login.keychain-db";
    let off = ev(&npm_project());
    for n in [
        "com.apple.SecurityServer",
        "com.apple.dnssd.service",
        "com.apple.coreservices.launchservicesd",
        "com.apple.lsd.mapdb",
        "com.apple.diagnosticd",
    ] {
        assert!(!mach(&off, n), "{n} granted");
    }
    assert!(mach(&off, "com.apple.trustd"));
    assert!(!can(&off, "file-read-data", keychain));
    let on = ev(&host_with_switches());
    assert!(mach(&on, "com.apple.SecurityServer"));
    assert!(mach(&on, "com.apple.dnssd.service"));
    assert!(can(&on, "file-read-data", keychain));
    // No network, no certificate services (trustd fetches URLs itself).
    let none = check(&offline_narrow_read(), None);
    assert!(!mach(&none, "com.apple.trustd"));
    assert!(!mach(&none, "com.apple.ocspd"));
}

#[test]
fn network_modes() {
    let tcp = |e: &Evaluator, hp: &str| {
        e.allows(&Query {
            op: "network-outbound",
            target: Target::Tcp(hp),
            pty_extension: false,
        })
    };
    let proxy = check(&npm_project(), Some(50123));
    assert!(tcp(&proxy, "localhost:50123"));
    assert!(!tcp(&proxy, "localhost:22"));
    assert!(!tcp(&proxy, "*:443"));
    let none = check(&offline_narrow_read(), None);
    assert!(!tcp(&none, "localhost:50123"));
    // Host: IP anywhere, but still no host unix socket.
    let host = ev(&host_with_switches());
    assert!(tcp(&host, "*:443"));
    let bind = |e: &Evaluator| {
        e.allows(&Query {
            op: "network-bind",
            target: Target::LocalIp,
            pty_extension: false,
        })
    };
    assert!(bind(&host));
    assert!(!bind(&proxy));
    let ssh_agent = "/private/tmp/com.apple.launchd.abc/Listeners";
    assert!(!host.allows(&Query {
        op: "network-outbound",
        target: Target::Unix(ssh_agent),
        pty_extension: false
    }));
}

#[test]
fn home_as_workspace_grows_the_protected_set() {
    let e = ev(&host_with_switches());
    for p in [
        "/Users/dev/Library/LaunchAgents/com.evil.plist",
        "/Users/dev/Library/LAUNCHAGENTS/com.evil.plist",
        "/Users/dev/Library/Preferences/com.apple.Terminal.plist",
        "/Users/dev/.gitconfig",
        "/Users/dev/.config/git/config",
        "/Users/dev/.ssh/config",
        "/Users/dev/.local/bin/git",
        "/Users/dev/bin/ls",
        "/Users/dev/Library/Application Support/Code/User/tasks.json",
        "/Users/dev/.git/config",
        "/Users/dev/src/app/.git/hooks/pre-push",
    ] {
        assert!(!can(&e, "file-write-create", p), "{p} creatable");
    }
    for op in MOVE_OPS {
        assert!(!can(&e, op, "/Users/dev/Library"), "{op} ~/Library");
        // `mv ~/.ssh ~/k`
        assert!(!can(&e, op, "/Users/dev/.ssh"), "{op} ~/.ssh");
    }
    assert!(can(&e, "file-write-create", "/Users/dev/src/app/main.go"));
}

#[test]
fn symlinked_protected_files_protect_link_and_target() {
    let mut p = npm_project();
    // ~/.zshrc -> ~/dotfiles/zshrc: the plan holds the target, the
    // macOS plan the link.
    p.deny_write = vec![PathBuf::from("/Users/dev/dotfiles/zshrc")];
    p.macos.links = vec![PathBuf::from("/Users/dev/.zshrc")];
    p.write.push(PathBuf::from(HOME));
    let e = ev(&p);
    for path in ["/Users/dev/.zshrc", "/Users/dev/dotfiles/zshrc"] {
        for op in ["file-write-data", "file-write-unlink", "file-write-create"] {
            assert!(!can(&e, op, path), "{op} {path}");
        }
    }
    for op in MOVE_OPS {
        assert!(!can(&e, op, "/Users/dev/dotfiles"), "{op} dotfiles");
    }
}

#[test]
fn globs_match_what_they_say_whatever_their_characters() {
    let e = check(&offline_narrow_read(), None);
    let read = |p: &str| can(&e, "file-read-data", p);
    assert!(!read("/Users/dev/project/config/prod/credentials.json"));
    assert!(!read("/Users/dev/project/Config/prod/Credentials.JSON"));
    assert!(read("/Users/dev/project/config/a/b/credentials.json"));
    assert!(read("/Users/dev/project/config/prod/credentialsXjson"));
    // `**/` includes no directory at all.
    assert!(!read("/Users/dev/project/id_rsa.pem"));
    assert!(!read("/Users/dev/project/deep/er/id_ed.pem"));
    assert!(read("/Users/dev/project/id.pem"));
    let h = ev(&hostile());
    assert!(!can(&h, "file-read-data", "/Users/dev/a\"b/x/c"));
    assert!(!can(&h, "file-read-data", "/Users/dev/a\"b/x/c/d"));
    assert!(can(&h, "file-read-data", "/Users/dev/a\"b/x/y/c"));
    assert!(!can(&h, "file-read-data", "/Users/dev/x\\y/[z]/k"));
    assert!(can(&h, "file-read-data", "/Users/dev/x\\y/z/k"));
    // deny_write globs are enforced, not dropped.
    let w = ev(&host_with_switches());
    assert!(!can(
        &w,
        "file-write-create",
        "/Users/dev/Desktop/run.command"
    ));
    assert!(!can(&w, "file-write-create", "/Users/dev/run.command"));
    assert!(can(&w, "file-write-create", "/Users/dev/run.commands"));
}

#[test]
fn glob_regexes() {
    assert_eq!(pathre::glob("/a.b/*/c"), "^/[Aa]\\.[Bb]/[^/]*/[Cc](/|$)");
    assert_eq!(pathre::glob("/x/**"), "^/[Xx](/|$)");
    assert_eq!(pathre::glob("/x/**/y"), "^/[Xx]/([^/]*/)*[Yy](/|$)");
    assert_eq!(pathre::glob("/\"?"), "^/\"[^/](/|$)");
    assert_eq!(sbpl_string("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
}

#[test]
fn explicit_denies_come_last() {
    let e = ev(&host_with_switches());
    for op in DENIED_OPERATIONS {
        let q = eval::path(op, "/Users/dev/x");
        assert!(!e.allows(&q), "{op}");
    }
    let text = profile(&host_with_switches(), None).text;
    let last_allow = text.rfind("(allow").unwrap();
    for op in DENIED_OPERATIONS {
        assert!(text.rfind(&format!("(deny {op})")).unwrap() > last_allow);
    }
}

/// A path of 1–4 segments of hostile characters under HOME.
fn hostile_path() -> impl Strategy<Value = String> {
    proptest::collection::vec("[ -~\\n\\t\u{e9}\u{4e2d}]{1,10}", 1..4).prop_map(|segs| {
        let segs: Vec<String> = segs
            .into_iter()
            .map(|s| s.replace('/', "_"))
            .map(|s| if s == "." || s == ".." { "_".into() } else { s })
            .collect();
        format!("/Users/dev/{}", segs.join("/"))
    })
}

fn flip_case(s: &str, mask: &[bool]) -> String {
    s.chars()
        .zip(mask.iter().cycle())
        .map(|(c, &up)| {
            if up {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every protected path and each of its ancestors up to `/` has a
    /// move, unlink and create denial, in any letter case; nothing under a
    /// deny_read path is readable; nothing under a deny_write path is
    /// writable; the writable root's other files still are.
    #[test]
    fn every_protected_path_and_ancestor_holds(
        secret in hostile_path(),
        guarded in hostile_path(),
        mask in proptest::collection::vec(any::<bool>(), 1..8),
        port in 1u16..,
    ) {
        let p = plan(
            Net::Proxy,
            &["/"],
            &[HOME],
            &[secret.as_str()],
            &[guarded.as_str()],
            &[],
        );
        let e = check(&p, Some(port));
        for prot in [&secret, &guarded] {
            let path = std::path::Path::new(prot.as_str());
            for a in path.ancestors() {
                let a = a.display().to_string();
                for v in [a.clone(), flip_case(&a, &mask)] {
                    for op in MOVE_OPS {
                        prop_assert!(!can(&e, op, &v), "{} {:?} allowed", op, v);
                    }
                }
            }
            let child = format!("{prot}/x");
            prop_assert!(!can(&e, "file-write-data", &child));
            prop_assert!(!can(&e, "file-write-data", &flip_case(&child, &mask)));
        }
        prop_assert!(!can(&e, "file-read-data", &secret));
        let inside = format!("{secret}/k");
        prop_assert!(!can(&e, "file-read-data", &inside));
        prop_assert!(!can(&e, "file-read-data", &flip_case(&secret, &mask)));
        let other = "/Users/dev/zz-unrelated\u{1}/file";
        if !other.starts_with(&format!("{secret}/")) && !other.starts_with(&format!("{guarded}/")) {
            prop_assert!(can(&e, "file-write-create", other));
        }
    }

    /// A glob made of arbitrary characters compiles, matches the path it
    /// spells (with `*` standing for a segment) and not a sibling.
    #[test]
    fn glob_regexes_match_the_path_they_spell(
        a in "[ -~\u{e9}]{1,8}",
        b in "[ -~\u{e9}]{1,8}",
    ) {
        let clean = |s: &str| s.replace(['/', '*', '?'], "_");
        let (a, b) = (clean(&a), clean(&b));
        let spelled = |mid: &str, tail: &str| format!("/r/{a}/{mid}/{b}{tail}");
        let re = eval::compile(&pathre::glob(&spelled("*", "")));
        prop_assert!(re.is_match(&spelled("seg", "")));
        prop_assert!(re.is_match(&spelled("seg", "/inner")));
        prop_assert!(!re.is_match(&spelled("s/eg", "")));
        prop_assert!(!re.is_match(&spelled("seg", "x")));
    }
}

#[test]
fn non_ascii_letters_match_in_either_case() {
    let re = eval::compile(&pathre::subpath("/Users/dev/Ünï dir/ß"));
    assert!(re.is_match("/users/DEV/ünÏ dir/ß/x"));
    assert!(!re.is_match("/users/dev/uni dir/ß"));
}
