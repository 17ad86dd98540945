//! `run --review` (SPEC §4.5, §4.8): a git directory the sandbox makes
//! under any name (a bare repository's shape, a `.git` file's `gitdir:`
//! target, a worktree's admin directory with a `commondir`, the workspace
//! root itself) has its configuration and hooks marked protected in
//! `changes diff` and is not written by `changes apply` unless named, the
//! same rule the one-shot post-run check applies. The user's next git
//! command there runs nothing the sandbox wrote; the rest of the changeset
//! applies. Root and an ordinary user.

use std::path::{Path, PathBuf};

use airlock_tests::repos::{git_available, host, host_git_runs_nothing, repo, sandboxed, show};
use airlock_tests::review::held_id;
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-review-gitdirs"))
}

fn airlock_on_host(f: &Fixture, who: Who, args: &[&str]) -> Out {
    let bin = airlock_bin();
    host(f, who, &f.ws, bin.to_str().unwrap(), args)
}

/// Shell that makes `dir` a git directory whose configuration runs
/// `prog` (core.fsmonitor, with itself as the work tree), and `prog` a
/// script that leaves `marker`. `head` says whether to write `HEAD` and
/// `objects`/`refs` there (a common directory has none of its own HEAD).
fn plant(dir: &str, prog: &Path, marker: &Path, head: bool) -> String {
    let mut s = format!("mkdir -p {dir}; ");
    if head {
        s.push_str(&format!(
            "mkdir -p {dir}/objects {dir}/refs/heads; echo 'ref: refs/heads/main' > {dir}/HEAD; "
        ));
    }
    s.push_str(&format!(
        "printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tworktree = .\\n\\tfsmonitor = {}\\n' > {dir}/config; \
         printf '#!/bin/sh\\nid > {}\\necho 0\\n' > {}; chmod +x {}; ",
        prog.display(),
        marker.display(),
        prog.display(),
        prog.display(),
    ));
    s
}

/// The `--stat` line for `rel`, which must say it is protected.
fn assert_marked(diff: &Out, rel: &str, ctx: &str) {
    let line = diff
        .stdout
        .lines()
        .skip(1)
        .find(|l| l.split_whitespace().any(|w| w == rel))
        .unwrap_or_else(|| panic!("{ctx}: {rel} not shown: {}", show(diff)));
    assert!(
        line.contains("[protected"),
        "{ctx}: {rel} not marked: {line}"
    );
}

#[test]
fn git_directories_under_any_name_are_held_until_named() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let ctx = format!("{who:?}");
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        let ws = &f.ws;
        // A bare repository's shape in `tools/`; a `.git` file whose
        // `gitdir:` leads to one in `stash/x`; a worktree's admin
        // directory `wt/` whose `commondir` names `common/` (which holds
        // the configuration and no HEAD).
        let mut script = plant("tools", &ws.join("tools/fsm"), &marker, true);
        script.push_str(&plant("stash/x", &ws.join("stash/fsm"), &marker, true));
        script.push_str("mkdir -p sub && echo 'gitdir: ../stash/x' > sub/.git; ");
        script.push_str(&plant("common", &ws.join("common/fsm"), &marker, false));
        script.push_str(
            "mkdir -p common/objects common/refs/heads wt && echo 'ref: refs/heads/main' > wt/HEAD && echo ../common > wt/commondir; ",
        );
        script.push_str("echo ok > plain.txt; echo done");
        let out = sandboxed(&f, who, &["--network", "none", "--review"], &script);
        assert!(out.stdout.contains("done"), "{ctx}: {}", show(&out));
        let id = held_id(&out);
        let diff = airlock_on_host(&f, who, &["changes", "diff", &id, "--stat"]);
        assert_eq!(diff.code, 0, "{ctx}: {}", show(&diff));
        for rel in [
            "tools/config",
            "tools/HEAD",
            "stash/x/config",
            "sub/.git",
            "common/config",
            "wt/commondir",
            "wt/HEAD",
        ] {
            assert_marked(&diff, rel, &ctx);
        }
        let applied = airlock_on_host(&f, who, &["changes", "apply", &id]);
        assert_eq!(applied.code, 0, "{ctx}: {}", show(&applied));
        // The allowed part of the changeset is written.
        assert_eq!(
            std::fs::read_to_string(ws.join("plain.txt"))
                .ok()
                .as_deref(),
            Some("ok\n"),
            "{ctx}: {}",
            show(&applied)
        );
        assert!(ws.join("tools/fsm").exists(), "{ctx}: {}", show(&applied));
        for rel in [
            "tools/config",
            "stash/x/config",
            "sub/.git",
            "common/config",
        ] {
            assert!(
                std::fs::symlink_metadata(ws.join(rel)).is_err(),
                "{ctx}: {rel} applied unnamed: {}",
                show(&applied)
            );
        }
        for dir in ["tools", "stash/x", "sub", "wt", "common", "."] {
            host_git_runs_nothing(&f, who, &ws.join(dir), &marker);
        }
        // Named, a protected path is written.
        let named = airlock_on_host(&f, who, &["changes", "apply", &id, "tools/config"]);
        assert_eq!(named.code, 0, "{ctx}: {}", show(&named));
        assert!(ws.join("tools/config").exists(), "{ctx}: {}", show(&named));
        assert!(!ws.join("stash/x/config").exists(), "{ctx}");
    }
}

/// A bare repository made at the workspace root itself (no `.git` there):
/// its configuration and HEAD are held; the user's `git status` in the
/// workspace runs nothing.
#[test]
fn a_bare_repository_at_the_workspace_root_is_held() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let ctx = format!("{who:?}");
        let f = Fixture::new_in(&base());
        f.write("README", "mine\n");
        who.prepare(&f);
        let marker = f.home.join("PWNED");
        let mut script = plant(".", &f.ws.join("fsm"), &marker, true);
        script.push_str("echo ok > plain.txt; echo done");
        let out = sandboxed(&f, who, &["--network", "none", "--review"], &script);
        assert!(out.stdout.contains("done"), "{ctx}: {}", show(&out));
        let id = held_id(&out);
        let diff = airlock_on_host(&f, who, &["changes", "diff", &id, "--stat"]);
        for rel in ["config", "HEAD"] {
            assert_marked(&diff, rel, &ctx);
        }
        let applied = airlock_on_host(&f, who, &["changes", "apply", &id]);
        assert_eq!(applied.code, 0, "{ctx}: {}", show(&applied));
        assert!(f.ws.join("plain.txt").exists(), "{ctx}");
        assert!(!f.ws.join("config").exists(), "{ctx}: {}", show(&applied));
        assert!(!f.ws.join("HEAD").exists(), "{ctx}: {}", show(&applied));
        host_git_runs_nothing(&f, who, &f.ws, &marker);
    }
}
