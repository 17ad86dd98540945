//! Filesystem refusals explained (SPEC §7): a write the boundary refuses is
//! named on stderr and in the report, with the rule and how to allow it
//! (or why it cannot be), and nothing the sandbox may write is reported.
//! As root and as an ordinary user.

use std::path::PathBuf;
use std::process::Command;

use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-fsrefusals"))
}

#[test]
fn refused_writes_are_named_with_how_to_allow_them() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        std::fs::create_dir_all(f.ws.join("src")).unwrap();
        who.prepare(&f);
        let st = who
            .host(&f, &f.ws, "git", &["init", "-q"])
            .status()
            .unwrap();
        assert!(st.success());
        let outside = f.home.join("outside");
        let report = f.home.join("report.json");
        let script = format!(
            "touch {o}/new.txt; echo x >> .git/config; \
             mkdir -p src/a/b && echo ok > src/a/b/f && mv src/a/b/f src/a/g && rm src/a/g; \
             echo t > /tmp/scratch; echo n > /dev/null; mkdir -p {ws}/src; exit 0",
            o = outside.display(),
            ws = f.ws.display()
        );
        std::fs::create_dir_all(&outside).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        let mut cmd = f.command(&["--report", report.to_str().unwrap()], &script);
        cmd.env("GIT_CONFIG_NOSYSTEM", "1");
        let out = run(&mut who.wrap(cmd));
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        let line = out
            .stderr
            .lines()
            .find(|l| l.starts_with("airlock: the sandbox refused"))
            .unwrap_or_else(|| panic!("{who:?}: no refusal line: {}", out.stderr))
            .to_string();
        assert!(
            line.starts_with("airlock: the sandbox refused 2 writes"),
            "{who:?}: {line}"
        );
        let new = outside.join("new.txt");
        assert!(
            line.contains(&format!(
                "{} (create; outside the writable roots: --write {}",
                new.display(),
                outside.display()
            )),
            "{who:?}: {line}"
        );
        assert!(
            line.contains(".git/config (write; protected") && line.contains("git -c key=value"),
            "{who:?}: {line}"
        );
        assert!(!new.exists(), "{who:?}: the write went through");
        let rep: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        let refused = rep["filesystem_refusals"].as_array().expect("listed");
        assert_eq!(refused.len(), 2, "{who:?}: {rep}");
        assert_eq!(rep["filesystem_refusals_total"], 2, "{rep}");
        assert!(
            refused
                .iter()
                .any(|r| r["rule"] == "protected" && r["op"] == "write"),
            "{rep}"
        );
        assert!(
            refused
                .iter()
                .any(|r| r["rule"] == "outside-writable-roots" && r["op"] == "create"),
            "{rep}"
        );
    }
}

/// A read of a hidden file (`deny_read`: a `.env`, a secret in HOME) is
/// reported as such, on stderr and in the report, with why it cannot be
/// allowed; the secret itself never shows; a write to it is refused and
/// reported too; an ordinary file still reads. In one-shot runs and in a
/// session's command.
#[test]
fn reads_of_hidden_files_are_reported() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write(".env", "API_KEY=SECRET-IN-DOTENV\n");
        f.write("~/.netrc", "machine x login u password SECRET-IN-NETRC\n");
        f.write("notes.txt", "plain\n");
        who.prepare(&f);
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        let report = f.home.join("report.json");
        let netrc = f.home.join(".netrc");
        let script = format!(
            "cat .env; cat .env; cat {n}; cat notes.txt; echo more >> .env; exit 0",
            n = netrc.display()
        );
        let out = run(&mut who.wrap(f.command(
            &["--network", "none", "--report", report.to_str().unwrap()],
            &script,
        )));
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        assert!(!out.stdout.contains("SECRET"), "{who:?}: {}", out.stdout);
        assert!(out.stdout.contains("plain"), "{who:?}: {}", out.stdout);
        let env = f.ws.join(".env");
        let line = out
            .stderr
            .lines()
            .find(|l| l.starts_with("airlock: the sandbox refused"))
            .unwrap_or_else(|| panic!("{who:?}: no refusal line: {}", out.stderr))
            .to_string();
        assert!(
            line.contains(&format!("{} (read x2; hidden (deny_read)", env.display())),
            "{who:?}: {line}"
        );
        assert!(
            line.contains(&format!("{} (read; hidden (deny_read)", netrc.display())),
            "{who:?}: {line}"
        );
        assert!(
            line.contains(&format!("{} (write; hidden (deny_read)", env.display())),
            "{who:?}: {line}"
        );
        assert_eq!(
            std::fs::read_to_string(&env).unwrap(),
            "API_KEY=SECRET-IN-DOTENV\n",
            "{who:?}: the hidden file is untouched"
        );
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        let reads: Vec<&serde_json::Value> = r["filesystem_refusals"]
            .as_array()
            .expect("filesystem_refusals")
            .iter()
            .filter(|x| x["rule"] == "deny_read" && x["op"] == "read")
            .collect();
        assert_eq!(reads.len(), 2, "{who:?}: {r}");
        // Nothing of airlock's covers is left behind, and no sandbox sees
        // them (one that opened another run's cover made that run report
        // a read it never made).
        let masks = f.home.join(".local/share/airlock/ca/masks");
        let left: Vec<_> = std::fs::read_dir(&masks)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{who:?}: {left:?}");
        let out = run(&mut who.wrap(f.command(
            &["--network", "none"],
            &format!("ls -A {} 2>&1; echo listed", masks.display()),
        )));
        assert!(out.stdout.contains("listed"), "{who:?}: {}", out.stderr);
        let listing = out.stdout.replace("listed", "");
        assert!(
            listing.trim().is_empty() || listing.contains("ermission denied"),
            "{who:?}: the covers are visible inside: {listing}"
        );
    }
}

/// Advice a harness follows must work when followed, and a refusal the
/// boundary cannot report by itself is at least named: `--write FILE` (as
/// a refusal advises for a file beside HOME) is a writable root like any,
/// with the command's own exit status; a protected name that does not
/// exist yet is advised as protected, not as a `--write` that would still
/// be refused; a package manager's cache names its preset; a failed read
/// below a hidden directory is followed by a note naming the directory.
#[test]
fn advice_works_when_followed_and_hidden_directories_are_named() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("~/.aws/credentials", "[default]\nkey = SECRET-IN-AWS\n");
        f.write("~/notes.txt", "first\n");
        who.prepare(&f);
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        let notes = f.home.join("notes.txt");
        // 1. A file root: written through, exit status the command's.
        let out = run(&mut who.wrap(f.command(
            &["--network", "none", "--write", notes.to_str().unwrap()],
            &format!("echo second >> {}", notes.display()),
        )));
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        assert!(!out.stderr.contains("replaced"), "{who:?}: {}", out.stderr);
        assert!(
            !out.stderr.contains("could not finish"),
            "{who:?}: {}",
            out.stderr
        );
        assert_eq!(
            std::fs::read_to_string(&notes).unwrap(),
            "first\nsecond\n",
            "{who:?}"
        );
        // 2. A protected name not there yet, and npm's cache.
        let bashrc = f.home.join(".bashrc");
        let npm_log = f.home.join(".npm/_logs/1-debug-0.log");
        std::fs::create_dir_all(npm_log.parent().unwrap()).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        let out = run(&mut who.wrap(f.command(
            &["--network", "none"],
            &format!(
                "echo x > {b}; echo y > {n}; exit 0",
                b = bashrc.display(),
                n = npm_log.display()
            ),
        )));
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        assert!(!bashrc.exists() && !npm_log.exists(), "{who:?}");
        let line = out
            .stderr
            .lines()
            .find(|l| l.starts_with("airlock: the sandbox refused"))
            .unwrap_or_else(|| panic!("{who:?}: no refusal line: {}", out.stderr))
            .to_string();
        assert!(
            line.contains(&format!("{} (create; protected", bashrc.display())),
            "{who:?}: {line}"
        );
        assert!(
            !line.contains(&format!("then --write {}", bashrc.display())),
            "{who:?}: {line}"
        );
        assert!(line.contains("--preset npm"), "{who:?}: {line}");
        // 3. A read below a hidden directory fails. A command that names
        // the directory is told so each time it fails (harness round 12);
        // one that does not is told the hidden directories once.
        let creds = f.home.join(".aws/credentials");
        let read = format!("cat {}", creds.display());
        let note = format!("{}", f.home.join(".aws").display());
        for _ in 0..2 {
            let out = run(&mut who.wrap(f.command(&["--network", "none"], &read)));
            assert_ne!(out.code, 0, "{who:?}: {}", out.stdout);
            assert!(!out.stdout.contains("SECRET"), "{who:?}: {}", out.stdout);
            assert!(
                out.stderr
                    .lines()
                    .any(|l| l.starts_with(&format!("airlock: the command names {note}, hidden"))),
                "{who:?}: {}",
                out.stderr
            );
        }
        let unnamed = "cd && cat .aws/credentials";
        let out = run(&mut who.wrap(f.command(&["--network", "none"], unnamed)));
        assert_ne!(out.code, 0, "{who:?}: {}", out.stdout);
        assert!(
            out.stderr
                .lines()
                .any(|l| l.starts_with("airlock: note: hidden from the sandbox")
                    && l.contains(&note)),
            "{who:?}: {}",
            out.stderr
        );
        // Said once: the next such command is not told again.
        let out = run(&mut who.wrap(f.command(&["--network", "none"], unnamed)));
        assert!(
            !out.stderr.contains("hidden from the sandbox"),
            "{who:?}: {}",
            out.stderr
        );
        // 4. Started in a repository nested in another, a write to the
        // enclosing one names it as the workspace; a directory made
        // outside is advised as itself, never its parent.
        let nested = f.ws.join("vendor/lib");
        std::fs::create_dir_all(&nested).unwrap();
        std::fs::create_dir_all(f.ws.join("src")).unwrap();
        for d in [&f.ws, &nested] {
            let st = Command::new("git")
                .args(["init", "-q"])
                .current_dir(d)
                .status()
                .unwrap();
            assert!(st.success());
        }
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
            airlock_tests::who::chown(&f.ws);
        }
        let newdir = f.home.join("made/new");
        std::fs::create_dir_all(newdir.parent().unwrap()).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        let mut c = f.command(
            &["--network", "none"],
            &format!(
                "echo x > ../../src/x.js; mkdir {}; exit 0",
                newdir.display()
            ),
        );
        c.current_dir(&nested);
        let out = run(&mut who.wrap(c));
        assert_eq!(out.code, 0, "{who:?}: {}", out.stderr);
        let line = out
            .stderr
            .lines()
            .find(|l| l.starts_with("airlock: the sandbox refused"))
            .unwrap_or_else(|| panic!("{who:?}: no refusal line: {}", out.stderr))
            .to_string();
        assert!(
            line.contains(&format!("--workspace {}", f.ws.display())),
            "{who:?}: {line}"
        );
        assert!(
            line.contains(&format!(
                "mkdir -p {n}, then --write {n}",
                n = newdir.display()
            )),
            "{who:?}: {line}"
        );
        assert!(
            !f.ws.join("src/x.js").exists() && !newdir.exists(),
            "{who:?}"
        );
    }
}
