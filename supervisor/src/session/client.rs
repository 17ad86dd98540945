//! `airlock run --session NAME -- cmd`: one command in a running session.
//! Nothing of the sandbox is built here: the request goes to the session's
//! supervisor with this process's stdin, stdout and stderr, and this
//! process waits, passes its signals on and exits with the command's
//! status (SPEC §4.7).

use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use serde_json::{json, Value};

use crate::cli::RunArgs;

const PASSED_ON: &[Signal] = &[
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGWINCH,
];

/// The options that shape a sandbox belong to `session start`: given
/// here they would silently do nothing, so they are refused.
fn refuse_sandbox_options(args: &RunArgs) -> Result<()> {
    let p = &args.policy;
    let shaping = [
        ("--policy", !p.policy.is_empty()),
        ("--preset", !p.preset.is_empty()),
        ("--allow", !p.allow.is_empty()),
        ("--deny", !p.deny.is_empty()),
        ("--inspect", !p.inspect.is_empty()),
        ("--resolve", !p.resolve.is_empty()),
        ("--allow-private", !p.allow_private.is_empty()),
        ("--upstream-ca", !p.upstream_ca.is_empty()),
        ("--ask", p.ask.is_some()),
        ("--audit-log", p.audit_log.is_some()),
        ("--otlp", p.otlp.is_some()),
        ("--dns-server", p.dns_server.is_some()),
        ("--workspace", p.workspace.is_some()),
        ("--write", !args.write.is_empty()),
        ("--read-only", args.read_only),
        ("--network", args.network.is_some()),
        ("--allow-degraded", args.allow_degraded),
        ("--learn", args.learn.is_some()),
        ("--pass-env", !args.pass_env.is_empty()),
    ];
    if let Some((flag, _)) = shaping.iter().find(|(_, set)| *set) {
        bail!(
            "{flag} shapes the sandbox, which the session built when it started: give it to `airlock session start`, or {}",
            match args.session {
                Some(_) => "run without --session",
                None => "unset AIRLOCK_SESSION (it names the session this command runs in)",
            }
        );
    }
    Ok(())
}

/// What a command in a session is given: the rest is the session's.
pub struct Request<'a> {
    pub command: &'a [String],
    pub timeout: Option<&'a str>,
    pub report: Option<&'a std::path::Path>,
    /// The session was named by `AIRLOCK_SESSION`, not `--session`.
    pub from_env: bool,
}

pub fn run(args: &RunArgs, name: &str) -> Result<ExitCode> {
    refuse_sandbox_options(args)?;
    send(
        &Request {
            command: &args.command,
            timeout: args.timeout.as_deref(),
            report: args.report.as_deref(),
            from_env: args.session.is_none(),
        },
        name,
    )
}

/// `airlock run [--session NAME] [--timeout T] [--report F] -- CMD...`
/// (the session named by the option or by `AIRLOCK_SESSION`), read
/// before the command-line parser is built: a harness runs hundreds of
/// these, and building the parser for every subcommand and setting up
/// logging cost as much as the rest of the client. Anything else (an
/// option, a missing `--`, no session, arguments that are not UTF-8) is
/// left to the parser, which gives every error its usual words.
pub fn quick(
    args: &[std::ffi::OsString],
) -> Option<(Result<ExitCode>, Option<std::path::PathBuf>)> {
    let args: Vec<&str> = args.iter().map(|a| a.to_str()).collect::<Option<_>>()?;
    let mut it = args.iter().skip(1);
    if it.next() != Some(&"run") {
        return None;
    }
    let (mut session, mut timeout, mut report) = (None, None, None);
    loop {
        let a = *it.next()?;
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (a, None),
        };
        let slot = match flag {
            "--" => break,
            "--session" => &mut session,
            "--timeout" => &mut timeout,
            "--report" => &mut report,
            _ => return None,
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(match inline {
            Some(v) => v,
            None => *it.next()?,
        });
    }
    let command: Vec<String> = it.map(|a| a.to_string()).collect();
    if command.is_empty() {
        return None;
    }
    let from_env = std::env::var("AIRLOCK_SESSION")
        .ok()
        .filter(|s| !s.is_empty());
    let name = session.map(str::to_string).or(from_env)?;
    if name.is_empty() || name.starts_with('-') {
        return None;
    }
    let request = Request {
        command: &command,
        timeout,
        report: report.map(std::path::Path::new),
        from_env: session.is_none(),
    };
    Some((send(&request, &name), report.map(std::path::PathBuf::from)))
}

fn send(args: &Request, name: &str) -> Result<ExitCode> {
    let timeout = args
        .timeout
        .map(|t| {
            airlock_policy::units::parse_duration(t).map_err(|e| anyhow::anyhow!("--timeout: {e}"))
        })
        .transpose()?;
    // Opened now, without following links, as a one-shot run opens it.
    let report = args.report.map(crate::report::open).transpose()?;
    let seq = match super::connect(name) {
        Err(e) if args.from_env => {
            return Err(e.context("the session AIRLOCK_SESSION names (unset it to run without one)"))
        }
        r => r?,
    };
    let cwd = std::env::current_dir().context("the current directory")?;
    let env: Vec<(String, String)> = std::env::vars().collect();
    // Signals are taken from here on: the command gets them.
    let mut mask = SigSet::empty();
    for s in PASSED_ON {
        mask.add(*s);
    }
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None)
        .context("blocking signals")?;
    let sfd = nix::sys::signalfd::SignalFd::with_flags(
        &mask,
        nix::sys::signalfd::SfdFlags::SFD_CLOEXEC | nix::sys::signalfd::SfdFlags::SFD_NONBLOCK,
    )
    .context("signalfd")?;
    // The session puts this terminal in raw mode while the command has a
    // terminal of its own (`relay.rs`); it is given back as it was here
    // too, should the session go away first.
    let _terminal = Terminal::saved();
    seq.send_json(
        &json!({"op": "run", "argv": args.command, "cwd": cwd, "env": env}),
        &[0, 1, 2],
    )
    .context("sending the command to the session")?;
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut timed_out = false;
    let answer = loop {
        let wait_ms = match deadline {
            Some(d) if !timed_out => {
                let left = d.saturating_duration_since(Instant::now());
                i32::try_from(left.as_millis()).unwrap_or(i32::MAX)
            }
            _ => -1,
        };
        let mut fds = [
            libc::pollfd {
                fd: seq.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll on descriptors we own.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, wait_ms) };
        if n < 0 {
            continue;
        }
        if n == 0 {
            // The timeout: the command's whole process group is killed.
            timed_out = true;
            let _ = seq.send_json(&json!({"op": "kill"}), &[]);
            continue;
        }
        if fds[1].revents != 0 {
            while let Ok(Some(info)) = sfd.read_signal() {
                let _ = seq.send_json(&json!({"op": "signal", "sig": info.ssi_signo}), &[]);
            }
        }
        if fds[0].revents != 0 {
            match seq.recv_json() {
                Ok(Some((v, _))) => break v,
                _ => bail!("the session {name:?} went away before the command ended"),
            }
        }
    };
    for note in answer
        .get("notes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(n) = note.as_str() {
            eprintln!("{n}");
        }
    }
    let mut code = answer.get("code").and_then(Value::as_i64).unwrap_or(125) as i32;
    if answer.get("type").and_then(Value::as_str) == Some("error") {
        let m = answer.get("message").and_then(Value::as_str).unwrap_or("");
        eprintln!("airlock: {m}");
    }
    if timed_out {
        eprintln!(
            "airlock: timed out after {:?}; the command was killed with its process group and what runs below it (only a daemon that left both runs on until the session ends)",
            timeout.unwrap_or(Duration::ZERO)
        );
        code = i32::from(crate::report::EXIT_TIMEOUT);
    }
    if let Some(file) = report {
        // A command refused before it ran has no report of its own: the
        // file still says why (harness round 12).
        let mut r = answer.get("report").cloned().unwrap_or_else(
            || json!({"error": answer.get("message").and_then(Value::as_str).unwrap_or("")}),
        );
        r["exit_code"] = json!(code);
        crate::report::write_value(file, &r)?;
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// The caller's terminal settings, put back when dropped.
struct Terminal(Option<nix::sys::termios::Termios>);

impl Terminal {
    fn saved() -> Terminal {
        let stdin = std::io::stdin();
        Terminal(nix::sys::termios::tcgetattr(&stdin).ok())
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if let Some(mode) = &self.0 {
            let stdin = std::io::stdin();
            if nix::sys::termios::tcgetattr(&stdin).ok().as_ref() != Some(mode) {
                let _ = nix::sys::termios::tcsetattr(
                    &stdin,
                    nix::sys::termios::SetArg::TCSADRAIN,
                    mode,
                );
            }
        }
    }
}
