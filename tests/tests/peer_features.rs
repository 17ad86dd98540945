//! What users of bubblewrap, Docker and corporate proxies expect (issue
//! 30): `--read PATH` (a read-only bind, as `--ro-bind`), `--publish PORT`
//! (a server in the sandbox reachable from the host, as `-p`) and
//! `--upstream-proxy URL` (a parent proxy, as squid's `cache_peer`). Each
//! is shown end to end with real commands under `airlock run`, as root and
//! as an ordinary user, and each shows the boundary still holds.

use std::path::PathBuf;

use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-peer"))
}

fn show(out: &Out) -> String {
    format!(
        "exit {}\n--- stdout\n{}--- stderr\n{}",
        out.code, out.stdout, out.stderr
    )
}

/// A directory of the host's /tmp holding a script, readable by `who`.
fn host_tmp_dir(who: Who) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("airlock-read-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::write(
        d.path().join("job.sh"),
        "echo job-ran; cat \"$(dirname \"$0\")/data.txt\"\n",
    )
    .unwrap();
    std::fs::write(d.path().join("data.txt"), "host-data\n").unwrap();
    if who == Who::Nobody {
        airlock_tests::who::chown(d.path());
    }
    d
}

#[test]
fn a_path_under_the_host_tmp_is_named_and_read_brings_it_in_read_only() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let d = host_tmp_dir(who);
        let dir = d.path().to_str().unwrap().to_string();
        let script = format!("{dir}/job.sh");

        // Without --read: not found, and airlock says why and what to add.
        let out = run(&mut who.wrap(f.command_argv(&["--network", "none"], &["sh", &script])));
        assert_ne!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("job-ran"), "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains("lies under the host's /tmp")
                && out.stderr.contains(&format!("--read {dir}")),
            "{who:?}: {}",
            show(&out)
        );

        // With it: read, run, but never written.
        let cmd = f.command_argv(
            &["--network", "none", "--read", &dir],
            &[
                "sh",
                "-c",
                &format!(
                    "sh {script}; echo x > {dir}/data.txt && echo wrote; touch {dir}/new && echo created; rm -f {dir}/job.sh && echo removed; true"
                ),
            ],
        );
        let out = run(&mut who.wrap(cmd));
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(
            out.stdout.contains("job-ran") && out.stdout.contains("host-data"),
            "{who:?}: {}",
            show(&out)
        );
        for verb in ["wrote", "created", "removed"] {
            assert!(!out.stdout.contains(verb), "{who:?} {verb}: {}", show(&out));
        }
        assert_eq!(
            std::fs::read_to_string(d.path().join("data.txt")).unwrap(),
            "host-data\n"
        );
        assert!(d.path().join("job.sh").exists() && !d.path().join("new").exists());
        // The rest of the host's /tmp stays out of sight.
        let out = run(&mut who.wrap(f.command(
            &["--network", "none", "--read", &format!("{dir}/data.txt")],
            &format!("cat {dir}/data.txt; ls {dir}/job.sh 2>/dev/null && echo saw-sibling; true"),
        )));
        assert!(out.stdout.contains("host-data"), "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("saw-sibling"), "{who:?}: {}", show(&out));
    }
}

#[test]
fn read_refuses_what_it_must_not_uncover() {
    let f = Fixture::new_in(&base());
    f.write("~/.ssh/id_ed25519", "PRIVATE KEY\n");
    let key = f.home.join(".ssh");
    for (path, why) in [
        (key.to_str().unwrap(), "deny_read"),
        ("/run", "the sandbox's own"),
        ("/tmp", "name the directory"),
        ("relative/path", "absolute"),
        ("/nonexistent-airlock-read", "No such file"),
    ] {
        let out = f.run(&["--network", "none", "--read", path], "cat ~/.ssh/id_ed25519; echo ran");
        assert_eq!(out.code, 125, "{path}: {}", show(&out));
        assert!(!out.stdout.contains("ran"), "{path}: {}", show(&out));
        assert!(out.stderr.contains(why), "{path}: {}", show(&out));
    }
}
