//! airlock's state directory (held changesets, sessions) is out of every
//! sandbox's reach, also when HOME is a writable root (SPEC §3.5, §4.5;
//! red team round 2): a sandbox that rewrote a held changeset would have
//! `changes apply` write its hook into the user's repository. And `changes
//! apply` refuses a record whose roots no run layers. Root and an ordinary
//! user.

use std::path::{Path, PathBuf};

use airlock_tests::repos::{host, host_git_runs_nothing, repo, sandboxed, show};
use airlock_tests::review::held_id;
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-statedir"))
}

fn changes(f: &Fixture, who: Who, args: &[&str]) -> Out {
    let bin = airlock_bin().display().to_string();
    let mut all = vec!["changes"];
    all.extend_from_slice(args);
    host(f, who, &f.ws, &bin, &all)
}

/// A held changeset that creates `a.txt` in a committed repository.
fn held(who: Who) -> (Fixture, String, PathBuf) {
    let f = repo(&base(), who);
    let out = sandboxed(&f, who, &["--review"], "echo hi > a.txt");
    assert_eq!(out.code, 0, "{}", show(&out));
    let id = held_id(&out);
    let dir = f.home.join(".local/state/airlock/changes").join(&id);
    assert!(dir.join("meta.json").is_file(), "{}", show(&out));
    (f, id, dir)
}

#[test]
fn a_run_with_home_writable_cannot_touch_held_changesets() {
    for who in Who::all() {
        let (f, id, dir) = held(who);
        let meta_before = std::fs::read(dir.join("meta.json")).unwrap();
        let state = f.home.join(".local/state");
        let marker = f.ws.join("PWNED");
        let home = f.home.display().to_string();
        // Rewrite the record and the layer, plant a changeset of its own,
        // and carry the state directory away by renaming its parents.
        let script = format!(
            "d={d}; mkdir -p $d/layers/0/upper/.git/hooks; \
             printf '#!/bin/sh\\nid > {m}\\n' > $d/layers/0/upper/.git/hooks/pre-commit; \
             echo '{{}}' > $d/meta.json; echo x >> $d/layers/0/upper/a.txt; \
             mkdir -p {s}/airlock/changes/0badc0de; \
             mv {s}/airlock {s}/airlock.old; mv {s} {s}.old; mv {h}/.local {h}/.local.old; \
             echo allowed > {h}/notes.txt && echo done",
            d = dir.display(),
            m = marker.display(),
            s = state.display(),
            h = f.home.display()
        );
        let out = sandboxed(
            &f,
            who,
            &["--network", "none", "--workspace", &home],
            &script,
        );
        assert!(out.stdout.contains("done"), "{who:?}: {}", show(&out));
        assert_eq!(
            std::fs::read(dir.join("meta.json")).unwrap(),
            meta_before,
            "{who:?}: the held changeset's record was rewritten: {}",
            show(&out)
        );
        assert!(
            !dir.join("layers/0/upper/.git").exists(),
            "{who:?}: {}",
            show(&out)
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("layers/0/upper/a.txt")).ok(),
            Some("hi\n".to_string()),
            "{who:?}: {}",
            show(&out)
        );
        assert!(!state.join("airlock/changes/0badc0de").exists(), "{who:?}");
        for moved in [
            state.join("airlock.old"),
            f.home.join(".local/state.old"),
            f.home.join(".local.old"),
        ] {
            assert!(!moved.exists(), "{who:?}: {} was moved", moved.display());
        }
        // HOME is as writable as it was.
        assert!(f.home.join("notes.txt").is_file(), "{who:?}");
        // The changeset the user reviewed is what is applied, and nothing
        // planted runs.
        let out = changes(&f, who, &["apply", &id]);
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        assert_eq!(
            std::fs::read_to_string(f.ws.join("a.txt")).ok(),
            Some("hi\n".to_string())
        );
        assert!(!f.ws.join(".git/hooks/pre-commit").exists(), "{who:?}");
        host_git_runs_nothing(&f, who, &f.ws, &marker);
    }
}

/// The state directory that does not exist yet is made before the sandbox
/// starts, so the sandbox cannot make it (and a changeset in it) itself.
#[test]
fn an_absent_state_directory_cannot_be_made_by_the_sandbox() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let state = f.home.join(".local/state/airlock");
        assert!(!state.exists());
        let home = f.home.display().to_string();
        let script = format!(
            "mkdir -p {s}/changes/0badc0de && echo '{{}}' > {s}/changes/0badc0de/meta.json; \
             echo allowed > {h}/notes.txt && echo done",
            s = state.display(),
            h = f.home.display()
        );
        let out = sandboxed(
            &f,
            who,
            &["--network", "none", "--workspace", &home],
            &script,
        );
        assert!(out.stdout.contains("done"), "{who:?}: {}", show(&out));
        assert!(
            !state.join("changes/0badc0de").exists(),
            "{who:?}: the sandbox made a changeset: {}",
            show(&out)
        );
        assert!(f.home.join("notes.txt").is_file(), "{who:?}");
    }
}

/// Defence in depth: a record whose root was re-pointed (here, at the
/// repository's `.git`) is refused, and nothing is written.
#[test]
fn changes_apply_refuses_a_record_whose_roots_no_run_layers() {
    for who in Who::all() {
        let (f, id, dir) = held(who);
        let meta_path = dir.join("meta.json");
        let mut meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
        let git = f.ws.join(".git").display().to_string();
        meta["roots"] = serde_json::json!([git]);
        write_as(who, &meta_path, &serde_json::to_vec(&meta).unwrap());
        let out = changes(&f, who, &["apply", &id]);
        assert_ne!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(out.stderr.contains("refused"), "{who:?}: {}", show(&out));
        assert!(!f.ws.join(".git/a.txt").exists(), "{who:?}");
        assert!(!f.ws.join("a.txt").exists(), "{who:?}");
    }
}

fn write_as(who: Who, p: &Path, bytes: &[u8]) {
    std::fs::write(p, bytes).unwrap();
    if who == Who::Nobody {
        airlock_tests::who::chown(p);
    }
}
