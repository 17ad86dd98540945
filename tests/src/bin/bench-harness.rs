//! An agent's task, as a harness runs it (issue #27): 50 short commands
//! (`ls`, `grep`, `sed -i`, `git status`/`git diff`, a test script, `cat`,
//! `find`) from different directories of a git repository, run three
//! ways in interleaved rounds: with no sandbox, each as a one-shot
//! `airlock run`, and each in one session. Prints the totals and ratios.
//!
//!     scripts/build-release.sh && ./target/release/bench-harness [ROUNDS]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use airlock_tests::Fixture;

/// The task: (directory below the workspace, shell command).
fn task() -> Vec<(&'static str, String)> {
    let mut v: Vec<(&'static str, String)> = vec![];
    for i in 0..5 {
        v.push(("", "ls".into()));
        v.push(("src", "ls -la".into()));
        v.push(("", "git status --short".into()));
        v.push(("src/lib", format!("grep -rn 'value{i}' .")));
        v.push((
            "src/lib",
            format!("sed -i 's/value{i}/renamed{i}/' mod{i}.js"),
        ));
        v.push(("", "git diff --stat".into()));
        v.push(("src", "find . -name '*.js' | wc -l".into()));
        v.push(("", "sh ./test.sh".into()));
        v.push(("src/lib", format!("cat mod{i}.js")));
        v.push(("docs", "grep -c line notes.md".into()));
    }
    v
}

fn git(dir: &Path, args: &[&str]) {
    let st = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@b"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdout(Stdio::null())
        .status()
        .expect("git");
    assert!(st.success(), "git {args:?}");
}

/// A small repository: sources, docs and a test script.
fn repository(ws: &Path) {
    std::fs::create_dir_all(ws.join("src/lib")).unwrap();
    std::fs::create_dir_all(ws.join("docs")).unwrap();
    for i in 0..40 {
        std::fs::write(
            ws.join(format!("src/lib/mod{i}.js")),
            format!("// module {i}\nexport const value{i} = {i};\n"),
        )
        .unwrap();
    }
    std::fs::write(ws.join("docs/notes.md"), "line\n".repeat(200)).unwrap();
    std::fs::write(
        ws.join("test.sh"),
        "for f in src/lib/*.js; do grep -q export \"$f\" || exit 1; done; echo ok\n",
    )
    .unwrap();
    git(ws, &["init", "-q"]);
    git(ws, &["add", "."]);
    git(ws, &["commit", "-q", "-m", "start"]);
}

fn airlock_in(fx: &Fixture, dir: &Path, args: &[&str]) -> Command {
    let model = fx.command_argv(&[], &["x"]);
    let mut c = Command::new(airlock_tests::airlock_bin());
    c.env_clear()
        .envs(model.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// One pass of the task, each command through `wrap`; milliseconds.
fn pass(ws: &Path, mut wrap: impl FnMut(&Path, &str) -> Command) -> f64 {
    // Each pass starts from the same tree.
    git(ws, &["checkout", "-q", "--", "."]);
    let t = Instant::now();
    for (dir, cmd) in task() {
        let st = wrap(&ws.join(dir), &cmd).status().expect("spawn");
        assert!(st.success(), "{cmd} failed");
    }
    t.elapsed().as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let fx = Fixture::new_in(&std::env::temp_dir().join("airlock-bench"));
    repository(&fx.ws);
    let name = format!("harness{}", std::process::id());
    let st = airlock_in(&fx, &fx.ws, &["session", "start", "--name", &name])
        .status()
        .expect("session start");
    assert!(st.success(), "session start failed");
    let ws: PathBuf = fx.ws.clone();
    let (mut bare, mut oneshot, mut session) = (vec![], vec![], vec![]);
    for _ in 0..rounds {
        bare.push(pass(&ws, |dir, cmd| {
            let mut c = Command::new("sh");
            c.args(["-c", cmd])
                .current_dir(dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            c
        }));
        oneshot.push(pass(&ws, |dir, cmd| {
            airlock_in(&fx, dir, &["run", "--", "sh", "-c", cmd])
        }));
        session.push(pass(&ws, |dir, cmd| {
            airlock_in(
                &fx,
                dir,
                &["run", "--session", &name, "--", "sh", "-c", cmd],
            )
        }));
    }
    let _ = airlock_in(&fx, &fx.ws, &["session", "end", &name]).status();
    let (b, o, s) = (median(bare), median(oneshot), median(session));
    let n = task().len();
    println!(
        "a {n}-command agent task in a git repository, median of {rounds} interleaved rounds:"
    );
    println!(
        "  no sandbox:              {b:8.1} ms  ({:.2} ms a command)",
        b / n as f64
    );
    println!(
        "  one-shot airlock run:    {o:8.1} ms  ({:.2} ms a command)  {:.2}x no sandbox",
        o / n as f64,
        o / b
    );
    println!(
        "  one session:             {s:8.1} ms  ({:.2} ms a command)  {:.2}x no sandbox",
        s / n as f64,
        s / b
    );
}
