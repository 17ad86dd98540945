//! What overlayfs under `userxattr` does with the less common changes of a
//! `--review` run (SPEC §4.8): extended attributes, hard links, renamed
//! directories, opaque directories, modes that lock the owner out, and
//! the overlay's own marks, which the sandbox must not be able to forge.
//! Each is applied and compared with the same command run without review.
//! As root and as an ordinary user.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use airlock_tests::repos::{host, sandboxed, show};
use airlock_tests::review::{held_id, tree_with_xattrs as tree, xattrs};
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-review-overlay"))
}

fn set_xattr(p: &Path, name: &str, value: &str) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: NUL-terminated path and name, a value of its length.
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr {}", p.display());
}

fn fixture(who: Who) -> Fixture {
    let f = Fixture::new_in(&base());
    f.write("a.txt", "a\n");
    f.write("old.txt", "old\n");
    set_xattr(&f.ws.join("old.txt"), "user.old", "1");
    f.write("l1", "linked\n");
    f.write("d1/sub/f", "f\n");
    f.write("d2/x", "x\n");
    f.write("op/a", "a\n");
    f.write("op/b", "b\n");
    f.write("op/sub/c", "c\n");
    who.prepare(&f);
    // A host change in the start's own clock tick counts as a conflict.
    std::thread::sleep(std::time::Duration::from_millis(50));
    f
}

fn changes(f: &Fixture, who: Who, args: &[&str]) -> Out {
    let bin = airlock_bin();
    let mut all = vec!["changes"];
    all.extend_from_slice(args);
    host(f, who, &f.ws, bin.to_str().unwrap(), &all)
}

/// `script` under --review in `f`, and without it in `twin`; then apply,
/// and the two trees must be the same. Returns the review run's output
/// and its diff.
fn review_then_apply(f: &Fixture, twin: &Fixture, who: Who, script: &str) -> (Out, Out) {
    let before = tree(&f.ws);
    let out = sandboxed(f, who, &["--network", "none", "--review"], script);
    assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
    assert_eq!(tree(&f.ws), before, "{who:?}: the review run wrote through");
    let id = held_id(&out);
    let diff = changes(f, who, &["diff", &id]);
    assert_eq!(diff.code, 0, "{who:?}: {}", show(&diff));
    let plain = sandboxed(twin, who, &["--network", "none"], script);
    assert_eq!(plain.code, 0, "{who:?}: {}", show(&plain));
    let applied = changes(f, who, &["apply", &id]);
    assert_eq!(applied.code, 0, "{who:?}: {}", show(&applied));
    assert!(
        applied.stdout.contains("applied and removed"),
        "{who:?}: {}",
        show(&applied)
    );
    assert_eq!(
        tree(&f.ws),
        tree(&twin.ws),
        "{who:?}: apply differs from a plain run\n{}",
        show(&diff)
    );
    (out, diff)
}

#[test]
fn user_xattrs_set_in_review_are_applied_and_no_other_namespace_is_invented() {
    for who in Who::all() {
        let f = fixture(who);
        let twin = fixture(who);
        let p = probe_in(&base().join("bin"));
        let script = format!(
            "set -e; echo n > new.txt
            {p} setxattr new.txt user.note hello
            {p} setxattr a.txt user.note onA
            {p} setxattr op user.d dd
            {p} rmxattr old.txt user.old
            {p} setxattr new.txt trusted.t 1
            {p} setxattr new.txt security.s 1"
        );
        let (out, diff) = review_then_apply(&f, &twin, who, &script);
        for ok in [
            "setxattr user.note: ok",
            "setxattr user.d: ok",
            "rmxattr user.old: ok",
        ] {
            assert!(out.stdout.contains(ok), "{who:?}: {ok}: {}", show(&out));
        }
        for refused in ["setxattr trusted.t: ok", "setxattr security.s: ok"] {
            assert!(!out.stdout.contains(refused), "{who:?}: {}", show(&out));
        }
        // An attribute-only change is a change.
        for want in [
            "attributes changed     a.txt",
            "attributes changed     old.txt",
            "attributes changed     op",
        ] {
            assert!(
                diff.stdout.contains(want),
                "{who:?}: {want}: {}",
                show(&diff)
            );
        }
        let x = xattrs(&f.ws.join("new.txt"));
        assert_eq!(x.get("user.note").map(Vec::as_slice), Some(&b"hello"[..]));
        assert!(
            x.keys().all(|k| k.starts_with("user.")),
            "{who:?}: apply invented {x:?}"
        );
        assert_eq!(
            xattrs(&f.ws.join("a.txt"))
                .get("user.note")
                .map(Vec::as_slice),
            Some(&b"onA"[..])
        );
        assert!(xattrs(&f.ws.join("old.txt")).is_empty(), "{who:?}");
        assert!(
            !xattrs(&f.ws.join("op"))
                .keys()
                .any(|k| k.starts_with("user.overlay.")),
            "{who:?}: overlayfs's own marks reached the host"
        );
    }
}

#[test]
fn hard_links_renamed_and_opaque_directories_apply_as_a_plain_run() {
    for who in Who::all() {
        let f = fixture(who);
        let twin = fixture(who);
        let l1 = std::fs::metadata(f.ws.join("l1")).unwrap().ino();
        let script = "set -e
            ln l1 l1-link
            echo new > n1; ln n1 n2; echo more >> n1
            mv d1 d1-renamed
            mkdir d3; mv d2 d3/d2-moved
            mkdir fresh; echo f > fresh/f; mv fresh fresh2
            rm -rf op; mkdir -p op/sub; echo c2 > op/sub/c";
        let (_, diff) = review_then_apply(&f, &twin, who, script);
        for want in [
            "hard link created      l1-link (same file as l1)",
            "deleted                op/a",
            "deleted                d1",
            "created                d1-renamed/sub/f",
        ] {
            assert!(
                diff.stdout.contains(want),
                "{who:?}: {want}: {}",
                show(&diff)
            );
        }
        let ino = |n: &str| std::fs::metadata(f.ws.join(n)).unwrap().ino();
        // A link to the host's own file, not a copy of it.
        assert_eq!(ino("l1"), l1, "{who:?}");
        assert_eq!(ino("l1-link"), l1, "{who:?}");
        assert_eq!(ino("n1"), ino("n2"), "{who:?}");
        assert_eq!(
            std::fs::read_to_string(f.ws.join("n2")).unwrap(),
            "new\nmore\n"
        );
    }
}

#[test]
fn overlay_marks_cannot_be_forged_and_locked_modes_still_apply() {
    for who in Who::all() {
        let f = fixture(who);
        let p = probe_in(&base().join("bin"));
        // The sandbox's try at marking `op` opaque (which would read as
        // "delete everything the host has there") or redirecting a file.
        let out = sandboxed(
            &f,
            who,
            &["--network", "none", "--review"],
            &format!(
                "{p} setxattr op user.overlay.opaque y; echo n > n.txt
                 {p} setxattr n.txt user.overlay.redirect /a.txt; {p} setxattr d2 trusted.overlay.opaque y"
            ),
        );
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        let id = held_id(&out);
        let diff = changes(&f, who, &["diff", &id]);
        assert!(
            !diff.stdout.lines().any(|l| l.starts_with("deleted")),
            "{who:?}: {}",
            show(&diff)
        );
        let applied = changes(&f, who, &["apply", &id]);
        assert_eq!(applied.code, 0, "{who:?}: {}", show(&applied));
        for kept in ["op/a", "op/b", "op/sub/c", "d2/x", "a.txt"] {
            assert!(f.ws.join(kept).exists(), "{who:?}: {kept}");
        }
        assert_eq!(std::fs::read_to_string(f.ws.join("n.txt")).unwrap(), "n\n");

        // Modes that lock the owner out: airlock's user still reads the
        // layer, and the host gets the modes the sandbox gave. (No plain
        // twin here: a plain run's post-run check, as an ordinary user,
        // cannot search a directory left mode 000 and fails closed.)
        let g = fixture(who);
        let out = sandboxed(
            &g,
            who,
            &["--network", "none", "--review"],
            "set -e; mkdir d; echo x > d/f; chmod 000 d; echo s > secret; chmod 000 secret; chmod 000 d1",
        );
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        let id = held_id(&out);
        let diff = changes(&g, who, &["diff", &id]);
        assert!(
            diff.stdout
                .contains("mode changed           d1 (mode 755 -> 0)")
                && diff.stdout.contains("+x"),
            "{who:?}: {}",
            show(&diff)
        );
        let applied = changes(&g, who, &["apply", &id]);
        assert_eq!(applied.code, 0, "{who:?}: {}", show(&applied));
        assert!(
            applied.stdout.contains("applied and removed"),
            "{who:?}: {}",
            show(&applied)
        );
        let mode = |n: &str| std::fs::symlink_metadata(g.ws.join(n)).unwrap().mode() & 0o7777;
        assert_eq!(
            (mode("d"), mode("d/f"), mode("secret"), mode("d1")),
            (0, 0o644, 0, 0),
            "{who:?}"
        );
        assert_eq!(std::fs::read_to_string(g.ws.join("d/f")).unwrap(), "x\n");
        let _ = std::process::Command::new("chmod")
            .args(["-R", "u+rwx"])
            .arg(&g.ws)
            .status();
    }
}
