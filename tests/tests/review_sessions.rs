//! `session start --review` (SPEC §4.7, §4.8): one changeset for the whole
//! session. Each command sees what the earlier ones changed (they share
//! one overlay), the host tree is untouched until `airlock changes apply`
//! after `session end`, and apply then gives exactly what the same
//! commands give without review. As root and as an ordinary user.

use std::path::{Path, PathBuf};
use std::process::Command;

use airlock_tests::repos::{sandboxed, show};
use airlock_tests::review::tree;
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-review-sessions"))
}

fn fixture(who: Who) -> Fixture {
    let f = Fixture::new_in(&base());
    f.write("a.txt", "one\ntwo\nthree\n");
    f.write("gone.txt", "bye\n");
    f.write("keep/sub/x.txt", "x\n");
    who.prepare(&f);
    // A host change in the start's own clock tick counts as a conflict.
    std::thread::sleep(std::time::Duration::from_millis(50));
    f
}

/// The session's two commands: the first edits and creates, the second
/// must see that and deletes one of what the first made, and one file of
/// the host's.
const FIRST: &str = "set -e
sed -i s/two/TWO/ a.txt
echo fresh > new.txt
echo temporary > temp.txt
mkdir -p made/deeper && echo d > made/deeper/f.txt
mv keep kept
echo first-ok";
const SECOND: &str = "set -e
grep -q TWO a.txt
test \"$(cat new.txt temp.txt made/deeper/f.txt kept/sub/x.txt)\" = \"$(printf 'fresh\\ntemporary\\nd\\nx')\"
test ! -e keep
rm temp.txt gone.txt
echo second-saw-the-first";

fn airlock(f: &Fixture, who: Who, args: &[&str]) -> Command {
    let bin = airlock_bin();
    who.host(f, &f.ws, bin.to_str().expect("a UTF-8 path"), args)
}

/// A running session, killed on drop unless it was ended.
struct Session<'a> {
    f: &'a Fixture,
    who: Who,
    name: String,
    pid: u32,
    ended: bool,
}

impl<'a> Session<'a> {
    /// Started with `--review`: returns it and the changeset's id.
    fn start(f: &'a Fixture, who: Who, name: &str) -> (Session<'a>, String) {
        let out = run(&mut airlock(
            f,
            who,
            &[
                "session",
                "start",
                "--name",
                name,
                "--network",
                "none",
                "--review",
            ],
        ));
        assert_eq!(out.code, 0, "{who:?}: session start: {}", show(&out));
        let info: serde_json::Value =
            serde_json::from_str(out.stdout.trim()).expect("session start prints JSON");
        let id = info["review"]
            .as_str()
            .unwrap_or_else(|| panic!("{who:?}: no changeset in {info}"))
            .to_string();
        let s = Session {
            f,
            who,
            name: name.to_string(),
            pid: info["pid"].as_u64().expect("pid") as u32,
            ended: false,
        };
        (s, id)
    }

    fn run(&self, extra: &[&str], script: &str) -> Out {
        let mut args = vec!["run", "--session", &self.name];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        run(&mut airlock(self.f, self.who, &args))
    }

    fn end(&mut self) -> Out {
        let out = run(&mut airlock(
            self.f,
            self.who,
            &["session", "end", &self.name],
        ));
        self.ended = true;
        out
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if !self.ended {
            // SAFETY: kill(2) on the session's supervisor.
            unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        }
    }
}

fn changes_dir(f: &Fixture) -> PathBuf {
    f.home.join(".local/state/airlock/changes")
}

#[test]
fn a_review_session_holds_every_command_in_one_changeset_applied_after_it_ends() {
    for who in Who::all() {
        let f = fixture(who);
        let twin = fixture(who);
        let before = tree(&f.ws);
        let (mut s, id) = Session::start(&f, who, "rev1");

        let one = s.run(&[], FIRST);
        assert_eq!(one.code, 0, "{who:?}: {}", show(&one));
        assert!(one.stdout.contains("first-ok"), "{who:?}: {}", show(&one));
        assert_eq!(
            tree(&f.ws),
            before,
            "{who:?}: the first command wrote through"
        );
        let two = s.run(&[], SECOND);
        assert_eq!(two.code, 0, "{who:?}: {}", show(&two));
        assert!(
            two.stdout.contains("second-saw-the-first"),
            "{who:?}: {}",
            show(&two)
        );
        assert_eq!(
            tree(&f.ws),
            before,
            "{who:?}: the second command wrote through"
        );
        // `--review` on a command of a session that holds review runs in it.
        let three = s.run(&["--review"], "test ! -e temp.txt && echo third-ok");
        assert_eq!(three.code, 0, "{who:?}: {}", show(&three));
        assert!(
            three.stdout.contains("third-ok"),
            "{who:?}: {}",
            show(&three)
        );

        // While the session runs its changeset is neither applied nor dropped.
        for verb in ["apply", "discard"] {
            let early = run(&mut airlock(&f, who, &["changes", verb, &id]));
            assert_ne!(early.code, 0, "{who:?}: {verb}: {}", show(&early));
            assert!(
                early.stderr.contains("still running")
                    && early.stderr.contains("airlock session end rev1"),
                "{who:?}: {verb}: {}",
                show(&early)
            );
        }
        assert_eq!(tree(&f.ws), before, "{who:?}");
        assert!(
            changes_dir(&f).join(&id).join("meta.json").exists(),
            "{who:?}"
        );

        let end = s.end();
        assert_eq!(end.code, 0, "{who:?}: session end: {}", show(&end));
        assert!(
            end.stderr
                .contains(&format!("held for review as {id}: 1 file changed"))
                && end.stderr.contains(&format!("apply {id}")),
            "{who:?}: {}",
            show(&end)
        );
        assert_eq!(tree(&f.ws), before, "{who:?}: the end wrote through");

        let diff = run(&mut airlock(&f, who, &["changes", "diff", &id]));
        assert_eq!(diff.code, 0, "{who:?}: {}", show(&diff));
        for want in [
            "(session rev1)",
            "-two",
            "+TWO",
            "deleted                gone.txt",
            "created                new.txt",
            "created                made/deeper/f.txt",
            "deleted                keep\n",
            "created                kept/sub/x.txt",
        ] {
            assert!(
                diff.stdout.contains(want),
                "{who:?}: {want}: {}",
                show(&diff)
            );
        }
        assert!(
            !diff.stdout.contains("temp.txt"),
            "{who:?}: made and deleted in the session, it is no change: {}",
            show(&diff)
        );

        // The same commands without review, in a twin workspace.
        for script in [FIRST, SECOND] {
            let plain = sandboxed(&twin, who, &["--network", "none"], script);
            assert_eq!(plain.code, 0, "{who:?}: {}", show(&plain));
        }
        let applied = run(&mut airlock(&f, who, &["changes", "apply", &id]));
        assert_eq!(applied.code, 0, "{who:?}: {}", show(&applied));
        assert_eq!(
            tree(&f.ws),
            tree(&twin.ws),
            "{who:?}: apply differs from running the commands without review"
        );
        assert!(!changes_dir(&f).join(&id).exists(), "{who:?}");
    }
}

#[test]
fn discarding_a_review_session_leaves_no_trace() {
    for who in Who::all() {
        let f = fixture(who);
        let before = tree(&f.ws);
        let (mut s, id) = Session::start(&f, who, "rev2");
        assert_eq!(s.run(&[], FIRST).code, 0, "{who:?}");
        let end = s.end();
        assert!(
            end.stderr.contains(&format!("held for review as {id}")),
            "{who:?}: {}",
            show(&end)
        );
        let d = run(&mut airlock(&f, who, &["changes", "discard", &id]));
        assert_eq!(d.code, 0, "{who:?}: {}", show(&d));
        assert_eq!(tree(&f.ws), before, "{who:?}");
        let left: Vec<_> = std::fs::read_dir(changes_dir(&f))
            .unwrap()
            .flatten()
            .collect();
        assert!(left.is_empty(), "{who:?}: {left:?}");
    }
}

#[test]
fn review_in_a_session_refuses_where_it_cannot_hold_and_never_writes_through() {
    let who = Who::Me;
    let f = fixture(who);
    let before = tree(&f.ws);
    // The changesets' directory inside a writable root: the session does
    // not start.
    let out = run(airlock(
        &f,
        who,
        &[
            "session",
            "start",
            "--name",
            "rev3",
            "--network",
            "none",
            "--review",
        ],
    )
    .env("XDG_STATE_HOME", f.ws.join("state")));
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(out.stderr.contains("--review"), "{}", show(&out));
    // A session started without review refuses a command that asks for it.
    let plain = run(&mut airlock(
        &f,
        who,
        &["session", "start", "--name", "rev4", "--network", "none"],
    ));
    assert_eq!(plain.code, 0, "{}", show(&plain));
    let asked = run(&mut airlock(
        &f,
        who,
        &[
            "run",
            "--session",
            "rev4",
            "--review",
            "--",
            "sh",
            "-c",
            "echo x > a.txt",
        ],
    ));
    assert_ne!(asked.code, 0, "{}", show(&asked));
    assert!(
        asked.stderr.contains("started without --review"),
        "{}",
        show(&asked)
    );
    let end = run(&mut airlock(&f, who, &["session", "end", "rev4"]));
    assert_eq!(end.code, 0, "{}", show(&end));
    let left = std::fs::read_dir(f.ws.join("state/airlock/changes")).map_or(0, |d| d.count());
    assert_eq!(left, 0, "the refused session left a changeset");
    assert_eq!(
        tree(&f.ws).get(Path::new("a.txt")),
        before.get(Path::new("a.txt"))
    );
}
