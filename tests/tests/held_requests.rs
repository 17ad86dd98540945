//! Network writes held for review (SPEC §4.8): in `run --review`, a request
//! that would carry a credential beyond reads, or that a `[[network.hold]]`
//! rule names, never reaches its origin: it is answered 403 `held` and kept
//! in the changeset. `changes apply` sends it after the files, with the
//! user's credential, and reports each; a push the remote no longer takes
//! fails as git would; `discard` sends nothing. Origins on 127.0.0.1 that
//! demand the credential: a git smart-HTTP server (`git http-backend`) and
//! an npm-like registry. As root and as an ordinary user.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_tests::githttp::GitServer;
use airlock_tests::registry::Registry;
use airlock_tests::repos::show;
use airlock_tests::review::held_id;
use airlock_tests::tls::TestPki;
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-held"))
}

const GIT_TOKEN: &str = "Bearer git-tok-41c9-push-needs-review";
const REG_TOKEN: &str = "reg-tok-7f20-publish-needs-review";

/// `git` on the host as the test's own user (the server's repositories).
fn git(dir: &Path, args: &[&str]) -> String {
    let out = run(std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t"));
    assert_eq!(out.code, 0, "git {args:?}: {}", show(&out));
    out.stdout.trim().to_string()
}

/// `airlock` on the host as `who`, with the tokens in its environment.
fn airlock_host(f: &Fixture, who: Who, args: &[&str]) -> Out {
    let bin = airlock_bin();
    let mut c = who.host(f, &f.ws, bin.to_str().unwrap(), args);
    c.env("GIT_TEST_TOKEN", GIT_TOKEN.trim_start_matches("Bearer "))
        .env("REG_TOKEN", REG_TOKEN);
    run(&mut c)
}

struct Setup {
    f: Fixture,
    pki: TestPki,
    git: GitServer,
    reg: Registry,
    policy: PathBuf,
    /// The server's bare repository and a host clone to move it with.
    bare: PathBuf,
    mover: PathBuf,
    seed: String,
    _srv: tempfile::TempDir,
}

fn setup(who: Who) -> Setup {
    let f = Fixture::new_in(&base());
    let srv = tempfile::Builder::new()
        .prefix("srv-")
        .tempdir_in(base())
        .expect("srv");
    let pki = TestPki::new(&f.home.join("pki"), &["git.test", "registry.test"]);
    let bare = srv.path().join("repo.git");
    git(
        srv.path(),
        &["init", "-q", "--bare", "-b", "main", "repo.git"],
    );
    let mover = srv.path().join("mover");
    git(srv.path(), &["init", "-q", "-b", "main", "mover"]);
    git(&mover, &["commit", "-q", "--allow-empty", "-m", "seed"]);
    git(&mover, &["push", "-q", bare.to_str().unwrap(), "main"]);
    let seed = git(&bare, &["rev-parse", "main"]);
    let gs = GitServer::start(&pki, srv.path(), GIT_TOKEN);
    let reg = Registry::start(
        &pki,
        Arc::new(|method, path, auth| {
            if auth != Some(&format!("Bearer {REG_TOKEN}")) {
                return (401, "application/json", b"{}".to_vec());
            }
            match (method, path) {
                ("GET", "/airlock-demo") | ("GET", "/secret-read") => {
                    (200, "application/json", b"{\"ok\":1}".to_vec())
                }
                ("PUT", "/airlock-pub") => (200, "application/json", b"{\"ok\":true}".to_vec()),
                _ => (404, "application/json", b"{}".to_vec()),
            }
        }),
    );
    // The workspace is a clone whose remote is the HTTPS server.
    git(
        &f.ws,
        &[
            "clone",
            "-q",
            bare.to_str().unwrap(),
            f.ws.to_str().unwrap(),
        ],
    );
    let url = format!("https://git.test:{}/repo.git", gs.port());
    git(&f.ws, &["remote", "set-url", "origin", &url]);
    let (g, r) = (gs.port(), reg.port());
    let policy = f.write(
        "~/policy.toml",
        &format!(
            "[network]\nallow = [\"git.test:{g}\", \"registry.test:{r}\"]\n\n\
             [[network.credential]]\nhost = \"git.test:{g}\"\nheader = \"Authorization\"\nvalue = \"Bearer ${{env:GIT_TEST_TOKEN}}\"\n\n\
             [[network.credential]]\nhost = \"registry.test:{r}\"\nheader = \"Authorization\"\nvalue = \"Bearer ${{env:REG_TOKEN}}\"\n\n\
             [[network.hold]]\nhost = \"registry.test\"\nrequests = [\"GET /secret-read\"]\n"
        ),
    );
    who.prepare(&f);
    std::thread::sleep(std::time::Duration::from_millis(50));
    Setup {
        f,
        pki,
        git: gs,
        reg,
        policy,
        bare,
        mover,
        seed,
        _srv: srv,
    }
}

impl Setup {
    fn review(&self, who: Who, script: &str, audit: Option<&Path>) -> Out {
        let mut args = vec![
            "--review",
            "-p",
            self.policy.to_str().unwrap(),
            "--upstream-ca",
            self.pki.ca_pem.to_str().unwrap(),
            "--resolve",
            "git.test=127.0.0.1",
            "--resolve",
            "registry.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            "deny",
        ];
        if let Some(a) = audit {
            args.push("--audit-log");
            args.push(a.to_str().unwrap());
        }
        let report = self.f.home.join("review-report.json");
        args.push("--report");
        args.push(report.to_str().unwrap());
        let mut c = self.f.command(&args, script);
        c.env("GIT_TEST_TOKEN", GIT_TOKEN.trim_start_matches("Bearer "))
            .env("REG_TOKEN", REG_TOKEN);
        run(&mut who.wrap(c))
    }

    /// The same policy and origins without `--review`.
    fn plain(&self, who: Who, script: &str) -> Out {
        let mut c = self.f.command(
            &[
                "-p",
                self.policy.to_str().unwrap(),
                "--upstream-ca",
                self.pki.ca_pem.to_str().unwrap(),
                "--resolve",
                "registry.test=127.0.0.1",
                "--allow-private",
                "127.0.0.0/8",
                "--ask",
                "deny",
            ],
            script,
        );
        c.env("REG_TOKEN", REG_TOKEN)
            .env("GIT_TEST_TOKEN", "unused");
        run(&mut who.wrap(c))
    }

    fn remote_main(&self) -> String {
        git(&self.bare, &["rev-parse", "main"])
    }

    fn pushes_seen(&self) -> Vec<String> {
        self.git
            .seen()
            .into_iter()
            .filter(|l| l.starts_with("POST ") && l.contains("git-receive-pack"))
            .collect()
    }
}

const PUSH: &str =
    "git -c user.email=t@t -c user.name=t commit -q --allow-empty -m held-commit && \
    echo \"commit=$(git rev-parse HEAD)\"; git push origin HEAD:main 2>&1; echo \"push=$?\"";

fn commit_of(out: &Out) -> String {
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix("commit="))
        .unwrap_or_else(|| panic!("no commit: {}", show(out)))
        .to_string()
}

#[test]
fn a_git_push_in_review_is_held_and_apply_pushes_exactly_the_commit() {
    for who in Who::all() {
        let s = setup(who);
        let out = s.review(who, PUSH, None);
        let commit = commit_of(&out);
        assert!(
            out.stdout.contains("push=1") || out.stdout.contains("push=128"),
            "{who:?}: git push did not fail: {}",
            show(&out)
        );
        assert!(out.stdout.contains("403"), "{who:?}: {}", show(&out));
        // A harness finds the changeset and its held request in the report.
        let r: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(s.f.home.join("review-report.json")).unwrap(),
        )
        .unwrap();
        let id = r["review"]["changeset"].as_str().expect("review.changeset");
        assert!(
            out.stderr.contains(&format!("held for review as {id}")),
            "{r}"
        );
        assert!(
            r["review"]["requests"]
                .as_array()
                .is_some_and(|a| a.iter().any(|q| q["method"] == "POST"
                    && q["url"]
                        .as_str()
                        .is_some_and(|u| u.contains("git-receive-pack")))),
            "{who:?}: {r}"
        );
        let g = s.git.port();
        assert!(
            out.stderr.contains(&format!(
                "1 request held (POST git.test:{g}/repo.git/git-receive-pack)"
            )),
            "{who:?}: the summary does not name the held push: {}",
            show(&out)
        );
        // The remote never saw the push; it saw the read, with the credential.
        assert!(s.pushes_seen().is_empty(), "{who:?}: {:?}", s.git.seen());
        assert!(
            s.git
                .seen()
                .iter()
                .any(|l| l.contains("info/refs?service=git-receive-pack") && l.ends_with("auth=ok")),
            "{who:?}: {:?}",
            s.git.seen()
        );
        assert_eq!(s.remote_main(), s.seed, "{who:?}: the remote moved");
        let id = held_id(&out);

        let diff = airlock_host(&s.f, who, &["changes", "diff", &id, "--stat"]);
        assert!(
            diff.stdout.contains(&format!(
                "POST https://git.test:{g}/repo.git/git-receive-pack ("
            )) && diff
                .stdout
                .contains("application/x-git-receive-pack-request"),
            "{who:?}: {}",
            show(&diff)
        );
        // The whole diff shows what apply would send besides the method
        // and URL: the headers kept and the start of the body.
        let full = airlock_host(&s.f, who, &["changes", "diff", &id]);
        assert!(
            full.stdout.contains("--- request 1: ")
                && full
                    .stdout
                    .to_ascii_lowercase()
                    .contains("    content-type: application/x-git-receive-pack-request")
                && full.stdout.contains("    | "),
            "{who:?}: {}",
            show(&full)
        );
        let json = airlock_host(&s.f, who, &["changes", "diff", &id, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("json");
        assert_eq!(v["requests"][0]["method"], "POST", "{who:?}: {v}");
        assert!(
            v["requests"][0]["headers"]
                .as_array()
                .is_some_and(|h| !h.is_empty())
                && v["requests"][0]["body_preview"].is_string(),
            "{who:?}: {v}"
        );
        assert!(v["requests"][0]["size"].as_u64().unwrap_or(0) > 0, "{v}");
        // No credential was kept in the changeset.
        let dir = s.f.home.join(".local/state/airlock/changes").join(&id);
        let kept = std::fs::read(dir.join("requests/000001.req")).expect("kept request");
        assert!(
            !String::from_utf8_lossy(&kept).contains("git-tok-41c9"),
            "{who:?}: the credential was stored"
        );
        let list = airlock_host(&s.f, who, &["changes", "list"]);
        assert!(list.stdout.contains("1 request held"), "{}", show(&list));

        let apply = airlock_host(&s.f, who, &["changes", "apply", &id]);
        assert_eq!(apply.code, 0, "{who:?}: {}", show(&apply));
        assert!(
            apply.stdout.contains("request 1 sent POST") && apply.stdout.contains("200"),
            "{who:?}: {}",
            show(&apply)
        );
        assert_eq!(
            s.remote_main(),
            commit,
            "{who:?}: the remote lacks the commit"
        );
        assert_eq!(s.pushes_seen().len(), 1, "{who:?}: {:?}", s.git.seen());
        assert!(s.pushes_seen()[0].ends_with("auth=ok"));
        // The local commit (objects, refs, logs) is applied with the rest,
        // as a run without review leaves it (harness round 12), so the
        // changeset is whole and goes; nothing is sent twice.
        assert!(
            !dir.exists(),
            "{who:?}: the changeset was not removed: {}",
            show(&apply)
        );
        assert_eq!(s.pushes_seen().len(), 1, "{who:?}: {:?}", s.git.seen());
        let local = git(&s.f.ws, &["-c", "safe.directory=*", "rev-parse", "HEAD"]);
        assert_eq!(local, commit, "{who:?}: the workspace lacks the commit");
    }
}

#[test]
fn a_held_push_the_remote_moved_past_fails_as_git_would_and_stops() {
    for who in Who::all() {
        let s = setup(who);
        let out = s.review(
            who,
            &format!("{PUSH}; curl -s -o /dev/null -w 'put=%{{http_code}}\\n' -X PUT -H 'content-type: application/json' -d '{{}}' https://registry.test:{}/airlock-pub", s.reg.port()),
            None,
        );
        let id = held_id(&out);
        assert!(out.stdout.contains("put=403"), "{who:?}: {}", show(&out));
        // Meanwhile someone else pushes.
        git(
            &s.mover,
            &["commit", "-q", "--allow-empty", "-m", "elsewhere"],
        );
        git(&s.mover, &["push", "-q", s.bare.to_str().unwrap(), "main"]);
        let moved = s.remote_main();
        let apply = airlock_host(&s.f, who, &["changes", "apply", &id]);
        assert_eq!(apply.code, 1, "{who:?}: {}", show(&apply));
        assert!(
            apply.stdout.contains("request 1 failed")
                && apply.stdout.contains("the remote rejected refs/heads/main"),
            "{who:?}: {}",
            show(&apply)
        );
        assert!(
            apply.stdout.contains("request 2 not-sent")
                && apply.stderr.contains("the requests after it were not sent"),
            "{who:?}: {}",
            show(&apply)
        );
        assert_eq!(s.remote_main(), moved, "{who:?}");
        assert!(
            !s.reg.seen().iter().any(|l| l.starts_with("PUT ")),
            "{who:?}: a request after the failed one was sent: {:?}",
            s.reg.seen()
        );
        // Kept, with the failure shown.
        let diff = airlock_host(&s.f, who, &["changes", "diff", &id, "--stat"]);
        assert!(
            diff.stdout.contains("[failed: the remote rejected"),
            "{}",
            show(&diff)
        );
    }
}

#[test]
fn a_publish_and_a_hold_rule_request_are_held_applied_in_order_and_discard_sends_nothing() {
    for who in Who::all() {
        for discard in [false, true] {
            let s = setup(who);
            let r = s.reg.port();
            let audit = s.f.home.join("audit.jsonl");
            let script = format!(
                "for x in 'get GET /airlock-demo' 'pub PUT /airlock-pub' 'secret GET /secret-read'; do set -- $x; \
                 curl -s -o /tmp/b -D /tmp/h -X $2 -H 'content-type: application/json' \
                 $( [ $2 = PUT ] && echo \"-d {{\\\"name\\\":\\\"airlock-pub\\\"}}\" ) \
                 -w \"$1=%{{http_code}}\" https://registry.test:{r}$3; \
                 echo \" reason=$(grep -i '^x-airlock-reason' /tmp/h | tr -d '\\r' | cut -d' ' -f2)\"; cat /tmp/b; echo; done"
            );
            let out = s.review(who, &script, Some(&audit));
            assert!(
                out.stdout.contains("get=200 reason="),
                "{who:?}: {}",
                show(&out)
            );
            for w in ["pub", "secret"] {
                assert!(
                    out.stdout.contains(&format!("{w}=403 reason=held")),
                    "{who:?}: {w}: {}",
                    show(&out)
                );
            }
            assert!(
                out.stdout.contains("airlock changes apply"),
                "{who:?}: the refusal does not say how it is released: {}",
                show(&out)
            );
            assert!(
                out.stderr.contains(&format!(
                    "2 requests held (PUT registry.test:{r}/airlock-pub, GET registry.test:{r}/secret-read)"
                )),
                "{who:?}: {}",
                show(&out)
            );
            let seen = s.reg.seen();
            assert!(
                !seen
                    .iter()
                    .any(|l| l.starts_with("PUT ") || l.contains("secret-read")),
                "{who:?}: a held request reached the registry: {seen:?}"
            );
            let held_events = audit_events(&audit)
                .into_iter()
                .filter(|e| e["event"] == "decision" && e["reason"] == "held")
                .count();
            assert_eq!(held_events, 2, "{who:?}: audit log");
            let id = held_id(&out);
            if discard {
                let d = airlock_host(&s.f, who, &["changes", "discard", &id]);
                assert_eq!(d.code, 0, "{}", show(&d));
                assert!(
                    d.stdout.contains("2 held request(s) dropped"),
                    "{}",
                    show(&d)
                );
                std::thread::sleep(std::time::Duration::from_millis(200));
                assert_eq!(s.reg.seen(), seen, "{who:?}: discard sent something");
                assert!(!s
                    .f
                    .home
                    .join(".local/state/airlock/changes")
                    .join(&id)
                    .exists());
                continue;
            }
            let apply = airlock_host(&s.f, who, &["changes", "apply", &id, "--json"]);
            assert_eq!(apply.code, 0, "{who:?}: {}", show(&apply));
            let v: serde_json::Value = serde_json::from_str(&apply.stdout).expect("json");
            assert_eq!(v["requests"][0]["outcome"], "sent", "{v}");
            assert_eq!(v["requests"][0]["status"], 200, "{v}");
            assert_eq!(v["requests"][1]["outcome"], "sent", "{v}");
            let after: Vec<String> = s.reg.seen()[seen.len()..].to_vec();
            let token = format!("auth=Bearer {REG_TOKEN}");
            assert!(
                after.len() == 2
                    && after[0].starts_with("PUT /airlock-pub ")
                    && after[1].starts_with("GET /secret-read ")
                    && after.iter().all(|l| l.ends_with(&token)),
                "{who:?}: not replayed in order with the credential: {after:?}"
            );
        }
    }
}

#[test]
fn without_review_nothing_is_held() {
    let s = setup(Who::Me);
    let out = s.plain(
        Who::Me,
        &format!(
            "curl -s -o /dev/null -D h -X PUT -d x -w 'pub=%{{http_code}}' https://registry.test:{r}/airlock-pub; echo \" $(grep -i '^x-airlock-reason' h | tr -d '\\r')\"; \
             curl -s -o /dev/null -w 'secret=%{{http_code}}\\n' https://registry.test:{r}/secret-read",
            r = s.reg.port()
        ),
    );
    assert!(
        out.stdout
            .contains("pub=403 x-airlock-reason: credential-write"),
        "{}",
        show(&out)
    );
    // A hold rule does nothing outside a review run.
    assert!(out.stdout.contains("secret=200"), "{}", show(&out));
    assert!(!out.stderr.contains("held for review"), "{}", show(&out));
}

/// A credential whose `methods` list lends it to a write is still held in
/// a review run (SPEC §4.8: every credentialed write waits for the
/// person), and still forwarded as written without review.
#[test]
fn a_write_a_credential_is_lent_to_is_held_in_review_and_sent_without() {
    for who in Who::all() {
        let s = setup(who);
        let text = std::fs::read_to_string(&s.policy).unwrap();
        let lent = text.replace(
            "value = \"Bearer ${env:REG_TOKEN}\"\n",
            "value = \"Bearer ${env:REG_TOKEN}\"\nmethods = [\"PUT /airlock-pub\"]\n",
        );
        assert_ne!(lent, text, "the policy has no registry credential to lend");
        std::fs::write(&s.policy, lent).unwrap();
        let r = s.reg.port();
        let script = format!(
            "curl -s -o /dev/null -D /tmp/h -X PUT -d x -w 'pub=%{{http_code}}' https://registry.test:{r}/airlock-pub; \
             echo \" $(grep -i '^x-airlock-reason' /tmp/h | tr -d '\\r')\""
        );
        let out = s.review(who, &script, None);
        assert!(
            out.stdout.contains("pub=403 x-airlock-reason: held"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            !s.reg.seen().iter().any(|l| l.starts_with("PUT ")),
            "{who:?}: the lent write reached the registry in review: {:?}",
            s.reg.seen()
        );
        // Without review, lent means sent.
        let out = s.plain(who, &script);
        assert!(out.stdout.contains("pub=200"), "{who:?}: {}", show(&out));
    }
}

/// A write held for review to a host the person allowed only by an
/// approval during the run is sent by `changes apply`: running apply is
/// the person's release of the held requests, to their own hosts only.
#[test]
fn a_held_write_to_a_host_approved_in_the_run_is_sent_by_apply() {
    if !Path::new("/usr/bin/python3").exists() {
        eprintln!("skipped: no /usr/bin/python3 for the approver");
        return;
    }
    for who in Who::all() {
        let s = setup(who);
        let r = s.reg.port();
        // The registry is not in the policy: only an approval lets it in.
        let text = std::fs::read_to_string(&s.policy).unwrap();
        let unlisted = text.replace(&format!(", \"registry.test:{r}\""), "");
        assert_ne!(unlisted, text);
        std::fs::write(&s.policy, unlisted).unwrap();
        let sock = s.f.home.join("ask.sock");
        // The person, as the same user as airlock (the socket serves only
        // its own uid): allows every host asked about, once.
        const ANSWER: &str = r#"
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX)
for _ in range(1000):
    try:
        s.connect(sys.argv[1])
        break
    except OSError:
        time.sleep(0.02)
n = 0
for line in s.makefile():
    m = json.loads(line)
    if m.get("type") == "ask":
        n += 1
        a = {"type": "answer", "id": m["id"], "verdict": "allow-once"}
        s.sendall((json.dumps(a) + "\n").encode())
print(n)
"#;
        let answerer = who
            .host(
                &s.f,
                &s.f.home,
                "/usr/bin/python3",
                &["-c", ANSWER, sock.to_str().unwrap()],
            )
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let ask = format!("socket:{}", sock.display());
        let mut c = s.f.command(
            &[
                "--review",
                "-p",
                s.policy.to_str().unwrap(),
                "--upstream-ca",
                s.pki.ca_pem.to_str().unwrap(),
                "--resolve",
                "registry.test=127.0.0.1",
                "--allow-private",
                "127.0.0.0/8",
                "--ask",
                &ask,
            ],
            &format!(
                "curl -s -o /dev/null -D /tmp/h -X PUT -d x -w 'pub=%{{http_code}}' https://registry.test:{r}/airlock-pub; \
                 echo \" $(grep -i '^x-airlock-reason' /tmp/h | tr -d '\\r')\""
            ),
        );
        c.env("REG_TOKEN", REG_TOKEN)
            .env("GIT_TEST_TOKEN", "unused");
        let out = run(&mut who.wrap(c));
        assert!(
            out.stdout.contains("pub=403 x-airlock-reason: held"),
            "{who:?}: {}",
            show(&out)
        );
        let asked = answerer.wait_with_output().unwrap();
        assert!(
            String::from_utf8_lossy(&asked.stdout).trim() != "0",
            "{who:?}: nobody was asked"
        );
        assert!(!s.reg.seen().iter().any(|l| l.starts_with("PUT ")));
        let id = held_id(&out);
        let apply = airlock_host(&s.f, who, &["changes", "apply", &id, "--json"]);
        assert_eq!(apply.code, 0, "{who:?}: {}", show(&apply));
        let v: serde_json::Value = serde_json::from_str(&apply.stdout).expect("json");
        assert_eq!(v["requests"][0]["outcome"], "sent", "{who:?}: {v}");
        assert_eq!(v["requests"][0]["status"], 200, "{who:?}: {v}");
        assert!(s
            .reg
            .seen()
            .iter()
            .any(|l| l.starts_with("PUT /airlock-pub")));
    }
}

/// A push larger than git's `http.postBuffer`: git first sends a probe (a
/// bare flush packet) and then streams the pack. The probe is answered,
/// not held, so the pack itself is what the changeset keeps, and apply
/// pushes exactly that commit.
#[test]
fn a_push_larger_than_the_post_buffer_holds_the_pack_not_the_probe() {
    for who in Who::all() {
        let s = setup(who);
        let push = "head -c 200000 /dev/urandom > big.bin && git add big.bin && \
            git -c user.email=t@t -c user.name=t commit -q -m big-commit && \
            echo \"commit=$(git rev-parse HEAD)\"; \
            git -c http.postBuffer=4096 push origin HEAD:main 2>&1; echo \"push=$?\"";
        let out = s.review(who, push, None);
        let commit = commit_of(&out);
        assert!(!out.stdout.contains("push=0"), "{who:?}: {}", show(&out));
        assert!(s.pushes_seen().is_empty(), "{who:?}: {:?}", s.git.seen());
        let id = held_id(&out);
        let json = airlock_host(&s.f, who, &["changes", "diff", &id, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("json");
        let reqs = v["requests"].as_array().expect("requests");
        assert_eq!(reqs.len(), 1, "{who:?}: {v}");
        assert!(
            reqs[0]["size"].as_u64().unwrap_or(0) > 100_000,
            "{who:?}: the held request is not the pack: {v}"
        );
        let apply = airlock_host(&s.f, who, &["changes", "apply", &id]);
        assert_eq!(apply.code, 0, "{who:?}: {}", show(&apply));
        assert_eq!(s.remote_main(), commit, "{who:?}: {}", show(&apply));
    }
}

/// A credentialed read that is a POST by its protocol (git's fetch posts
/// to upload-pack) is a read: a review run sends it, holds nothing.
#[test]
fn a_fetch_in_review_is_a_read_and_goes_through() {
    for who in Who::all() {
        let s = setup(who);
        let out = s.review(who, "git fetch -q origin 2>&1 && echo fetched", None);
        assert!(out.stdout.contains("fetched"), "{who:?}: {}", show(&out));
        // FETCH_HEAD is held as a file; no request is.
        assert!(!out.stderr.contains("request"), "{who:?}: {}", show(&out));
        assert!(
            s.git
                .seen()
                .iter()
                .any(|l| l.starts_with("POST ") && l.contains("git-upload-pack")),
            "{who:?}: {:?}",
            s.git.seen()
        );
    }
}
