//! Hook managers' configuration is part of the protected set (SPEC §4.5):
//! `git commit` on the host runs whatever `.pre-commit-config.yaml`,
//! lefthook's, overcommit's or lint-staged's file names, just as it runs a
//! `.husky` hook. The sandbox cannot change the user's file, and a file it
//! creates is moved to the quarantine. Root and an ordinary user, both tiers.

use std::path::PathBuf;

use airlock_tests::repos::{git_available, host};
use airlock_tests::tiers::{command, show, TIERS};
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-hookmgr"))
}

const USER_CONFIG: &str = "repos:\n- repo: local\n  hooks: []\n";

/// Files the sandbox tries to create; none exists before.
const CREATED: &[&str] = &[
    "lefthook.yml",
    ".lefthook.yaml",
    ".overcommit.yml",
    ".lintstagedrc.json",
    ".simple-git-hooks.json",
    ".config/lefthook.yml",
];

#[test]
fn hook_manager_files_cannot_be_changed_or_planted() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for tier in TIERS {
        for who in Who::all() {
            let as_user = who == Who::Nobody;
            let f = Fixture::new_in(&base());
            f.write(".pre-commit-config.yaml", USER_CONFIG);
            who.prepare(&f);
            let out = host(&f, who, &f.ws, "git", &["init", "-q", "."]);
            assert_eq!(out.code, 0, "{}", show(&out));
            let evil = "repos:\\n- repo: local\\n  hooks:\\n  - id: x\\n    entry: touch /tmp/PWNED\\n    language: system\\n";
            let mut script = format!(
                "printf '{evil}' > .pre-commit-config.yaml 2>/dev/null; \
                 mv .pre-commit-config.yaml moved.yaml 2>/dev/null; \
                 rm -f .pre-commit-config.yaml 2>/dev/null; mkdir -p .config; "
            );
            for c in CREATED {
                script.push_str(&format!("printf '{evil}' > {c}; "));
            }
            script.push_str("echo allowed > notes.txt && echo done");
            let ctx = format!("{tier:?} {who:?}");
            let out = run(&mut command(
                &f,
                tier,
                as_user,
                &["--network", "none"],
                &script,
            ));
            assert!(out.stdout.contains("done"), "{ctx}: {}", show(&out));
            // The user's file is theirs, unchanged, where it was.
            assert_eq!(
                std::fs::read_to_string(f.ws.join(".pre-commit-config.yaml")).ok(),
                Some(USER_CONFIG.to_string()),
                "{ctx}: {}",
                show(&out)
            );
            // What the sandbox planted is not where a hook would read it.
            for c in CREATED {
                assert!(
                    !f.ws.join(c).exists(),
                    "{ctx}: {c} was left in place: {}",
                    show(&out)
                );
            }
            assert!(
                out.stderr.contains("quarantine"),
                "{ctx}: nothing reported: {}",
                show(&out)
            );
            // The rest of the workspace is as writable as before.
            assert_eq!(
                std::fs::read_to_string(f.ws.join("notes.txt")).ok(),
                Some("allowed\n".to_string()),
                "{ctx}"
            );
        }
    }
}

/// The same files at the top of a nested repository's work tree: what the
/// sandbox plants there is moved to the quarantine; the user's own file,
/// untouched, stays.
#[test]
fn hook_manager_files_planted_in_a_nested_repository_are_quarantined() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("lib/lefthook.yml", "pre-commit:\n  commands: {}\n");
        who.prepare(&f);
        let lib = f.ws.join("lib");
        let out = host(&f, who, &lib, "git", &["init", "-q", "."]);
        assert_eq!(out.code, 0, "{}", show(&out));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let out = run(&mut command(
            &f,
            airlock_tests::tiers::Tier::Full,
            who == Who::Nobody,
            &["--network", "none"],
            "printf 'repos: []\\n' > lib/.pre-commit-config.yaml; mkdir -p lib/.lefthook/pre-commit; \
             printf 'touch /tmp/x\\n' > lib/.lefthook/pre-commit/run.sh; cat lib/lefthook.yml >/dev/null; echo done",
        ));
        assert!(out.stdout.contains("done"), "{who:?}: {}", show(&out));
        for planted in [".pre-commit-config.yaml", ".lefthook/pre-commit/run.sh"] {
            assert!(
                !lib.join(planted).exists(),
                "{who:?}: lib/{planted} was left in place: {}",
                show(&out)
            );
        }
        assert_eq!(
            std::fs::read_to_string(lib.join("lefthook.yml"))
                .ok()
                .as_deref(),
            Some("pre-commit:\n  commands: {}\n"),
            "{who:?}: {}",
            show(&out)
        );
    }
}
