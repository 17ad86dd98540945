//! Repositories the post-run check must find however they are made (SPEC
//! §3.5, §4.5; red team rounds 19 and 20): assembled from parts, completed
//! by a later run, planted in the workspace's own `.git`, below a mount,
//! with a rebase or hooks left to run; and the user's own nested
//! repositories, which the check must leave as they are. Every case runs
//! as root and as an ordinary user where it can, runs the git the user
//! would run afterwards on the host, and checks it ran nothing.

use std::path::{Path, PathBuf};

use airlock_tests::repos::*;
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-nested"))
}

/// `git` on the host in `dir`, as `who`; it must succeed.
fn git_ok(f: &Fixture, who: Who, dir: &Path, args: &[&str]) {
    let o = host(f, who, dir, "git", args);
    assert_eq!(o.code, 0, "git {args:?} in {}: {}", dir.display(), show(&o));
}

/// What `find DIR EXPR...` prints (nothing when it cannot run).
fn find(dir: &Path, expr: &[&str]) -> String {
    std::process::Command::new("find")
        .arg(dir)
        .args(expr)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

const ID: [&str; 4] = ["-c", "user.email=t@t", "-c", "user.name=t"];

/// A git directory assembled from parts (red team round 19): `HEAD` and a
/// `commondir` file in one directory, the configuration and hooks in
/// another that holds no `HEAD` (so neither looks like a repository by
/// itself); at the workspace root, or below it.
const COMMONDIR_PLANT: &str = r#"
git init -q --bare data/y
mkdir -p tmpwt && echo hello > tmpwt/README
git --git-dir=data/y --work-tree=tmpwt add README
git --git-dir=data/y --work-tree=tmpwt -c user.name=a -c user.email=a@b commit -qm init
rm -rf tmpwt data/y/HEAD data/y/hooks/*.sample
git config --file data/y/config core.pager "touch $MARKER; cat"
git config --file data/y/config core.fsmonitor "touch $MARKER; false"
for h in reference-transaction pre-commit post-checkout; do
  printf '#!/bin/sh\ntouch %s\n' "$MARKER" > data/y/hooks/$h; chmod +x data/y/hooks/$h
done
echo 'ref: refs/heads/master' > "$AT/HEAD"; echo "$UP"data/y > "$AT/commondir"
echo planted
"#;

#[test]
fn a_repository_assembled_from_parts_runs_nothing_later() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        // Below the workspace (a repository as the workspace), and the
        // workspace root itself (no repository).
        for (at, up, is_repo) in [("sub/x", "../../", true), (".", "", false)] {
            let f = if is_repo {
                repo(&base(), who)
            } else {
                let f = Fixture::new_in(&base());
                who.prepare(&f);
                f
            };
            let marker = f.home.join("PWNED");
            let script = format!(
                "export MARKER={m} AT={at} UP={up}; mkdir -p {at}; {COMMONDIR_PLANT}",
                m = marker.display()
            );
            let out = sandboxed(&f, who, &["--network", "none"], &script);
            assert!(
                out.stdout.contains("planted"),
                "{who:?} {at}: {}",
                show(&out)
            );
            host_git_runs_nothing(&f, who, &f.ws.join(at), &marker);
            assert!(
                out.stderr.contains("protected path"),
                "{who:?} {at}: {}",
                show(&out)
            );
            // The workspace's own files are untouched.
            assert!(f.ws.join("data/y/objects").is_dir(), "{who:?} {at}");
        }
    }
}

/// One run writes a repository's hooks and configuration while it is no
/// repository (no `HEAD`, under another name); a later run only gives it
/// its `HEAD` and name back. Every file it then uses is older than the
/// second run, and was still written by a sandbox (SPEC §3.5).
#[test]
fn a_repository_completed_by_a_later_run_runs_nothing() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        let first = format!(
            r#"set -e; M={m}
               git init -q sub/r && cd sub/r
               git -c user.name=a -c user.email=a@b commit -q --allow-empty -m inner
               git config core.fsmonitor "touch $M; false"
               printf '#!/bin/sh\ntouch %s\n' "$M" > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit
               rm .git/HEAD && mv .git .gitstash && echo first-done"#,
            m = marker.display()
        );
        let out = sandboxed(&f, who, &["--network", "none"], &first);
        assert!(out.stdout.contains("first-done"), "{who:?}: {}", show(&out));
        // The second run starts on a later tick of the ctime clock.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "cd sub/r && mv .gitstash .git && echo 'ref: refs/heads/master' > .git/HEAD && echo second-done",
        );
        assert!(
            out.stdout.contains("second-done"),
            "{who:?}: {}",
            show(&out)
        );
        host_git_runs_nothing(&f, who, &f.ws.join("sub/r"), &marker);
        assert!(
            out.stderr.contains("protected path"),
            "{who:?}: {}",
            show(&out)
        );
        // A repository used inside, with nothing planted, is left as it is.
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "cd sub/r && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m clean && git checkout -q -b topic && echo clean-done",
        );
        assert!(out.stdout.contains("clean-done"), "{who:?}: {}", show(&out));
        assert!(
            !out.stderr.contains("protected path"),
            "{who:?}: a clean repository was judged: {}",
            show(&out)
        );
    }
}

/// A submodule's git directory made inside the workspace's own `.git`
/// (`.git/modules/<name>`), which the user's `git submodule update --init`
/// then takes as it is, hooks included.
#[test]
fn a_git_directory_planted_in_dot_git_modules_runs_nothing() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        // A submodule recorded but not initialised, from a source repository
        // in HOME.
        let src = f.home.join("subsrc");
        std::fs::create_dir_all(&src).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        let g = |dir: &Path, args: &[&str]| {
            let o = host(&f, who, dir, "git", args);
            assert_eq!(o.code, 0, "git {args:?}: {}", show(&o));
        };
        let id = ["-c", "user.email=t@t", "-c", "user.name=t"];
        g(&src, &["init", "-q", "."]);
        g(
            &src,
            &[&id[..], &["commit", "-q", "--allow-empty", "-m", "s"]].concat(),
        );
        let s = src.display().to_string();
        g(
            &f.ws,
            &[
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "add",
                "-q",
                &s,
                "lib",
            ],
        );
        g(&f.ws, &[&id[..], &["commit", "-q", "-m", "add"]].concat());
        g(&f.ws, &["submodule", "deinit", "-q", "-f", "lib"]);
        let _ = std::fs::remove_dir_all(f.ws.join(".git/modules/lib"));
        let script = format!(
            r#"set -e
               git clone -q --bare {s} .git/modules/lib
               git config --file .git/modules/lib/config core.bare false
               git config --file .git/modules/lib/config core.worktree ../../../lib
               printf '#!/bin/sh\ntouch {m}\n' > .git/modules/lib/hooks/post-checkout
               chmod +x .git/modules/lib/hooks/post-checkout && echo planted"#,
            m = marker.display()
        );
        let out = sandboxed(&f, who, &["--network", "none"], &script);
        assert!(out.stdout.contains("planted"), "{who:?}: {}", show(&out));
        let _ = host(
            &f,
            who,
            &f.ws,
            "git",
            &[
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "update",
                "-q",
                "--init",
            ],
        );
        assert!(
            !marker.exists(),
            "{who:?}: git submodule update ran a hook the sandbox planted\n{}",
            show(&out)
        );
        assert!(
            out.stderr.contains("protected path"),
            "{who:?}: {}",
            show(&out)
        );
    }
}

/// An interactive rebase left stopped, whose remaining steps run a
/// command: the user's `git rebase --continue` would run it. A stopped
/// rebase without such a step is left as it is.
#[test]
fn a_rebase_left_with_a_command_to_run_runs_nothing() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        for plant in [true, false] {
            let f = repo(&base(), who);
            let marker = f.home.join("PWNED");
            let steps = if plant {
                r"break\nexec ./lint.sh\n"
            } else {
                r"break\n"
            };
            let script = format!(
                r#"id="-c user.name=a -c user.email=a@b"
                   git $id commit -q --allow-empty -m one && git $id commit -q --allow-empty -m two
                   printf '#!/bin/sh\nprintf "{steps}" > "$1"\n' > /tmp/ed.sh; chmod +x /tmp/ed.sh
                   printf '#!/bin/sh\ntouch {m}\n' > lint.sh; chmod +x lint.sh
                   GIT_SEQUENCE_EDITOR=/tmp/ed.sh git $id rebase -q -i HEAD~1; echo stopped"#,
                m = marker.display()
            );
            let out = sandboxed(&f, who, &["--network", "none"], &script);
            assert!(out.stdout.contains("stopped"), "{who:?}: {}", show(&out));
            let todo = f.ws.join(".git/rebase-merge/git-rebase-todo");
            if plant {
                let _ = host(&f, who, &f.ws, "git", &["rebase", "--continue"]);
                assert!(
                    !marker.exists(),
                    "{who:?}: git rebase --continue ran the sandbox's step\n{}",
                    show(&out)
                );
                assert!(
                    out.stderr.contains("protected path"),
                    "{who:?}: {}",
                    show(&out)
                );
            } else {
                assert!(
                    todo.exists(),
                    "{who:?}: a plain rebase was undone: {}",
                    show(&out)
                );
                assert!(
                    !out.stderr.contains("protected path"),
                    "{who:?}: {}",
                    show(&out)
                );
            }
        }
    }
}

/// A submodule whose name holds a `/` has its git directory two levels
/// down `.git/modules`; git takes it with `refs` an executable file. The
/// sandbox plants it in one run; the user's `git submodule update --init`
/// would reuse it, hooks and configuration included.
#[test]
fn a_submodule_git_directory_at_any_depth_runs_nothing() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        let src = f.home.join("up");
        std::fs::create_dir_all(&src).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        git_ok(&f, who, &src, &["init", "-q", "."]);
        git_ok(
            &f,
            who,
            &src,
            &[&ID[..], &["commit", "-q", "--allow-empty", "-m", "up"]].concat(),
        );
        let s = src.display().to_string();
        let file = ["-c", "protocol.file.allow=always"];
        git_ok(
            &f,
            who,
            &f.ws,
            &[
                &file[..],
                &["submodule", "add", "-q", &s, "third_party/lib"],
            ]
            .concat(),
        );
        git_ok(
            &f,
            who,
            &f.ws,
            &[&ID[..], &["commit", "-q", "-m", "add"]].concat(),
        );
        git_ok(
            &f,
            who,
            &f.ws,
            &["submodule", "deinit", "-q", "-f", "third_party/lib"],
        );
        let _ = std::fs::remove_dir_all(f.ws.join(".git/modules"));
        let script = format!(
            r#"set -e; M=.git/modules/third_party/lib
               sha=$(git ls-tree HEAD third_party/lib | cut -d' ' -f3 | cut -f1)
               mkdir -p $M/hooks; cp -r {s}/.git/objects $M/objects
               echo $sha > $M/HEAD; printf '#!/bin/sh\n' > $M/refs; chmod 755 $M/refs
               printf '[core]\n\tworktree = ../../../../third_party/lib\n\tfsmonitor = "touch {m}; false"\n' > $M/config
               printf '#!/bin/sh\ntouch {m}\n' > $M/hooks/post-checkout; chmod 755 $M/hooks/post-checkout
               echo planted"#,
            m = marker.display()
        );
        let out = sandboxed(&f, who, &["--network", "none"], &script);
        assert!(out.stdout.contains("planted"), "{who:?}: {}", show(&out));
        let _ = host(
            &f,
            who,
            &f.ws,
            "git",
            &[&file[..], &["submodule", "update", "-q", "--init"]].concat(),
        );
        host_git_runs_nothing(&f, who, &f.ws.join("third_party/lib"), &marker);
        assert!(
            out.stderr.contains("protected path"),
            "{who:?}: {}",
            show(&out)
        );
    }
}

/// Two runs: the first leaves a directory git would not take yet (no
/// `HEAD`; or a `commondir` naming a directory whose name git reads with a
/// trailing space and a byte that is no UTF-8), the second renames it to
/// `.git`. Its hooks and configuration are older than the second run.
#[test]
fn a_git_directory_renamed_into_place_by_a_later_run_runs_nothing() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        for shape in ["refs-file", "odd-commondir"] {
            let f = repo(&base(), who);
            let marker = f.home.join("PWNED");
            let m = marker.display();
            let first = match shape {
                "refs-file" => format!(
                    r#"set -e; mkdir -p sub/stash/objects sub/stash/hooks
                       printf '#!/bin/sh\n' > sub/stash/refs; chmod 755 sub/stash/refs
                       printf '[core]\n\tfsmonitor = "touch {m}; false"\n' > sub/stash/config
                       printf '#!/bin/sh\ntouch {m}\n' > sub/stash/hooks/pre-commit; chmod 755 sub/stash/hooks/pre-commit
                       echo first"#
                ),
                _ => format!(
                    r#"set -e; d="data/y $(printf '\377')"; mkdir -p "$d/objects" "$d/refs/heads" "$d/hooks" sub/stash
                       printf 'ref: refs/heads/main\n' > sub/stash/HEAD
                       printf '../../%s' "$d" > sub/stash/commondir
                       printf '[core]\n\tfsmonitor = "touch {m}; false"\n' > "$d/config"
                       printf '#!/bin/sh\ntouch {m}\n' > "$d/hooks/pre-commit"; chmod 755 "$d/hooks/pre-commit"
                       echo first"#
                ),
            };
            let out = sandboxed(&f, who, &["--network", "none"], &first);
            assert!(
                out.stdout.contains("first"),
                "{who:?} {shape}: {}",
                show(&out)
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
            let second = if shape == "refs-file" {
                "mv sub/stash sub/.git && printf 'ref: refs/heads/main\\n' > sub/.git/HEAD && echo second"
            } else {
                "mv sub/stash sub/.git && echo second"
            };
            let out = sandboxed(&f, who, &["--network", "none"], second);
            assert!(
                out.stdout.contains("second"),
                "{who:?} {shape}: {}",
                show(&out)
            );
            host_git_runs_nothing(&f, who, &f.ws.join("sub"), &marker);
        }
    }
}

/// A rebase left stopped whose merge strategy names a path: `git rebase
/// --continue` runs `git merge-<strategy>`, a path when it holds a `/`.
#[test]
fn a_rebase_strategy_naming_a_path_runs_nothing() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        // `side` has a commit to pick onto a `main` that moved on: the pick
        // is a real merge, which runs the strategy.
        let script = format!(
            r#"id="-c user.name=a -c user.email=a@b"; b=$(git branch --show-current)
               echo a > a && git add a && git $id commit -qm a && git checkout -q -b side
               echo b > b && git add b && git $id commit -qm b && git checkout -q "$b"
               echo c > c && git add c && git $id commit -qm c && git checkout -q side
               GIT_SEQUENCE_EDITOR="sed -i '1i break'" git $id rebase -q -i "$b"
               echo 'x/../.git/rebase-merge/m' > .git/rebase-merge/strategy
               printf '#!/bin/sh\ntouch {m}\n' > .git/rebase-merge/m; chmod 755 .git/rebase-merge/m
               mkdir git-merge-x; echo stopped"#,
            m = marker.display()
        );
        let out = sandboxed(&f, who, &["--network", "none"], &script);
        assert!(out.stdout.contains("stopped"), "{who:?}: {}", show(&out));
        let _ = host(
            &f,
            who,
            &f.ws,
            "git",
            &[&ID[..], &["rebase", "--continue"]].concat(),
        );
        assert!(
            !marker.exists(),
            "{who:?}: git rebase --continue ran the sandbox's strategy\n{}",
            show(&out)
        );
    }
}

/// Nested repositories whose hooks live elsewhere in the tree: through
/// `core.hooksPath` (husky), and through a `hooks` link. The sandbox
/// writes a hook there; the user's commit in them runs nothing.
#[test]
fn hooks_a_nested_repository_points_at_run_nothing() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        for app in ["app", "app2"] {
            std::fs::create_dir_all(f.ws.join(app)).unwrap();
        }
        std::fs::create_dir_all(f.ws.join("app/.husky")).unwrap();
        std::fs::create_dir_all(f.ws.join("app2/scripts/hooks")).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        git_ok(&f, who, &f.ws.join("app"), &["init", "-q", "."]);
        git_ok(
            &f,
            who,
            &f.ws.join("app"),
            &["config", "core.hooksPath", ".husky"],
        );
        git_ok(&f, who, &f.ws.join("app2"), &["init", "-q", "."]);
        let hooks = f.ws.join("app2/.git/hooks");
        std::fs::remove_dir_all(&hooks).unwrap();
        std::os::unix::fs::symlink("../scripts/hooks", &hooks).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            &format!(
                r#"for h in app/.husky/pre-commit app2/scripts/hooks/pre-commit; do
                     printf '#!/bin/sh\ntouch {m}\n' > $h; chmod 755 $h; done; echo planted"#,
                m = marker.display()
            ),
        );
        assert!(out.stdout.contains("planted"), "{who:?}: {}", show(&out));
        for app in ["app", "app2"] {
            host_git_runs_nothing(&f, who, &f.ws.join(app), &marker);
        }
    }
}

/// Another filesystem mounted below the workspace is as writable to the
/// sandbox as the rest: its repositories are searched too. (Root only: it
/// mounts a tmpfs; the sandbox runs as root and as uid 65534.)
#[test]
fn a_repository_below_a_mount_in_the_workspace_runs_nothing() {
    if !git_available() || !is_root() {
        eprintln!("skipped: needs git and root (to mount)");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let cache = f.ws.join("cache");
        std::fs::create_dir_all(&cache).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=8m,mode=0777", "airlock-test"])
            .arg(&cache)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot mount a tmpfs here");
            return;
        }
        // Unmounted however the case ends (a failed assertion included).
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg(&self.0).status();
            }
        }
        let _unmount = Unmount(cache.clone());
        let marker = f.home.join("PWNED");
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            &format!(
                r#"git init -q cache/tool && git -C cache/tool config core.fsmonitor "touch {m}; false" && echo planted"#,
                m = marker.display()
            ),
        );
        host_git_runs_nothing(&f, who, &cache.join("tool"), &marker);
        assert!(out.stdout.contains("planted"), "{who:?}: {}", show(&out));
    }
}

/// The user's own nested repositories, with their own hook and keys that
/// name programs or a partial clone's remote, stay as they are when the
/// agent works in them (status, commit, a new branch): only what a sandbox
/// wrote is judged.
#[test]
fn the_users_own_nested_repositories_are_left_alone() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let lib = f.ws.join("vendor/lib");
        std::fs::create_dir_all(&lib).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        git_ok(&f, who, &lib, &["init", "-q", "."]);
        for (k, v) in [
            ("pull.rebase", "true"),
            ("remote.origin.url", "https://example.invalid/lib.git"),
            ("remote.origin.promisor", "true"),
            ("remote.origin.partialclonefilter", "blob:none"),
            ("diff.lockb.textconv", "cat"),
        ] {
            git_ok(&f, who, &lib, &["config", k, v]);
        }
        let hook = lib.join(".git/hooks/pre-commit");
        std::fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        let config = std::fs::read(lib.join(".git/config")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "cd vendor/lib && git status -s && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m agent && git checkout -q -b topic && echo worked",
        );
        assert!(out.stdout.contains("worked"), "{who:?}: {}", show(&out));
        assert!(
            hook.exists(),
            "{who:?}: the user's hook was moved\n{}",
            show(&out)
        );
        assert_eq!(
            std::fs::read(lib.join(".git/config")).unwrap(),
            config,
            "{who:?}: the user's configuration was rewritten\n{}",
            show(&out)
        );
        assert!(
            !out.stderr.contains("protected path"),
            "{who:?}: {}",
            show(&out)
        );
    }
}

/// A configuration the sandbox wrote keeps only program-free keys, and a
/// work tree is not one of them: `core.worktree = hooks` makes the user's
/// next checkout write the committed files into `.git/hooks` and run them.
/// (A submodule's own work tree, which points back, is kept: see
/// `a_git_directory_planted_in_dot_git_modules_runs_nothing`.)
#[test]
fn a_work_tree_inside_the_git_directory_is_not_kept() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        let script = format!(
            r#"set -e; mkdir sub && cd sub && git init -q; id="-c user.name=a -c user.email=a@b"
               w="${{TMPDIR:-/tmp}}/w"; mkdir -p "$w"
               for h in post-checkout post-merge pre-commit; do printf '#!/bin/sh\ntouch {m}\n' > "$w/$h"; chmod +x "$w/$h"; done
               git --work-tree="$w" add -A && git $id --work-tree="$w" commit -qm hooks
               git branch other; git config core.worktree hooks; git read-tree --empty; echo planted"#,
            m = marker.display()
        );
        let out = sandboxed(&f, who, &["--network", "none"], &script);
        assert!(out.stdout.contains("planted"), "{who:?}: {}", show(&out));
        let sub = f.ws.join("sub");
        let _ = host(&f, who, &sub, "git", &["checkout", "-q", "-f", "other"]);
        host_git_runs_nothing(&f, who, &sub, &marker);
    }
}

/// Hooks paths the sandbox did not write but whose hooks it can: a linked
/// worktree's relative `core.hooksPath` (resolved in that worktree), and
/// a relative one in the user's own `~/.gitconfig`, which every repository
/// the sandbox makes inherits.
#[test]
fn relative_hooks_paths_are_judged_where_git_resolves_them() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        // Through an include, as dotfile setups keep machine settings.
        std::fs::write(
            f.home.join(".gitconfig"),
            "[include]\n\tpath = ~/.gitconfig.local\n",
        )
        .unwrap();
        std::fs::write(
            f.home.join(".gitconfig.local"),
            "[core]\n\thooksPath = .githooks\n",
        )
        .unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        git_ok(
            &f,
            who,
            &f.ws,
            &["worktree", "add", "-q", ".worktrees/feat", "-b", "feat"],
        );
        let script = format!(
            r#"set -e; mkdir -p .worktrees/feat/.githooks sub/.githooks
               (cd sub && git init -q)
               for h in .worktrees/feat/.githooks/pre-commit sub/.githooks/pre-commit; do
                 printf '#!/bin/sh\ntouch {m}\n' > $h; chmod +x $h; done; echo planted"#,
            m = marker.display()
        );
        let out = sandboxed(&f, who, &["--network", "none"], &script);
        assert!(out.stdout.contains("planted"), "{who:?}: {}", show(&out));
        for dir in [".worktrees/feat", "sub"] {
            host_git_runs_nothing(&f, who, &f.ws.join(dir), &marker);
        }
    }
}

/// The user's `~/.gitconfig` includes a file in the workspace for
/// repositories below it (`includeIf "gitdir:…"`); the workspace itself is
/// no repository. The sandbox cannot make that file name a program.
#[test]
fn a_file_the_users_git_config_includes_is_protected() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = airlock_tests::Fixture::new_in(&base());
        who.prepare(&f);
        let marker = f.home.join("PWNED");
        let ws = std::fs::canonicalize(&f.ws).unwrap();
        std::fs::write(
            f.home.join(".gitconfig"),
            format!(
                "[includeIf \"gitdir:{}/\"]\n\tpath = {}/.gitconfig-work\n",
                ws.display(),
                ws.display()
            ),
        )
        .unwrap();
        std::fs::create_dir_all(f.ws.join("proj")).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
            airlock_tests::who::chown(&f.ws);
        }
        git_ok(&f, who, &f.ws.join("proj"), &["init", "-q", "."]);
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            &format!(
                r#"printf '[core]\n\tfsmonitor = "touch {m}; false"\n' > .gitconfig-work; echo tried"#,
                m = marker.display()
            ),
        );
        assert!(out.stdout.contains("tried"), "{who:?}: {}", show(&out));
        host_git_runs_nothing(&f, who, &f.ws.join("proj"), &marker);
    }
}

/// What the quarantine holds is never a repository git would use: a
/// sandbox's configuration naming the git directory's own `HEAD`,
/// `objects` and `refs` as include and hooks paths moves none of them, and
/// no `.git` is kept there by that name.
#[test]
fn the_quarantine_never_holds_a_working_repository() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        let script = format!(
            r#"set -e; mkdir sub; cd sub; git init -q; G=$PWD/.git
               printf '[core]\n\tfsmonitor = "touch {m}; false"\n' >> .git/config
               printf '[include]\n\tpath = HEAD\n[core]\n\thooksPath = %s/objects\n\thooksPath = %s/refs\n' $G $G > .git/config.worktree
               echo planted"#,
            m = marker.display()
        );
        let out = sandboxed(&f, who, &["--network", "none"], &script);
        assert!(out.stdout.contains("planted"), "{who:?}: {}", show(&out));
        let q = f.ws.join(".airlock/quarantine");
        let found = find(&q, &["-name", ".git", "-o", "-name", "HEAD"]);
        assert!(
            found.trim().is_empty(),
            "{who:?}: the quarantine holds {found}"
        );
        for entry in std::fs::read_dir(&q).unwrap().flatten() {
            host_git_runs_nothing(&f, who, &entry.path().join("sub"), &marker);
        }
        host_git_runs_nothing(&f, who, &f.ws.join("sub"), &marker);
    }
}

/// A run in a subdirectory writes a git directory without its `HEAD`; a
/// later run in the parent moves it into place and completes it. The files
/// keep the first run's ctime, below a root that run did not have: every
/// window speaks for every path (red team round 22).
#[test]
fn a_git_directory_staged_by_a_run_in_a_subdirectory_runs_nothing() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        let a = f.ws.join("a");
        std::fs::create_dir_all(&a).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        let first = format!(
            r#"set -e; mkdir -p stage/objects stage/refs/heads stage/hooks
               printf '[core]\n\tfsmonitor = "touch {m}; false"\n' > stage/config
               printf '#!/bin/sh\ntouch {m}\n' > stage/hooks/pre-commit; chmod +x stage/hooks/pre-commit
               echo staged"#,
            m = marker.display()
        );
        let cmd = f.command(&["--network", "none", "--workspace"], &first);
        // `--workspace a`, from inside it.
        let args: Vec<std::ffi::OsString> = cmd.get_args().map(|x| x.to_owned()).collect();
        let pos = args.iter().position(|x| x == "--workspace").unwrap();
        let mut inner = std::process::Command::new(cmd.get_program());
        inner.args(&args[..=pos]).arg(&a).args(&args[pos + 1..]);
        for (k, v) in cmd.get_envs() {
            if let Some(v) = v {
                inner.env(k, v);
            }
        }
        inner.current_dir(&a).stdin(std::process::Stdio::null());
        let out = run(&mut who.wrap(inner));
        assert!(out.stdout.contains("staged"), "{who:?}: {}", show(&out));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "mkdir sub && mv a/stage sub/.git && echo 'ref: refs/heads/main' > sub/.git/HEAD && echo moved",
        );
        assert!(out.stdout.contains("moved"), "{who:?}: {}", show(&out));
        host_git_runs_nothing(&f, who, &f.ws.join("sub"), &marker);
    }
}

/// Two runs on one workspace at once: the first plants a hook and stays;
/// the second, started after the plant and ended before the first, judges
/// it too (the first run's window is open while its journal is there),
/// so the hook is not left live until the first run ends.
#[test]
fn a_run_beside_another_judges_what_the_other_planted() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        let plant = format!(
            r#"mkdir sub && cd sub && git init -q && printf '#!/bin/sh\ntouch {m}\n' > .git/hooks/pre-commit
               chmod +x .git/hooks/pre-commit && touch ../planted && sleep 4"#,
            m = marker.display()
        );
        let mut first = who.wrap(f.command(&["--network", "none"], &plant));
        let mut first = first
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the first run");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !f.ws.join("planted").exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let out = sandboxed(&f, who, &["--network", "none"], "echo beside");
        let hook_after_second = f.ws.join("sub/.git/hooks/pre-commit").exists();
        let _ = first.wait();
        assert!(out.stdout.contains("beside"), "{who:?}: {}", show(&out));
        assert!(
            !hook_after_second,
            "{who:?}: the hook planted by the run beside was left live\n{}",
            show(&out)
        );
        host_git_runs_nothing(&f, who, &f.ws.join("sub"), &marker);
    }
}

/// Touching the user's own nested repository without changing it (issue
/// 28, item 6): `chmod 755` on a hook that already was, `touch` on its
/// configuration. The check judges content and identity, not the ctime:
/// the hook stays, the configuration keeps `commit.gpgsign`, the signing
/// key and the credential helper, nothing is reported, and a later run
/// does not judge them again. A hook the sandbox changes is still moved to
/// the quarantine; a disabled one it makes executable gets its mode back.
#[test]
fn a_touch_that_changes_nothing_leaves_the_users_repository_alone() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    for who in Who::all() {
        let f = repo(&base(), who);
        let lib = f.ws.join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        git_ok(&f, who, &lib, &["init", "-q", "."]);
        for (k, v) in [
            ("commit.gpgsign", "true"),
            ("user.signingkey", "ABCDEF0123456789"),
            ("credential.helper", "store"),
        ] {
            git_ok(&f, who, &lib, &["config", k, v]);
        }
        let hooks = lib.join(".git/hooks");
        let hook = hooks.join("pre-commit");
        let user_hook = "#!/bin/sh\n# the user's secret scanner\nexit 0\n";
        std::fs::write(&hook, user_hook).unwrap();
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        let disabled = hooks.join("pre-push");
        std::fs::write(&disabled, "#!/bin/sh\nexit 1\n").unwrap();
        std::fs::set_permissions(&disabled, std::fs::Permissions::from_mode(0o644)).unwrap();
        let victim = hooks.join("commit-msg");
        std::fs::write(&victim, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        let config = std::fs::read(lib.join(".git/config")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "chmod 755 lib/.git/hooks/pre-commit && touch lib/.git/config lib/.git/hooks/pre-commit && echo touched",
        );
        assert!(out.stdout.contains("touched"), "{who:?}: {}", show(&out));
        let unharmed = |out: &Out, when: &str| {
            assert_eq!(
                std::fs::read_to_string(&hook).ok().as_deref(),
                Some(user_hook),
                "{who:?} {when}: the user's hook was moved\n{}",
                show(out)
            );
            assert_eq!(
                std::fs::read(lib.join(".git/config")).unwrap(),
                config,
                "{who:?} {when}: the user's configuration was rewritten\n{}",
                show(out)
            );
            assert!(
                !out.stderr.contains("protected path"),
                "{who:?} {when}: {}",
                show(out)
            );
        };
        unharmed(&out, "after the touch");
        // The next run does not judge the touched items again.
        let out = sandboxed(&f, who, &["--network", "none"], "echo again");
        assert!(out.stdout.contains("again"), "{who:?}: {}", show(&out));
        unharmed(&out, "on the next run");
        // What changes what git runs is still the sandbox's.
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "chmod 755 lib/.git/hooks/pre-push && printf '#!/bin/sh\\ntouch /tmp/x\\n' > lib/.git/hooks/commit-msg && echo changed",
        );
        assert!(out.stdout.contains("changed"), "{who:?}: {}", show(&out));
        assert!(
            !victim.exists(),
            "{who:?}: a rewritten hook was left in place\n{}",
            show(&out)
        );
        // The disabled hook made executable is the user's file: it stays,
        // not runnable, as the user left it.
        assert_eq!(
            std::fs::metadata(&disabled)
                .map(|m| m.permissions().mode() & 0o777)
                .ok(),
            Some(0o644),
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            out.stderr.contains("protected path") && out.stderr.contains("execute bits put back"),
            "{who:?}: {}",
            show(&out)
        );
        // The user's own hook and configuration are still theirs.
        assert_eq!(
            std::fs::read_to_string(&hook).ok().as_deref(),
            Some(user_hook),
            "{who:?}"
        );
        assert_eq!(
            std::fs::read(lib.join(".git/config")).unwrap(),
            config,
            "{who:?}"
        );
        // A config the sandbox changes to run a program: the user's own
        // is put back whole (its credential helper and signing keys too),
        // not a plain copy of a "new repository" (red team round 13).
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "git -C lib config core.fsmonitor 'touch /tmp/PWNED; false' && echo planted",
        );
        assert!(out.stdout.contains("planted"), "{who:?}: {}", show(&out));
        assert_eq!(
            std::fs::read(lib.join(".git/config")).unwrap(),
            config,
            "{who:?}: the user's configuration was not put back\n{}",
            show(&out)
        );
        assert!(
            out.stderr.contains("quarantined and restored")
                && !out.stderr.contains("new git repository"),
            "{who:?}: {}",
            show(&out)
        );
    }
}

/// Degraded tier (no mounts pin the workspace's `.git`): `mv .git
/// .git-user` no longer leaves the user's repository displaced after the
/// run. It is moved back whole, and what the sandbox changed inside it on
/// the way is judged again in its place (the hook it planted quarantined,
/// the configuration restored). (Moving it to another directory is a copy
/// under Landlock, which refuses to reparent: the original is then gone,
/// as with `rm -rf .git`, a stated residual of that tier.)
#[test]
fn a_renamed_git_directory_is_moved_back_in_the_degraded_tier() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    use airlock_tests::tiers::{command, Tier};
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        let config = std::fs::read(f.ws.join(".git/config")).unwrap();
        let script = format!(
            r#"mv .git .git-user && git config --file .git-user/config core.pager "touch {m}; cat"
               printf '#!/bin/sh\ntouch {m}\n' > .git-user/hooks/pre-commit; chmod +x .git-user/hooks/pre-commit
               echo moved"#,
            m = marker.display()
        );
        let out = run(&mut command(
            &f,
            Tier::Degraded,
            who == Who::Nobody,
            &["--network", "none"],
            &script,
        ));
        assert!(out.stdout.contains("moved"), "{who:?}: {}", show(&out));
        assert!(
            f.ws.join(".git/HEAD").exists() && !f.ws.join(".git-user").exists(),
            "{who:?}: the repository was left displaced\n{}",
            show(&out)
        );
        assert_eq!(
            std::fs::read(f.ws.join(".git/config")).unwrap(),
            config,
            "{who:?}: {}",
            show(&out)
        );
        assert!(out.stderr.contains("moved back"), "{who:?}: {}", show(&out));
        let log = host(&f, who, &f.ws, "git", &["log", "--oneline", "-1"]);
        assert_eq!(log.code, 0, "{who:?}: {}", show(&log));
        host_git_runs_nothing(&f, who, &f.ws, &marker);
    }
}

/// The parts of a git directory reach the disk through the user's own
/// `git checkout` of a branch a sandbox committed (their ctimes are the
/// user's), and a later run puts them in place: by a rename to a new
/// `sub/.git`, over an empty `sub/.git` an earlier run left, or over the
/// user's own repository's `.git` (red team rounds 2 and 3). The git
/// directory is new (by its inode), so what it holds is the sandbox's.
#[test]
fn a_git_directory_assembled_from_a_checkout_runs_nothing() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        for way in ["new", "over-empty", "over-users", "hooks-into-users"] {
            let f = repo(&base(), who);
            let marker = f.home.join("PWNED");
            let m = marker.display();
            if way == "over-users" || way == "hooks-into-users" {
                std::fs::create_dir_all(f.ws.join("lib")).unwrap();
                if who == Who::Nobody {
                    airlock_tests::who::chown(&f.ws);
                }
                git_ok(&f, who, &f.ws.join("lib"), &["init", "-q", "."]);
            }
            let first = format!(
                r#"set -e; git checkout -q -b agent
                   mkdir -p x/hooks x/objects/info x/refs/heads
                   printf '[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tfsmonitor = "touch {m}; false"\n' > x/config
                   printf '#!/bin/sh\ntouch {m}\n' > x/hooks/pre-commit; chmod +x x/hooks/pre-commit
                   touch x/objects/info/.keep x/refs/heads/.keep
                   git add x && git {id} commit -qm parts && git checkout -q -
                   {empty}
                   echo first"#,
                id = ID.join(" "),
                empty = if way == "over-empty" {
                    "mkdir -p sub/.git"
                } else {
                    "true"
                },
            );
            let out = sandboxed(&f, who, &["--network", "none"], &first);
            assert!(
                out.stdout.contains("first"),
                "{who:?} {way}: {}",
                show(&out)
            );
            // The user looks at the agent's branch, a moment later (past
            // the coarse clock's tick that ends the run's window).
            std::thread::sleep(std::time::Duration::from_millis(50));
            git_ok(&f, who, &f.ws, &["checkout", "-q", "agent"]);
            std::thread::sleep(std::time::Duration::from_millis(20));
            let (dir, second) = match way {
                // The user's git directory stays; a directory moved into
                // it brings what the checkout wrote (round 4).
                "hooks-into-users" => (
                    "lib",
                    "rm -rf lib/.git/hooks && mv x/hooks lib/.git/hooks && echo second",
                ),
                "over-users" => (
                    "lib",
                    "echo 'ref: refs/heads/main' > x/HEAD && rm -rf lib/.git && mv x lib/.git && echo second",
                ),
                _ => (
                    "sub",
                    "mkdir -p sub && echo 'ref: refs/heads/main' > x/HEAD && mv -T x sub/.git && echo second",
                ),
            };
            let out = sandboxed(&f, who, &["--network", "none"], second);
            assert!(
                out.stdout.contains("second"),
                "{who:?} {way}: {}",
                show(&out)
            );
            host_git_runs_nothing(&f, who, &f.ws.join(dir), &marker);
        }
    }
}

/// A whole directory set aside (a `.airlock` the sandbox made) keeps no
/// live repository, even with decoys holding the names the quarantine
/// renames to (red team rounds 2 and 3).
#[test]
fn a_directory_set_aside_whole_keeps_no_live_repository() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        let script = format!(
            r#"set -e; mkdir -p .airlock/x; cd .airlock/x; git init -q
               printf '[core]\n\tfsmonitor = "touch {m}; false"\n' >> .git/config
               mkdir dot-git; touch .git/dot-HEAD
               echo planted"#,
            m = marker.display()
        );
        let out = sandboxed(&f, who, &["--network", "none"], &script);
        assert!(out.stdout.contains("planted"), "{who:?}: {}", show(&out));
        let q = f.ws.join(".airlock/quarantine");
        let found = find(&q, &["-name", ".git", "-o", "-name", "HEAD"]);
        assert!(
            found.trim().is_empty(),
            "{who:?}: the quarantine holds {found}"
        );
        let kept = find(&q, &["-type", "d", "-name", "x"]);
        for dir in kept.lines() {
            host_git_runs_nothing(&f, who, Path::new(dir), &marker);
        }
    }
}

/// `airlock run [args] -- sh -c script`, as `who`, started by `wrapper`
/// (a program and its first arguments: a limit set before airlock starts).
fn run_under(f: &Fixture, who: Who, wrapper: &[&str], args: &[&str], script: &str) -> Out {
    let inner = f.command(args, script);
    let mut c = std::process::Command::new(wrapper[0]);
    c.args(&wrapper[1..])
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_clear()
        .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .current_dir(&f.ws);
    run(&mut who.wrap(c))
}

/// With the open-files soft limit a user's shell often has lowered to `n`.
fn with_open_files(f: &Fixture, who: Who, n: u32, args: &[&str], script: &str) -> Out {
    let limit = format!("ulimit -Sn {n} && exec \"$0\" \"$@\"");
    run_under(f, who, &["sh", "-c", &limit], args, script)
}

/// A directory with more subdirectories than airlock may open files, and
/// a directory left unreadable to its owner, hide nothing from the search
/// (red team round 5): the repository below is judged, the run is clean,
/// and the user's git there runs nothing. The tree is made elsewhere and
/// renamed into place.
#[test]
fn wide_and_unreadable_directories_hide_no_repository() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        for (name, shape) in [
            ("wide", "seq 1 300 | xargs mkdir; cd 150"),
            ("unreadable", "mkdir d; cd d"),
        ] {
            let f = repo(&base(), who);
            let marker = f.home.join("PWNED");
            let script = format!(
                r#"set -e; mkdir stage; cd stage; {shape}
                   git init -q sub
                   git -C sub config core.fsmonitor "touch {m}; false"
                   cd "$OLDPWD" 2>/dev/null || cd {ws}/stage
                   cd {ws}; chmod 111 stage/d 2>/dev/null || true; mv stage w; echo planted"#,
                m = marker.display(),
                ws = f.ws.display()
            );
            let out = with_open_files(&f, who, 256, &["--network", "none"], &script);
            assert!(
                out.stdout.contains("planted"),
                "{who:?} {name}: {}",
                show(&out)
            );
            assert_eq!(
                out.code,
                0,
                "{who:?} {name}: the search finished: {}",
                show(&out)
            );
            assert!(
                out.stderr.contains("new git repository"),
                "{who:?} {name}: the plant was judged: {}",
                show(&out)
            );
            let sub = match name {
                "wide" => f.ws.join("w/150/sub"),
                _ => f.ws.join("w/d/sub"),
            };
            host_git_runs_nothing(&f, who, &sub, &marker);
            // The allowed thing still works: the tree is there, and a
            // directory of the user's own keeps its mode when not written.
            assert!(sub.is_dir(), "{who:?} {name}");
        }
    }
}

/// A tree thousands of levels deep, with long names and siblings at
/// every level (some wait their turn whatever order the listing gives),
/// costs the search memory in proportion to its size, not its depth
/// squared: under a 2 GiB address-space limit the supervisor
/// finishes its check and the repository planted beside it is judged (red
/// team round 6: it grew to gigabytes and died before judging anything).
#[test]
fn a_deep_tree_does_not_starve_the_check() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let marker = f.home.join("PWNED");
        let long = "b".repeat(255);
        let script = format!(
            r#"set -e; git init -q sub; git -C sub config core.fsmonitor "touch {m}; false"
               python3 -c 'import os
os.mkdir("deep"); os.chdir("deep")
for i in range(3500):
    for n in ("c", "d", "e"): os.mkdir(n + "{long}")
    os.mkdir("a{long}"); os.chdir("a{long}")'
               echo planted"#,
            m = marker.display(),
            long = &long[..254]
        );
        let limit = format!("--as={}", 2u64 << 30);
        let out = run_under(
            &f,
            who,
            &["prlimit", &limit, "--"],
            &["--network", "none"],
            &script,
        );
        assert!(out.stdout.contains("planted"), "{who:?}: {}", show(&out));
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains("new git repository"),
            "{who:?}: the plant was judged: {}",
            show(&out)
        );
        host_git_runs_nothing(&f, who, &f.ws.join("sub"), &marker);
    }
}

/// A `gitdir:` file the sandbox writes that names a repository of the
/// user's (`x/.git` → `../lib/.git`) is set aside, and the user's
/// repository is left as it was: not judged "new", its config and hooks
/// kept (red team round 16).
#[test]
fn a_pointer_to_the_users_repository_does_not_make_it_new() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(&base(), who);
        let lib = f.ws.join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        git_ok(&f, who, &lib, &["init", "-q", "."]);
        git_ok(&f, who, &lib, &["config", "user.signingkey", "MYKEY"]);
        let hook = lib.join(".git/hooks/pre-commit");
        std::fs::write(&hook, "#!/bin/sh\n# the user's scanner\n").unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        let config = std::fs::read(lib.join(".git/config")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "mkdir -p x && printf 'gitdir: ../lib/.git\\n' > x/.git && echo pointed",
        );
        assert!(out.stdout.contains("pointed"), "{who:?}: {}", show(&out));
        assert!(!f.ws.join("x/.git").exists(), "{who:?}: {}", show(&out));
        assert_eq!(
            std::fs::read(lib.join(".git/config")).unwrap(),
            config,
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            hook.exists(),
            "{who:?}: the user's hook was set aside: {}",
            show(&out)
        );
        assert!(
            !out.stderr.contains("new git repository"),
            "{who:?}: {}",
            show(&out)
        );
    }
}
