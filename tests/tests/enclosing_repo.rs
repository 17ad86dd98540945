//! A workspace that is a subdirectory of a repository (SPEC §4.5, red team
//! round 2): the enclosing repository's `core.hooksPath` names a directory
//! inside the workspace (a monorepo that keeps its hooks in a package).
//! The user's next `git commit` in the repository runs those hooks, so no
//! sandbox may change or add one. The workspace is found by `airlock.toml`
//! or given by `--workspace`; root and an ordinary user, both tiers.

use std::path::PathBuf;

use airlock_tests::repos::{empty_commit, git_available, host, host_git_runs_nothing};
use airlock_tests::tiers::{command, show, Tier, TIERS};
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-enclosing"))
}

const HOOK: &str = "#!/bin/sh\nexit 0\n";

/// Repository W (the fixture's workspace) with `core.hooksPath =
/// app/githooks` committed; the fixture's workspace becomes W/app. `via`:
/// how the run finds it ("toml": a trusted `airlock.toml` there; else
/// `--workspace`).
fn monorepo(who: Who, via: &str) -> (Fixture, PathBuf) {
    let mut f = Fixture::new_in(&base());
    let w = f.ws.clone();
    f.write("app/githooks/pre-commit", HOOK);
    f.write("app/src/main.txt", "code\n");
    if via == "toml" {
        f.write("app/airlock.toml", "version = 1\n");
    }
    let _ = std::process::Command::new("chmod")
        .arg("+x")
        .arg(w.join("app/githooks/pre-commit"))
        .status();
    who.prepare(&f);
    let g = |args: &[&str]| {
        let out = host(&f, who, &w, "git", args);
        assert_eq!(out.code, 0, "git {args:?}: {}", show(&out));
    };
    g(&["init", "-q", "."]);
    g(&["config", "core.hooksPath", "app/githooks"]);
    g(&["add", "-A"]);
    g(&empty_commit("init"));
    f.ws = w.join("app");
    if via == "toml" {
        let out = run(&mut who.host(
            &f,
            &f.ws,
            &airlock_bin().display().to_string(),
            &["policy", "trust", "airlock.toml"],
        ));
        assert_eq!(out.code, 0, "trust: {}", show(&out));
    }
    (f, w)
}

#[test]
fn enclosing_repositorys_hooks_path_inside_the_workspace_is_protected() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for (tier, via) in TIERS
        .iter()
        .map(|t| (*t, "toml"))
        .chain([(Tier::Full, "flag")])
    {
        for who in Who::all() {
            let ctx = format!("{tier:?} {who:?} {via}");
            let (f, w) = monorepo(who, via);
            let marker = w.join("PWNED");
            let ws = f.ws.display().to_string();
            let mut args = vec!["--network", "none"];
            if via == "flag" {
                args.extend(["--workspace", ws.as_str()]);
            }
            let script = format!(
                "printf '#!/bin/sh\\nid > {m}\\n' > githooks/pre-commit; \
                 printf '#!/bin/sh\\nid > {m}\\n' > githooks/post-commit; chmod +x githooks/post-commit; \
                 mv githooks githooks.old; mkdir -p githooks; \
                 printf '#!/bin/sh\\nid > {m}\\n' > githooks/pre-commit; chmod +x githooks/pre-commit; \
                 echo allowed > src/notes.txt && echo done",
                m = marker.display()
            );
            let out = run(&mut command(&f, tier, who == Who::Nobody, &args, &script));
            assert!(out.stdout.contains("done"), "{ctx}: {}", show(&out));
            // The user's hook is as it was, and nothing was added beside it.
            assert_eq!(
                std::fs::read_to_string(f.ws.join("githooks/pre-commit")).ok(),
                Some(HOOK.to_string()),
                "{ctx}: {}",
                show(&out)
            );
            assert!(
                !f.ws.join("githooks/post-commit").exists(),
                "{ctx}: a planted hook was left in place: {}",
                show(&out)
            );
            // The user's next git commands in W run nothing planted.
            host_git_runs_nothing(&f, who, &w, &marker);
            // The rest of the workspace stays writable.
            assert_eq!(
                std::fs::read_to_string(f.ws.join("src/notes.txt")).ok(),
                Some("allowed\n".to_string()),
                "{ctx}: {}",
                show(&out)
            );
        }
    }
}

/// An include the enclosing repository's config names, relative to the
/// config file, that lies inside the workspace: it is configuration the
/// user's git obeys (`core.fsmonitor` there runs a program).
#[test]
fn enclosing_repositorys_include_inside_the_workspace_is_protected() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let (f, w) = monorepo(who, "flag");
        let inc = f.ws.join("team.gitconfig");
        std::fs::write(&inc, "[user]\n\tname = team\n").unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&inc);
        }
        // Relative to W/.git/config: git resolves it from the including file.
        let out = host(
            &f,
            who,
            &w,
            "git",
            &["config", "include.path", "../app/team.gitconfig"],
        );
        assert_eq!(out.code, 0, "{}", show(&out));
        let marker = w.join("PWNED");
        let ws = f.ws.display().to_string();
        let script = format!(
            "printf '[core]\\n\\tfsmonitor = \"id > {m}; false\"\\n' >> team.gitconfig; \
             echo allowed > src/notes.txt && echo done",
            m = marker.display()
        );
        let out = run(&mut command(
            &f,
            Tier::Full,
            who == Who::Nobody,
            &["--network", "none", "--workspace", &ws],
            &script,
        ));
        assert!(out.stdout.contains("done"), "{who:?}: {}", show(&out));
        assert_eq!(
            std::fs::read_to_string(&inc).ok().as_deref(),
            Some("[user]\n\tname = team\n"),
            "{who:?}: {}",
            show(&out)
        );
        host_git_runs_nothing(&f, who, &w, &marker);
        assert!(f.ws.join("src/notes.txt").exists(), "{who:?}");
    }
}
