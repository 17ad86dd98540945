//! `airlock approve --socket PATH`: a ready client for the socket protocol,
//! for a second terminal. It shows each question, with everything the
//! sandbox controls escaped, and takes answers the way `--ask tty` does:
//! one lowercase key, o, s, a or d, no Enter on a terminal (a line holding
//! just that letter otherwise); anything else denies. A question withdrawn
//! while it is shown (its timeout passed, or another client answered) is
//! dropped, not answered late.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;
use std::sync::mpsc;

use airlock_proxy::escape;
use anyhow::{Context, Result};
use serde_json::{json, Value};

/// A line of input (not a terminal): exactly one answer letter.
fn verdict_for_line(input: &str) -> &'static str {
    match input.trim_end_matches(['\n', '\r']) {
        "o" => "allow-once",
        "s" => "allow-session",
        "a" => "allow-always",
        _ => "deny",
    }
}

/// Raw single-key input on a terminal, restored on drop.
struct RawStdin {
    saved: Option<libc::termios>,
}

impl RawStdin {
    fn new() -> RawStdin {
        let fd = std::io::stdin().as_raw_fd();
        // SAFETY: terminal calls on our own stdin.
        unsafe {
            if libc::isatty(fd) != 1 {
                return RawStdin { saved: None };
            }
            let mut saved: libc::termios = std::mem::zeroed();
            libc::tcgetattr(fd, &mut saved);
            let mut raw = saved;
            raw.c_lflag &= !(libc::ICANON | libc::ECHO);
            raw.c_cc[libc::VMIN] = 1;
            raw.c_cc[libc::VTIME] = 0;
            libc::tcsetattr(fd, libc::TCSANOW, &raw);
            RawStdin { saved: Some(saved) }
        }
    }

    fn is_terminal(&self) -> bool {
        self.saved.is_some()
    }

    fn flush(&self) {
        if self.is_terminal() {
            // SAFETY: tcflush on our own stdin.
            unsafe { libc::tcflush(std::io::stdin().as_raw_fd(), libc::TCIFLUSH) };
        }
    }
}

impl Drop for RawStdin {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            // SAFETY: restoring what `new` saved.
            unsafe { libc::tcsetattr(std::io::stdin().as_raw_fd(), libc::TCSANOW, saved) };
        }
    }
}

/// Wait for stdin to be readable, up to 200 ms.
fn stdin_ready() -> bool {
    let mut pfd = libc::pollfd {
        fd: std::io::stdin().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, 200) > 0 }
}

enum Read1 {
    Verdict(&'static str),
    Eof,
}

fn read_answer(raw: &RawStdin) -> Result<Read1> {
    if raw.is_terminal() {
        let mut buf = [0u8; 64];
        let n = std::io::stdin()
            .lock()
            .read(&mut buf)
            .context("reading your answer")?;
        if n == 0 {
            return Ok(Read1::Eof);
        }
        return Ok(Read1::Verdict(
            match crate::approve::tty::key_answer(&buf[..n]) {
                Some(a) => match a {
                    airlock_proxy::Answer::AllowOnce => "allow-once",
                    airlock_proxy::Answer::AllowSession => "allow-session",
                    airlock_proxy::Answer::AllowAlways => "allow-always",
                    _ => "deny",
                },
                None => "deny",
            },
        ));
    }
    let mut input = String::new();
    if std::io::stdin()
        .lock()
        .read_line(&mut input)
        .context("reading your answer")?
        == 0
    {
        return Ok(Read1::Eof);
    }
    Ok(Read1::Verdict(verdict_for_line(&input)))
}

/// The host first; the sandbox's argv after it, shortened, on its own
/// labelled line, so no argv can push the host out of sight.
fn question(msg: &Value) -> String {
    let who = msg["command"]
        .as_str()
        .map_or_else(|| "(unknown)".to_string(), |c| escape::line(c, 60));
    let host = escape::line(msg["host"].as_str().unwrap_or("?"), 300);
    let port = msg["port"]
        .as_u64()
        .map_or("?".to_string(), |p| p.to_string());
    if msg["kind"].as_str() == Some("credential-write") {
        let field = |k: &str, n| escape::line(msg[k].as_str().unwrap_or("?"), n);
        return format!(
            "\nlend the credential {} to {} {}?\n  (it is lent to reads only; this request may publish, delete or create tokens)\n  command: {who}\n  [o]nce [s]ession [d]eny: ",
            field("credential", 200),
            field("method", 20),
            field("url", 300)
        );
    }
    format!("\nconnect to {host}:{port}?\n  command: {who}\n  [o]nce [s]ession [a]lways [d]eny: ")
}

/// Connect to the approval socket, waiting for it to appear when it is
/// not there yet (a harness starts the approver before the session or
/// run that binds it). `wait`: how long; `None` is for ever.
fn connect(path: &Path, wait: Option<std::time::Duration>) -> Result<UnixStream> {
    let start = std::time::Instant::now();
    let mut said = false;
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) && wait.is_none_or(|w| start.elapsed() < w) =>
            {
                if !said {
                    eprintln!(
                        "airlock approve: waiting for {} to appear",
                        escape::line(&path.display().to_string(), 300)
                    );
                    said = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(e).with_context(|| format!("connecting to {}", path.display())),
        }
    }
}

pub fn run(path: &Path, wait: Option<std::time::Duration>) -> Result<ExitCode> {
    let stream = connect(path, wait)?;
    // Only airlock's own listener, of this user, outside every sandbox: a
    // socket in a directory a sandbox can write may be one it put there,
    // to show forged questions and take the answers (red team round 13).
    #[cfg(target_os = "linux")]
    crate::procfs::peer_outside(&stream).map_err(|e| {
        anyhow::anyhow!(
            "refusing the approval socket {}: {e}; a sandbox may have replaced it (keep it outside the writable roots)",
            escape::line(&path.display().to_string(), 300)
        )
    })?;
    let mut writer = stream.try_clone().context("socket")?;
    eprintln!(
        "airlock approve: connected to {}; answer each question with one lowercase key: o (once), s (session), a (always) or d (deny){}; anything else denies, as at the --ask tty prompt",
        escape::line(&path.display().to_string(), 300),
        if std::io::IsTerminal::is_terminal(&std::io::stdin()) { ", no Enter" } else { " on a line of its own" }
    );
    let (tx, rx) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if let Ok(msg) = serde_json::from_str::<Value>(&line) {
                if tx.send(msg).is_err() {
                    break;
                }
            }
        }
    });
    let raw = RawStdin::new();
    let mut queue: Vec<Value> = vec![];
    loop {
        let msg = match queue.is_empty() {
            true => match rx.recv() {
                Ok(m) => m,
                Err(_) => return Ok(ExitCode::SUCCESS),
            },
            false => queue.remove(0),
        };
        match msg["type"].as_str() {
            Some("ask") => {
                let id = msg["id"].as_str().unwrap_or_default().to_string();
                // Keys pressed before the question was drawn are not answers.
                raw.flush();
                eprint!("{}", question(&msg));
                let verdict = loop {
                    // A withdrawn question is dropped, not answered late.
                    let mut withdrawn = false;
                    while let Ok(m) = rx.try_recv() {
                        if m["type"] == "answered" && m["id"] == id.as_str() {
                            withdrawn = true;
                            eprintln!(
                                "\nquestion {} settled: {}",
                                escape::line(&id, 40),
                                escape::line(m["verdict"].as_str().unwrap_or("?"), 40)
                            );
                        } else {
                            queue.push(m);
                        }
                    }
                    if withdrawn {
                        break None;
                    }
                    if !stdin_ready() {
                        continue;
                    }
                    match read_answer(&raw)? {
                        Read1::Eof => {
                            // Nobody is left to answer: what is asked is
                            // denied, not left open (harness round 12).
                            for q in std::iter::once(id.clone()).chain(
                                queue
                                    .iter()
                                    .filter(|m| m["type"] == "ask")
                                    .filter_map(|m| m["id"].as_str().map(str::to_string)),
                            ) {
                                let answer = json!({"type": "answer", "id": q, "verdict": "deny"});
                                let _ = writeln!(writer, "{answer}");
                            }
                            eprintln!("deny (end of input: airlock approve stops; what it was asked is denied)");
                            return Ok(ExitCode::SUCCESS);
                        }
                        Read1::Verdict(v) => break Some(v),
                    }
                };
                if let Some(v) = verdict {
                    eprintln!("{v}");
                    let answer = json!({"type": "answer", "id": id, "verdict": v});
                    writeln!(writer, "{answer}").context("sending the answer")?;
                }
            }
            Some("answered") => eprintln!(
                "question {} settled: {}",
                escape::line(msg["id"].as_str().unwrap_or("?"), 40),
                escape::line(msg["verdict"].as_str().unwrap_or("?"), 40)
            ),
            Some("error") => eprintln!(
                "airlock: {}",
                escape::line(msg["message"].as_str().unwrap_or("?"), 500)
            ),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_answer_like_keys() {
        assert_eq!(verdict_for_line("o\n"), "allow-once");
        assert_eq!(verdict_for_line("a\n"), "allow-always");
        for other in ["A\n", "always\n", "yes\n", "\x1b[0n\n", "o o\n"] {
            assert_eq!(verdict_for_line(other), "deny", "{other:?}");
        }
    }

    #[test]
    fn questions_are_escaped() {
        let q = question(&json!({"id": "1", "host": "h.test", "port": 443,
            "command": "\u{1b}[2K\rnpm install wants a.test"}));
        assert!(!q.bytes().any(|b| b < 0x20 && b != b'\n'), "{q:?}");
        assert!(q.starts_with("\nconnect to h.test:443?\n"), "{q:?}");
    }
}
