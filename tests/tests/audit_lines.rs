//! Audit lines that stand alone, files airlock writes that a previous
//! sandboxed run cannot redirect, and refusal messages that fit their
//! reason (SPEC §3.5, §5.1, §5.2, §6, §7).

use std::path::{Path, PathBuf};
use std::process::Command;

use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-audit-lines"))
}

fn jq(args: &[&str], file: &Path) -> Out {
    run(Command::new("jq").args(args).arg(file))
}

fn show(out: &Out) -> String {
    format!("--- stdout\n{}--- stderr\n{}", out.stdout, out.stderr)
}

#[test]
fn every_audit_line_stands_alone() {
    let f = Fixture::new_in(&base());
    let origin = Origin::start("origin");
    let p = origin.port();
    let policy = f.write(
        "~/team.toml",
        &format!("[network]\nallow = [\"origin.test:{p}\"]\n"),
    );
    let audit = f.home.join("audit.jsonl");
    let out = f.run(
        &[
            "-p",
            policy.to_str().unwrap(),
            "--audit-log",
            audit.to_str().unwrap(),
            "--resolve",
            "origin.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            "deny",
        ],
        &format!(
            "curl -s -o /dev/null http://origin.test:{p}/a; curl -s -o /dev/null http://blocked.test:{p}/; exit 7"
        ),
    );
    assert_eq!(out.code, 7, "{}", show(&out));
    // Each line is a JSON object on its own (jq reads them one by one).
    let each = jq(&["-c", "-e", "type == \"object\""], &audit);
    assert_eq!(each.code, 0, "{}", show(&each));
    // The first line is the run, the last its end; one run id throughout.
    let shape = jq(
        &[
            "-s",
            "-e",
            r#"(.[0].event == "run") and (.[-1].event == "end") and (map(.run) | unique | length == 1)
               and (.[-1].exit_code == 7) and (.[-1].duration_ms >= 0)"#,
        ],
        &audit,
    );
    assert_eq!(
        shape.code,
        0,
        "{}",
        std::fs::read_to_string(&audit).unwrap()
    );
    let first = jq(
        &[
            "-s",
            "-e",
            r#"map(select(.event == "run")) | length == 1 and (.[0] | (.version | length > 0) and (.command == ["sh", "-c", .command[2]])
               and (.cwd | length > 0) and (.user.uid | type == "number") and (.tier | startswith("linux"))
               and (.policies | any(.layer == "command-line" and (.sha256 | test("^[0-9a-f]{64}$")))))"#,
        ],
        &audit,
    );
    assert_eq!(
        first.code,
        0,
        "{}",
        std::fs::read_to_string(&audit).unwrap()
    );
    // The policy hash is the file's.
    let sha = run(Command::new("sha256sum").arg(&policy));
    let want = sha.stdout.split_whitespace().next().unwrap().to_string();
    let got = jq(
        &["-r", "select(.event == \"run\") | .policies[] | select(.layer == \"command-line\") | .sha256"],
        &audit,
    );
    assert_eq!(got.stdout.trim(), want);
    // close lines carry host, port and command; decisions the command.
    let close = jq(
        &[
            "-s",
            "-e",
            r#"map(select(.event == "close")) | length > 0 and all((.host == "origin.test") and (.port | type == "number")
               and (.command.argv | index("curl") != null) and (.command.pid | type == "number"))"#,
        ],
        &audit,
    );
    assert_eq!(
        close.code,
        0,
        "{}",
        std::fs::read_to_string(&audit).unwrap()
    );
    let deny = jq(
        &[
            "-s",
            "-e",
            r#"map(select(.event == "decision" and .decision == "deny")) | length == 1 and all(.reason == "not-allowlisted" and .host == "blocked.test")"#,
        ],
        &audit,
    );
    assert_eq!(deny.code, 0, "{}", std::fs::read_to_string(&audit).unwrap());
}

#[test]
fn the_report_carries_the_run_id_of_the_audit_log() {
    let f = Fixture::new_in(&base());
    let audit = f.home.join("audit.jsonl");
    let report = f.home.join("report.json");
    let out = f.run(
        &[
            "--network",
            "none",
            "--audit-log",
            audit.to_str().unwrap(),
            "--report",
            report.to_str().unwrap(),
        ],
        "true",
    );
    assert_eq!(out.code, 0, "{}", show(&out));
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let events = audit_events(&audit);
    assert_eq!(rep["run"], events[0]["run"], "{rep}");
    assert_eq!(rep["protected_changes"], serde_json::json!([]), "{rep}");
}

/// Run `cmd` as uid 65534 when `user`, in the fixture's workspace.
fn as_user(f: &Fixture, cmd: Command, user: bool) -> Out {
    as_uid(f, cmd, user.then_some(65534))
}

/// Run `cmd` as `uid` (and the same gid), or as ourselves.
fn as_uid(f: &Fixture, cmd: Command, uid: Option<u32>) -> Out {
    let Some(uid) = uid else {
        let mut cmd = cmd;
        return run(&mut cmd);
    };
    let mut c = Command::new("setpriv");
    c.args([
        &format!("--reuid={uid}"),
        &format!("--regid={uid}"),
        "--clear-groups",
        "--",
    ])
    .arg(cmd.get_program())
    .args(cmd.get_args())
    .env_clear()
    .current_dir(&f.ws)
    .stdin(std::process::Stdio::null());
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    run(&mut c)
}

fn planted_links_are_refused(user: bool) {
    let f = Fixture::new_in(&base());
    let bashrc = f.write("~/.bashrc", "echo original\n");
    if user {
        for d in [&f.home, &f.ws] {
            let _ = Command::new("chown")
                .args(["-R", "65534:65534"])
                .arg(d)
                .status();
        }
        let _ = Command::new("chmod").arg("o+rx").arg(base()).status();
    }
    // A previous sandboxed run plants the links in its workspace.
    let plant = as_user(
        &f,
        f.command(
            &["--network", "none"],
            "ln -s \"$HOME/.bashrc\" audit.jsonl && ln -s \"$HOME/.bashrc\" report.json && echo planted",
        ),
        user,
    );
    assert!(plant.stdout.contains("planted"), "{}", show(&plant));
    for args in [["--audit-log", "audit.jsonl"], ["--report", "report.json"]] {
        let mut all = vec!["--network", "none"];
        all.extend_from_slice(&args);
        let out = as_user(&f, f.command(&all, "echo ran > ran.txt"), user);
        assert_eq!(out.code, 125, "{args:?}: {}", show(&out));
        assert!(out.stderr.contains("symbolic link"), "{}", show(&out));
        assert!(!f.ws.join("ran.txt").exists(), "the command ran: {args:?}");
    }
    // A hard link to the same file (planted from outside: a sandbox cannot
    // link across its mounts) is refused too.
    let hard = f.ws.join("hard.json");
    std::fs::hard_link(&bashrc, &hard).unwrap();
    let out = as_user(
        &f,
        f.command(
            &["--network", "none", "--report", "hard.json"],
            "echo ran > ran.txt",
        ),
        user,
    );
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(out.stderr.contains("hard links"), "{}", show(&out));
    assert!(!f.ws.join("ran.txt").exists());
    assert_eq!(std::fs::read_to_string(&bashrc).unwrap(), "echo original\n");
}

#[test]
fn planted_links_for_the_audit_log_and_report_are_refused() {
    planted_links_are_refused(false);
}

#[test]
fn planted_links_for_the_audit_log_and_report_are_refused_as_a_user() {
    planted_links_are_refused(true);
}

#[test]
fn an_unwritable_report_fails_before_the_command_runs() {
    let f = Fixture::new_in(&base());
    let out = f.run(
        &["--network", "none", "--report", "/nonexistent-dir/r.json"],
        "echo ran > ran.txt; exit 3",
    );
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(out.stderr.contains("--report"), "{}", show(&out));
    assert!(!f.ws.join("ran.txt").exists());
}

fn curl_line(url: &str) -> String {
    format!("curl -s -w '%{{http_code}} %header{{x-airlock-reason}}\\n' {url}; ")
}

#[test]
fn each_reason_gets_advice_that_fits_it() {
    let f = Fixture::new_in(&base());
    let origin = Origin::start("origin");
    let p = origin.port();
    std::fs::write(
        f.home.join("no-managed-policy.toml"),
        "[network]\ndeny = [\"bank.test\"]\n",
    )
    .unwrap();
    let report = f.home.join("report.json");
    let script = [
        curl_line(&format!("http://unlisted.test:{p}/")),
        curl_line("http://bank.test/"),
        curl_line(&format!("http://private.test:{p}/")),
    ]
    .concat();
    let out = f.run(
        &[
            "--allow",
            &format!("private.test:{p}"),
            "--resolve",
            "private.test=127.0.0.1",
            "--ask",
            "deny",
            "--report",
            report.to_str().unwrap(),
        ],
        &script,
    );
    // --ask deny asks nobody: not-allowlisted, not approval-denied.
    assert!(out.stdout.contains("403 not-allowlisted"), "{}", show(&out));
    assert!(
        out.stdout.contains("To allow it: --allow unlisted.test"),
        "{}",
        show(&out)
    );
    assert!(out.stdout.contains("403 managed-deny"), "{}", show(&out));
    assert!(out.stdout.contains("403 private-address"), "{}", show(&out));
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let how = |reason: &str| -> String {
        rep["blocked"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["reason"] == reason)
            .map(|b| b["how_to_allow"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("no {reason} in {rep}"))
    };
    assert!(how("not-allowlisted").starts_with("--allow unlisted.test"));
    let managed = how("managed-deny");
    assert!(
        managed.contains("administrator") && !managed.contains("--allow"),
        "{managed}"
    );
    let private = how("private-address");
    assert!(private.contains("resolved to 127.0.0.1"), "{private}");
    assert!(
        out.stderr.contains("resolved to 127.0.0.1"),
        "{}",
        show(&out)
    );
    assert!(out.stderr.contains("administrator"), "{}", show(&out));
}

#[test]
fn user_allow_false_never_suggests_allow() {
    let f = Fixture::new_in(&base());
    std::fs::write(
        f.home.join("no-managed-policy.toml"),
        "[network]\nuser_allow = false\n",
    )
    .unwrap();
    let report = f.home.join("report.json");
    let out = f.run(
        &["--ask", "deny", "--report", report.to_str().unwrap()],
        &curl_line("http://unlisted.test/"),
    );
    assert!(out.stdout.contains("403 not-allowlisted"), "{}", show(&out));
    assert!(!out.stdout.contains("--allow"), "{}", show(&out));
    assert!(!out.stderr.contains("--allow"), "{}", show(&out));
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(
        !text.contains("--allow") && text.contains("administrator"),
        "{text}"
    );
}

#[test]
fn an_unparsable_target_is_never_rendered_with_port_zero() {
    let f = Fixture::new_in(&base());
    let report = f.home.join("report.json");
    // A CONNECT whose authority is no host:port.
    let script = "python3 -c '
import os, socket
u = os.environ[\"HTTP_PROXY\"].split(\"//\")[1].rstrip(\"/\")
h, p = u.rsplit(\":\", 1)
s = socket.create_connection((h, int(p)))
s.sendall(b\"CONNECT user@127.0.0.1:8080 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n\")
r = s.recv(4096).decode()
print(r.split(\"\\r\\n\")[0]); print([l for l in r.split(\"\\r\\n\") if l.lower().startswith(\"x-airlock\")])
'";
    let out = f.run(
        &["--ask", "deny", "--report", report.to_str().unwrap()],
        script,
    );
    assert!(out.stdout.contains(" 400 "), "{}", show(&out));
    assert!(
        out.stdout.contains("x-airlock-reason: invalid-host"),
        "{}",
        show(&out)
    );
    assert!(
        !out.stderr.contains(":0 ") && !out.stderr.contains(":0)"),
        "{}",
        show(&out)
    );
    assert!(
        out.stderr.contains("user@127.0.0.1:8080 (invalid-host)"),
        "{}",
        show(&out)
    );
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(rep["blocked"][0]["port"], serde_json::Value::Null, "{rep}");
}

#[test]
fn every_400_says_it_came_from_airlock() {
    let home = Home::new();
    let proxy = Proxy::start(&home, &["--ask", "deny"]);
    for req in [
        &b"GET /relative HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        b"GET https://x.test/ HTTP/1.1\r\nHost: x.test\r\n\r\n",
    ] {
        let resp = raw_exchange(proxy.addr, req);
        let text = String::from_utf8_lossy(&resp).to_ascii_lowercase();
        assert_eq!(raw_status(&resp), 400, "{text}");
        {
            assert!(
                text.contains("x-airlock-decision: deny") && text.contains("x-airlock-reason: "),
                "{text}"
            );
        }
    }
}

#[test]
fn network_host_warning_names_the_policy_file() {
    let f = Fixture::new_in(&base());
    let policy = f.write("~/host-mode.toml", "[network]\nmode = \"host\"\n");
    let out = f.run(&["-p", policy.to_str().unwrap()], "true");
    assert!(
        out.stderr.contains("warning: network.mode = \"host\""),
        "{}",
        show(&out)
    );
    assert!(
        out.stderr.contains(policy.to_str().unwrap()),
        "{}",
        show(&out)
    );
}

#[test]
fn ask_tty_without_a_terminal_says_so() {
    let f = Fixture::new_in(&base());
    let cmd = f.command(&["--ask", "tty"], &curl_line("http://unlisted.test/"));
    // setsid: no controlling terminal at all.
    let mut c = Command::new("setsid");
    c.arg(cmd.get_program())
        .args(cmd.get_args())
        .env_clear()
        .current_dir(&f.ws);
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    c.stdin(std::process::Stdio::null());
    let out = run(&mut c);
    assert!(
        out.stderr.contains("--ask tty: no terminal to ask on"),
        "{}",
        show(&out)
    );
    assert!(out.stdout.contains("403 not-allowlisted"), "{}", show(&out));
}

/// A uid with no entry in /etc/passwd (a container's arbitrary uid, a user
/// of a directory service): the run works and the audit log names the uid.
/// The static build must not load an NSS module for it (main.rs): run this
/// with `AIRLOCK_BIN` set to that build too.
#[test]
fn a_user_without_a_passwd_entry_runs_and_is_audited_by_uid() {
    if !is_root() {
        return;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let taken = |u: u32| {
        passwd
            .lines()
            .any(|l| l.split(':').nth(2) == Some(&u.to_string()))
    };
    let uid = (42_000..43_000).find(|u| !taken(*u)).expect("a free uid");
    let f = Fixture::new_in(&base());
    for d in [&f.home, &f.ws] {
        let st = Command::new("chown")
            .args(["-R", &format!("{uid}:{uid}")])
            .arg(d)
            .status()
            .unwrap();
        assert!(st.success());
    }
    for d in [f.home.parent(), f.ws.parent()].into_iter().flatten() {
        let _ = Command::new("chmod").arg("o+rx").arg(d).status();
    }
    let audit = f.home.join("audit.jsonl");
    let cmd = f.command(&["--audit-log", audit.to_str().unwrap()], "echo ran");
    let out = as_uid(&f, cmd, Some(uid));
    assert_eq!(out.code, 0, "{}", show(&out));
    assert_eq!(out.stdout, "ran\n", "{}", show(&out));
    let events = audit_events(&audit);
    let first = &events[0];
    assert_eq!(first["user"]["uid"], uid, "{first}");
    assert!(first["user"]["name"].is_null(), "{first}");
    assert!(events.iter().any(|e| e["event"] == "end"), "{events:?}");
}
