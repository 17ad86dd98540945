//! One project's sandbox never poisons another's caches (SPEC §3.4, issue
//! #28 item 8): presets point tools at airlock-owned caches, one directory
//! per project. A hostile install script in project A plants entries in
//! its caches (a module zip, an extracted crate) and tries every way it has
//! to reach project B's; B's next run, with the same presets and the same
//! user, sees none of it, and A's own next run still finds its own. Each
//! case runs in both tiers, as root and as an ordinary user.

use std::path::{Path, PathBuf};
use std::process::Command;

use airlock_tests::tiers::{self, show, Tier, TIERS};
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-escape"))
}

/// A second workspace beside the fixture's, sharing its HOME (the same
/// user's other project), owned by the user who runs it.
fn other_project(f: &Fixture, as_user: bool) -> tempfile::TempDir {
    let ws = tempfile::Builder::new()
        .prefix("ws-b-")
        .tempdir_in(f.ws.parent().expect("parent"))
        .expect("ws b");
    if as_user {
        airlock_tests::who::chown(ws.path());
    }
    ws
}

/// `airlock run --preset go --preset cargo` in `dir`, network none: the
/// caches are what is under test, not the registries.
fn run_in(f: &Fixture, tier: Tier, as_user: bool, dir: &Path, script: &str) -> Out {
    let mut cmd: Command = tiers::command(
        f,
        tier,
        as_user,
        &["--network", "none", "--preset", "go", "--preset", "cargo"],
        script,
    );
    cmd.current_dir(dir);
    run(&mut cmd)
}

/// `name=value` printed by the script.
fn value(out: &Out, name: &str) -> String {
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in\n{}", show(out)))
        .to_string()
}

/// What a hostile install script leaves in its caches: a module zip go
/// would take as downloaded, and an extracted crate whose build script
/// cargo would run.
const PLANT: &str = r#"
echo "gomod=$GOMODCACHE"; echo "cargo=$CARGO_HOME"
mkdir -p "$GOMODCACHE/cache/download/evil.test/m/@v" \
  && echo planted > "$GOMODCACHE/cache/download/evil.test/m/@v/v1.0.0.zip" \
  && mkdir -p "$CARGO_HOME/registry/src/idx-0123/evil-1.0.0" \
  && echo 'fn main(){}' > "$CARGO_HOME/registry/src/idx-0123/evil-1.0.0/build.rs" \
  && echo planted-ok
"#;

const GO_ENTRY: &str = "cache/download/evil.test/m/@v/v1.0.0.zip";
const CRATE_ENTRY: &str = "registry/src/idx-0123/evil-1.0.0/build.rs";

#[test]
fn one_projects_sandbox_cannot_poison_anothers_caches() {
    for tier in TIERS {
        for as_user in tiers::users() {
            let ctx = format!("{tier:?} as_user={as_user}");
            let f = Fixture::new_in(&base());
            let b = other_project(&f, as_user);
            // B's caches exist before A's hostile run, so A has a target.
            let first_b = run_in(
                &f,
                tier,
                as_user,
                b.path(),
                r#"echo "gomod=$GOMODCACHE"; echo "cargo=$CARGO_HOME"; touch "$GOMODCACHE/b-own" && echo b-own-ok"#,
            );
            assert!(
                first_b.stdout.contains("b-own-ok"),
                "{ctx}: {}",
                show(&first_b)
            );
            let (b_gomod, b_cargo) = (value(&first_b, "gomod"), value(&first_b, "cargo"));
            // A plants in its own caches (allowed) and tries B's: write into
            // them, replace them, create caches for a project that has
            // none yet, link one of its caches where B's would be.
            let projects = f.home.join(".cache/airlock/projects");
            let attack = format!(
                r#"{PLANT}
                for d in "{b_gomod}" "{b_cargo}"; do
                  mkdir -p "$d/cache/download/evil.test/m/@v" && echo planted > "$d/cache/download/evil.test/m/@v/v1.0.0.zip" && echo REACHED-B
                  touch "$d/x" && echo REACHED-B
                  mv "$d" "$d.old" 2>/dev/null && echo REACHED-B
                done
                mkdir "{p}/new-0000000000000000" 2>/dev/null && echo REACHED-PROJECTS
                ln -s "$GOMODCACHE" "{p}/link-0000000000000000" 2>/dev/null && echo REACHED-PROJECTS
                echo /elsewhere > "$GOMODCACHE/../../project" 2>/dev/null && echo REACHED-RECORD
                true"#,
                p = projects.display()
            );
            let a = run_in(&f, tier, as_user, &f.ws, &attack);
            assert!(a.stdout.contains("planted-ok"), "{ctx}: {}", show(&a));
            let (a_gomod, a_cargo) = (value(&a, "gomod"), value(&a, "cargo"));
            assert_ne!(a_gomod, b_gomod, "{ctx}: one cache for two projects");
            assert_ne!(a_cargo, b_cargo, "{ctx}: one cache for two projects");
            for bad in ["REACHED-B", "REACHED-PROJECTS", "REACHED-RECORD"] {
                assert!(!a.stdout.contains(bad), "{ctx}: {bad}\n{}", show(&a));
            }
            // On the host: B's caches hold only what B wrote.
            assert!(
                !Path::new(&b_gomod).join(GO_ENTRY).exists()
                    && !Path::new(&b_gomod).join("x").exists()
                    && !Path::new(&b_cargo).join("x").exists()
                    && Path::new(&b_gomod).join("b-own").exists(),
                "{ctx}: B's caches were changed by A's sandbox"
            );
            let names: Vec<String> = std::fs::read_dir(&projects)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(names.len(), 2, "{ctx}: {names:?}");
            // B's next run sees nothing A planted, and its own still works.
            let check = format!(
                r#"echo "gomod=$GOMODCACHE"
                test -e "$GOMODCACHE/{GO_ENTRY}" && echo SAW-A
                test -e "$CARGO_HOME/{CRATE_ENTRY}" && echo SAW-A
                test -e "$GOMODCACHE/b-own" && echo b-sees-own"#
            );
            let second_b = run_in(&f, tier, as_user, b.path(), &check);
            assert!(
                second_b.stdout.contains("b-sees-own"),
                "{ctx}: {}",
                show(&second_b)
            );
            assert!(
                !second_b.stdout.contains("SAW-A"),
                "{ctx}: B's sandbox uses what A's planted\n{}",
                show(&second_b)
            );
            assert_eq!(value(&second_b, "gomod"), b_gomod, "{ctx}");
            // A's next run still finds its own entries: the cache works.
            let again = run_in(
                &f,
                tier,
                as_user,
                &f.ws,
                &format!(
                    r#"echo "gomod=$GOMODCACHE"
                    test -e "$GOMODCACHE/{GO_ENTRY}" && test -e "$CARGO_HOME/{CRATE_ENTRY}" && echo a-sees-own"#
                ),
            );
            assert!(
                again.stdout.contains("a-sees-own"),
                "{ctx}: {}",
                show(&again)
            );
            assert_eq!(value(&again, "gomod"), a_gomod, "{ctx}");
        }
    }
}

/// The key is the project, found outside the sandbox from canonical
/// paths: a run from a subdirectory or through a link to A is A (its
/// caches are there), while a repository a sandbox creates inside its own
/// workspace gives a later run there caches of its own, never another
/// project's.
#[test]
fn the_project_is_found_outside_the_sandbox_from_canonical_paths() {
    if Command::new("git").arg("--version").output().is_err() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for as_user in tiers::users() {
        let ctx = format!("as_user={as_user}");
        let f = Fixture::new_in(&base());
        std::fs::create_dir_all(f.ws.join("sub/deeper")).unwrap();
        let git = Command::new("git")
            .args(["init", "-q", "."])
            .current_dir(&f.ws)
            .status()
            .unwrap();
        assert!(git.success());
        let link = f.ws.parent().unwrap().join(format!(
            "link-{}",
            f.ws.file_name().unwrap().to_string_lossy()
        ));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&f.ws, &link).unwrap();
        let show_cache = r#"echo "gomod=$GOMODCACHE""#;
        let top = run_in(&f, Tier::Full, as_user, &f.ws, show_cache);
        let top = value(&top, "gomod");
        for dir in [f.ws.join("sub/deeper"), link.join("sub")] {
            let out = run_in(&f, Tier::Full, as_user, &dir, show_cache);
            assert_eq!(value(&out, "gomod"), top, "{ctx}: {}", dir.display());
        }
        // --workspace naming a subdirectory of the repository is still it.
        let mut cmd = tiers::command(
            &f,
            Tier::Full,
            as_user,
            &[
                "--network",
                "none",
                "--preset",
                "go",
                "--workspace",
                &f.ws.join("sub").display().to_string(),
            ],
            show_cache,
        );
        cmd.current_dir(f.ws.join("sub"));
        let out = run(&mut cmd);
        assert_eq!(value(&out, "gomod"), top, "{ctx}: {}", show(&out));
        // A sandbox that makes `sub` a repository gives `sub` caches of its
        // own on the next run there: not the parent's, not anyone else's.
        let out = run_in(
            &f,
            Tier::Full,
            as_user,
            &f.ws,
            "git init -q sub && echo made",
        );
        assert!(out.stdout.contains("made"), "{ctx}: {}", show(&out));
        let out = run_in(&f, Tier::Full, as_user, &f.ws.join("sub"), show_cache);
        let sub = value(&out, "gomod");
        assert_ne!(sub, top, "{ctx}");
        assert!(
            Path::new(&sub).starts_with(f.home.join(".cache/airlock/projects")),
            "{ctx}: {sub}"
        );
        let _ = std::fs::remove_file(&link);
    }
}

/// `airlock cache list` names each project's caches; `clear` removes only
/// the one asked for.
#[test]
fn cache_list_and_clear() {
    let f = Fixture::new_in(&base());
    let b = other_project(&f, false);
    let a_out = run_in(&f, Tier::Full, false, &f.ws, r#"echo "gomod=$GOMODCACHE""#);
    let b_out = run_in(
        &f,
        Tier::Full,
        false,
        b.path(),
        r#"echo "gomod=$GOMODCACHE""#,
    );
    let (a_dir, b_dir) = (
        Path::new(&value(&a_out, "gomod"))
            .ancestors()
            .nth(2)
            .unwrap()
            .to_path_buf(),
        Path::new(&value(&b_out, "gomod"))
            .ancestors()
            .nth(2)
            .unwrap()
            .to_path_buf(),
    );
    let cache = |args: &[&str]| {
        let mut c = airlock(&f.home);
        c.env_remove("XDG_CACHE_HOME")
            .arg("cache")
            .args(args)
            .current_dir(&f.ws);
        run(&mut c)
    };
    let list = cache(&["list", "--json"]);
    assert_eq!(list.code, 0, "{}", show(&list));
    let v: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    let projects = v["projects"].as_array().unwrap();
    assert_eq!(projects.len(), 2, "{v}");
    let a = projects
        .iter()
        .find(|p| p["dir"] == a_dir.display().to_string())
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(
        a["project"],
        f.ws.canonicalize().unwrap().display().to_string()
    );
    assert_eq!(a["current"], true);
    let cleared = cache(&["clear"]);
    assert_eq!(cleared.code, 0, "{}", show(&cleared));
    assert!(!a_dir.exists() && b_dir.is_dir());
    assert!(f.ws.is_dir(), "the project itself is left alone");
}

/// A session (SPEC §4.7) has the caches of its workspace's project: what a
/// session's commands write there is the project's (its next plain run
/// finds it), and another project's run does not see it.
#[test]
fn a_session_uses_its_projects_caches() {
    use airlock_tests::who::Who;
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let b = other_project(&f, who == Who::Nobody);
        let bin = airlock_bin();
        let bin = bin.to_str().unwrap();
        let name = format!("caches-{}", std::process::id());
        let start = run(&mut who.host(
            &f,
            &f.ws,
            bin,
            &[
                "session",
                "start",
                "--name",
                &name,
                "--network",
                "none",
                "--preset",
                "go",
            ],
        ));
        assert_eq!(start.code, 0, "{who:?}: {}", show(&start));
        let inside = run(&mut who.host(
            &f,
            &f.ws,
            bin,
            &[
                "run",
                "--session",
                &name,
                "--",
                "sh",
                "-c",
                r#"echo "gomod=$GOMODCACHE"; touch "$GOMODCACHE/from-session" && echo wrote"#,
            ],
        ));
        let end = run(&mut who.host(&f, &f.ws, bin, &["session", "end", &name]));
        assert!(
            inside.stdout.contains("wrote"),
            "{who:?}: {}",
            show(&inside)
        );
        assert_eq!(end.code, 0, "{who:?}: {}", show(&end));
        let session_cache = value(&inside, "gomod");
        let check = r#"echo "gomod=$GOMODCACHE"; test -e "$GOMODCACHE/from-session" && echo SEEN"#;
        let as_user = who == Who::Nobody;
        let a = run_in(&f, Tier::Full, as_user, &f.ws, check);
        assert_eq!(value(&a, "gomod"), session_cache, "{who:?}");
        assert!(a.stdout.contains("SEEN"), "{who:?}: {}", show(&a));
        let other = run_in(&f, Tier::Full, as_user, b.path(), check);
        assert_ne!(value(&other, "gomod"), session_cache, "{who:?}");
        assert!(!other.stdout.contains("SEEN"), "{who:?}: {}", show(&other));
    }
}
