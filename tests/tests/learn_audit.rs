//! Learn mode and `airlock audit` end to end (SPEC §5.6, §2, §6): a job
//! learned against local origins runs again under `unknown = "deny"` with
//! the learned file; the audit summary of real runs is checked field by
//! field.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use airlock_tests::who::Who;
use airlock_tests::*;
use serde_json::Value;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-learn-audit"))
}

fn show(out: &Out) -> String {
    format!(
        "code {}\n--- stdout\n{}--- stderr\n{}",
        out.code, out.stdout, out.stderr
    )
}

fn local(hosts: &[&str]) -> Vec<String> {
    let mut v = vec!["--allow-private".to_string(), "127.0.0.0/8".to_string()];
    for h in hosts {
        v.push("--resolve".into());
        v.push(format!("{h}=127.0.0.1"));
    }
    v
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_learned_job_passes_under_unknown_deny_with_the_learned_file() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let (one, two) = (Origin::start("one"), Origin::start("two"));
        let (p1, p2) = (one.port(), two.port());
        let job = format!(
            "curl -sf http://a.test:{p1}/x && curl -sf http://a.test:{p1}/y && curl -sf http://b.test:{p2}/ && echo JOB-OK"
        );
        let learned = f.home.join("learned.toml");
        let mut args = local(&["a.test", "b.test", "c.test"]);
        args.extend(["--learn".into(), learned.display().to_string()]);
        let out = run(&mut who.wrap(f.command(&as_strs(&args), &job)));
        assert_eq!(out.code, 0, "{who:?} {}", show(&out));
        assert!(out.stdout.contains("JOB-OK"), "{}", show(&out));
        // Loud at the start and at the end.
        assert!(
            out.stderr.contains("LEARN MODE: unknown hosts are ALLOWED"),
            "{}",
            show(&out)
        );
        assert!(out.stderr.contains("LEARN MODE ended"), "{}", show(&out));
        let text = std::fs::read_to_string(&learned).expect("the learned file");
        assert!(text.contains(&format!("\"a.test:{p1}\",")), "{text}");
        assert!(text.contains(&format!("\"b.test:{p2}\",")), "{text}");
        assert!(text.contains("unknown = \"deny\""), "{text}");
        // Per host: how many connections, by which command.
        assert!(text.contains("2 connection(s), new"), "{text}");
        assert!(
            text.contains(&format!("    #       2  curl -sf http://a.test:{p1}/"))
                || text.contains(&format!("    #       1  curl -sf http://a.test:{p1}/x")),
            "{text}"
        );
        assert!(!text.contains("c.test"), "{text}");
        // The same job, unknown hosts denied, only the learned file.
        let mut args = local(&["a.test", "b.test", "c.test"]);
        args.extend([
            "-p".into(),
            learned.display().to_string(),
            "--ask".into(),
            "deny".into(),
        ]);
        let again =
            format!("{job}; curl -s -o /dev/null -w 'c=%{{http_code}}\\n' http://c.test:{p1}/");
        let before = one.hits();
        let out = run(&mut who.wrap(f.command(&as_strs(&args), &again)));
        assert_eq!(out.code, 0, "{who:?} {}", show(&out));
        assert!(out.stdout.contains("JOB-OK"), "{}", show(&out));
        // A host the job never contacted stays closed.
        assert!(out.stdout.contains("c=403"), "{}", show(&out));
        assert_eq!(one.hits(), before + 2, "c.test must not reach the origin");
        assert!(!out.stderr.contains("LEARN MODE"), "{}", show(&out));
    }
}

#[test]
fn learn_mode_refuses_what_it_must_not_do() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let bashrc = f.write("~/.bashrc", "# mine\n");
        let team = f.write("~/team.toml", "[network]\nallow = [\"x.test\"]\n");
        std::os::unix::fs::symlink(&bashrc, f.home.join("link.toml")).unwrap();
        std::fs::hard_link(&bashrc, f.home.join("hard.toml")).unwrap();
        if who == Who::Nobody {
            who::chown(&f.home);
        }
        let cases: Vec<(Vec<String>, &str)> = vec![
            // The project policy, by a relative name, even before it exists.
            (
                vec!["--learn".into(), "airlock.toml".into()],
                "project policy",
            ),
            (
                vec![
                    "--learn".into(),
                    f.ws.join("airlock.toml").display().to_string(),
                ],
                "project policy",
            ),
            // A policy file in force.
            (
                vec![
                    "-p".into(),
                    team.display().to_string(),
                    "--learn".into(),
                    team.display().to_string(),
                ],
                "policy file",
            ),
            // Links planted to make airlock write elsewhere.
            (
                vec![
                    "--learn".into(),
                    f.home.join("link.toml").display().to_string(),
                ],
                "symbolic link",
            ),
            (
                vec![
                    "--learn".into(),
                    f.home.join("hard.toml").display().to_string(),
                ],
                "hard links",
            ),
            // Learning records proxy decisions; asking is its own job.
            (
                vec![
                    "--learn".into(),
                    f.home.join("l.toml").display().to_string(),
                    "--ask".into(),
                    "deny".into(),
                ],
                "drop --ask",
            ),
        ];
        for (args, why) in cases {
            let out = run(&mut who.wrap(f.command(&as_strs(&args), "echo RAN")));
            assert_eq!(out.code, 125, "{who:?} {args:?} {}", show(&out));
            assert!(!out.stdout.contains("RAN"), "{}", show(&out));
            assert!(out.stderr.contains(why), "{args:?} {}", show(&out));
        }
        assert!(!f.ws.join("airlock.toml").exists());
        assert_eq!(std::fs::read_to_string(&bashrc).unwrap(), "# mine\n");
        assert_eq!(
            std::fs::read_to_string(&team).unwrap(),
            "[network]\nallow = [\"x.test\"]\n"
        );
        // The administrator denies unknown hosts: no learning.
        f.write(
            "~/no-managed-policy.toml",
            "[network]\nunknown = \"deny\"\n",
        );
        let learned = f.home.join("managed-learn.toml");
        let out =
            run(&mut who.wrap(f.command(&["--learn", learned.to_str().unwrap()], "echo RAN")));
        assert_eq!(out.code, 125, "{}", show(&out));
        assert!(out.stderr.contains("managed policy"), "{}", show(&out));
        assert!(!out.stdout.contains("RAN"));
        assert!(!learned.exists());
    }
}

/// Answer every approval question on `sock` with `verdict`.
fn answer_all(sock: PathBuf, verdict: &'static str) {
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        let stream = loop {
            match UnixStream::connect(&sock) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(_) => return,
            }
        };
        let mut w = stream.try_clone().unwrap();
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            let msg: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if msg["type"] == "ask" {
                let _ = writeln!(
                    w,
                    "{}",
                    serde_json::json!({"type": "answer", "id": msg["id"], "verdict": verdict})
                );
            }
        }
    });
}

fn run_line(log: &Path) -> Value {
    audit_events(log)
        .into_iter()
        .find(|e| e["event"] == "run")
        .expect("a run line")
}

#[test]
fn airlock_audit_summarises_real_runs_field_by_field() {
    let f = Fixture::new_in(&base());
    let origin = Origin::start("origin");
    let p = origin.port();
    let team = f.write(
        "~/team.toml",
        &format!("[network]\nallow = [\"origin.test:{p}\"]\n"),
    );
    // Run 1 goes to a log that is then rotated away.
    let rotated = f.home.join("audit.jsonl.1");
    let mut args = local(&["origin.test", "blocked.test"]);
    args.extend([
        "-p".into(),
        team.display().to_string(),
        "--audit-log".into(),
        rotated.display().to_string(),
        "--ask".into(),
        "deny".into(),
    ]);
    let job1 = format!(
        "curl -s http://origin.test:{p}/a; curl -s http://origin.test:{p}/b; curl -s http://blocked.test:{p}/; exit 3"
    );
    let out = f.run(&as_strs(&args), &job1);
    assert_eq!(out.code, 3, "{}", show(&out));
    // Run 2: an unlisted host, approved over the socket.
    let current = f.home.join("audit.jsonl");
    let sock = f.home.join("approve.sock");
    answer_all(sock.clone(), "allow-once");
    let mut args = local(&["unlisted.test"]);
    args.extend([
        "--audit-log".into(),
        current.display().to_string(),
        "--ask".into(),
        format!("socket:{}", sock.display()),
    ]);
    let out = f.run(
        &as_strs(&args),
        &format!("curl -sf http://unlisted.test:{p}/ask"),
    );
    assert_eq!(out.code, 0, "{}", show(&out));
    let (run1, run2) = (run_line(&rotated), run_line(&current));

    let out = run(airlock(&f.home)
        .arg("audit")
        .arg(&rotated)
        .arg(&current)
        .arg("--json"));
    assert_eq!(out.code, 0, "{}", show(&out));
    let s: Value = serde_json::from_str(&out.stdout).expect(&out.stdout);
    assert_eq!(s["bad_lines"], 0);
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{}", out.stdout);
    let (r1, r2) = (&runs[0], &runs[1]);
    assert_eq!(r1["run"], run1["run"]);
    assert_eq!(r1["command"], serde_json::json!(["sh", "-c", job1]));
    assert_eq!(r1["exit_code"], 3);
    assert!(r1["tier"].as_str().unwrap().starts_with("linux"));
    assert_eq!(r1["learn"], false);
    assert_eq!(r1["connections"], 2, "{}", out.stdout);
    assert_eq!(r1["blocked"].as_array().unwrap().len(), 1);
    assert_eq!(
        r1["blocked"][0],
        serde_json::json!({"host": "blocked.test", "port": p, "reason": "not-allowlisted", "count": 1})
    );
    let hosts = r1["hosts"].as_array().unwrap();
    let origin_host = hosts
        .iter()
        .find(|h| h["host"] == "origin.test")
        .expect("origin.test");
    assert_eq!(origin_host["port"], p);
    assert_eq!(origin_host["connections"], 2);
    assert_eq!(origin_host["blocked"], 0);
    assert!(origin_host["bytes_down"].as_u64().unwrap() > 0);
    assert!(origin_host["bytes_up"].as_u64().unwrap() > 0);
    let blocked_host = hosts
        .iter()
        .find(|h| h["host"] == "blocked.test")
        .expect("blocked.test");
    assert_eq!(blocked_host["blocked"], 1);
    assert_eq!(blocked_host["reasons"]["not-allowlisted"], 1);
    // Per command: each curl is its own command line.
    let cmds = r1["commands"].as_array().unwrap();
    let a = cmds
        .iter()
        .find(|c| {
            c["argv"] == serde_json::json!(["curl", "-s", format!("http://origin.test:{p}/a")])
        })
        .unwrap_or_else(|| panic!("{}", out.stdout));
    assert_eq!(a["connections"], 1);
    assert_eq!(a["hosts"][0]["host"], "origin.test");
    assert!(cmds.iter().any(|c| c["argv"][2]
        .as_str()
        .is_some_and(|u| u.contains("blocked.test"))
        && c["blocked"] == 1));
    assert_eq!(r2["run"], run2["run"]);
    assert_eq!(r2["exit_code"], 0);
    let approvals = r2["approvals"].as_array().unwrap();
    assert_eq!(approvals.len(), 1, "{}", out.stdout);
    assert_eq!(approvals[0]["host"], "unlisted.test");
    assert_eq!(approvals[0]["port"], p);
    assert_eq!(approvals[0]["answer"], "allow-once");
    assert!(
        approvals[0]["by"].as_str().unwrap().starts_with("uid="),
        "{}",
        out.stdout
    );
    assert_eq!(r2["connections"], 1);

    // The same logs concatenated read the same.
    let both = f.home.join("both.jsonl");
    let mut text = std::fs::read(&rotated).unwrap();
    text.extend(std::fs::read(&current).unwrap());
    std::fs::write(&both, text).unwrap();
    let cat = run(airlock(&f.home).arg("audit").arg(&both).arg("--json"));
    assert_eq!(cat.stdout, out.stdout);

    // The text form names what was blocked and who approved.
    let out = run(airlock(&f.home).arg("audit").arg(&both));
    assert_eq!(out.code, 0, "{}", show(&out));
    assert!(
        out.stdout
            .contains(&format!("blocked.test:{p} (not-allowlisted) x1")),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains(&format!("unlisted.test:{p}: allow-once by uid=")),
        "{}",
        out.stdout
    );
    // A missing file is an error, not an empty summary.
    let out = run(airlock(&f.home)
        .arg("audit")
        .arg(f.home.join("missing.jsonl")));
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("missing.jsonl"), "{}", show(&out));
}

#[test]
fn a_learn_run_is_marked_in_the_audit_log() {
    let f = Fixture::new_in(&base());
    let origin = Origin::start("origin");
    let p = origin.port();
    let log = f.home.join("audit.jsonl");
    let learned = f.home.join("learned.toml");
    let mut args = local(&["new.test"]);
    args.extend([
        "--audit-log".into(),
        log.display().to_string(),
        "--learn".into(),
        learned.display().to_string(),
    ]);
    let out = f.run(&as_strs(&args), &format!("curl -sf http://new.test:{p}/"));
    assert_eq!(out.code, 0, "{}", show(&out));
    let out = run(Command::new(airlock_bin())
        .arg("audit")
        .arg(&log)
        .arg("--json"));
    let s: Value = serde_json::from_str(&out.stdout).expect(&out.stdout);
    assert_eq!(s["runs"][0]["learn"], true);
    assert_eq!(s["runs"][0]["approvals"][0]["by"], "learn mode (--learn)");
    assert_eq!(s["runs"][0]["connections"], 1);
}

#[test]
fn the_sandbox_cannot_redirect_the_learned_file() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let bashrc = f.write("~/.bashrc", "# mine\n");
        std::fs::create_dir_all(f.ws.join("out")).unwrap();
        who.prepare(&f);
        let file = f.ws.join("out/policy.toml");
        let user_policy = f.home.join(".config/airlock/policy.toml");
        // The parent swapped for a link to airlock's config directory, and
        // the file itself for a link to ~/.bashrc. The sandbox may not be
        // able to (the file is airlock's own output, its directory pinned);
        // whatever it manages, the proposal must land in the file named,
        // never become the user policy, never write through a link.
        let script = format!(
            "mv out out.moved && ln -s {} out; \
             rm -f out.moved/policy.toml out/policy.toml; ln -s {} out/policy.toml; echo DONE",
            f.home.join(".config/airlock").display(),
            bashrc.display()
        );
        let out = run(&mut who.wrap(f.command(&["--learn", file.to_str().unwrap()], &script)));
        assert!(out.stdout.contains("DONE"), "{who:?} {}", show(&out));
        assert!(
            !user_policy.exists(),
            "{who:?}: the user policy was written"
        );
        assert_eq!(std::fs::read_to_string(&bashrc).unwrap(), "# mine\n");
        let landed = ["out/policy.toml", "out.moved/policy.toml"]
            .iter()
            .map(|p| f.ws.join(p))
            .find(|p| {
                !p.symlink_metadata()
                    .map(|m| m.file_type().is_symlink())
                    .unwrap_or(true)
            });
        match out.code {
            // Written into the directory FILE was in when the run began.
            0 => {
                let text = std::fs::read_to_string(landed.expect("a learned file")).unwrap();
                assert!(text.contains("Proposed by `airlock run --learn`"), "{text}");
            }
            // The file was replaced by a link: refused, nothing written.
            125 => assert!(
                out.stderr.contains("the learned policy was not written"),
                "{}",
                show(&out)
            ),
            _ => panic!("{who:?} {}", show(&out)),
        }
    }
}
