//! `--ask tty` (SPEC §5.2): the question goes to /dev/tty, and the sandbox
//! can neither answer it nor disguise it.
//!
//! - While it asks, every process of the sandbox is stopped (`sandbox`),
//!   not only the foreground job; the foreground job is first suspended as
//!   a shell does on ^Z, so full-screen programs restore the terminal.
//! - Input that arrived before the prompt (type-ahead, a terminal's reply
//!   to a query the sandbox sent) is discarded before the prompt is drawn.
//! - Only a deliberate key counts: one read of exactly one byte that is
//!   `o`, `s`, `a` or `d`. Anything else (upper case, an escape sequence,
//!   several bytes at once as a terminal's reply arrives) voids the
//!   prompt, which is then answered `deny`. Denying rather than asking
//!   again means a reply the sandbox provoked can only ever refuse.
//! - What the sandbox controls is shown with control characters escaped.
//! - The question is drawn on a terminal state the sandbox cannot have
//!   shaped: the alternate screen, cleared, with attributes, character
//!   set, scroll region and cursor reset (`SCREEN_ENTER`); a concealed
//!   (ESC[8m) or fg=bg question, or one scrolled out of a one-line region,
//!   is not possible. The host comes first, the sandbox's argv after it,
//!   shortened, on its own labelled line.
//! - A question whose timeout passed while it waited for the terminal is
//!   withdrawn, never shown late.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_proxy::escape;
use airlock_proxy::{Answer, AnswerFuture, Approver, Question};

use super::Persist;

pub struct TtyApprover {
    /// One prompt at a time on the one terminal.
    lock: Arc<Mutex<()>>,
    timeout: Duration,
    persist: Persist,
}

impl TtyApprover {
    pub fn new(timeout: Duration, persist: Persist) -> TtyApprover {
        TtyApprover {
            lock: Arc::new(Mutex::new(())),
            timeout,
            persist,
        }
    }
}

/// The terminal handed to us for the length of one prompt: our process
/// group in the foreground, raw single-key input, the sandbox stopped; all
/// restored on drop.
struct Borrowed {
    tty: File,
    saved_pgrp: libc::pid_t,
    saved_termios: libc::termios,
    old_ttou: libc::sighandler_t,
    _stopped: super::sandbox::Stopped,
}

impl Borrowed {
    fn take() -> Result<Borrowed, String> {
        let tty = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/tty")
            .map_err(|e| format!("no terminal to ask on: {e}"))?;
        let fd = tty.as_raw_fd();
        // SAFETY: terminal ioctls and signals on a descriptor and a process
        // group we own; SIGTTOU ignored so a background group may change the
        // foreground.
        unsafe {
            let old_ttou = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            let saved_pgrp = libc::tcgetpgrp(fd);
            if saved_pgrp > 0 && saved_pgrp != libc::getpgrp() {
                // Suspend the job as a shell does on ^Z: full-screen programs
                // restore the terminal on SIGTSTP.
                libc::kill(-saved_pgrp, libc::SIGTSTP);
                std::thread::sleep(Duration::from_millis(30));
                libc::kill(-saved_pgrp, libc::SIGSTOP);
            }
            // Then every process, background and `setsid` ones included:
            // none may draw over the question or make the terminal type.
            let stopped = match super::sandbox::stop_all() {
                Ok(s) => s,
                Err(super::sandbox::NotStopped(why)) => {
                    // A question the sandbox could draw over is not asked.
                    if saved_pgrp > 0 && saved_pgrp != libc::getpgrp() {
                        libc::kill(-saved_pgrp, libc::SIGCONT);
                    }
                    libc::signal(libc::SIGTTOU, old_ttou);
                    return Err(format!("voided: {why}"));
                }
            };
            tracing::debug!(
                processes = stopped.count(),
                "sandbox stopped for the question"
            );
            libc::tcsetpgrp(fd, libc::getpgrp());
            let mut saved_termios: libc::termios = std::mem::zeroed();
            libc::tcgetattr(fd, &mut saved_termios);
            let mut raw = saved_termios;
            // No ISIG: ^C at the prompt is read as a key (deny), not a
            // signal that would take airlock down.
            raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
            // Input and output as we expect them, not as the sandbox left
            // them: no case or CR/NL mapping of the key (IUCLC would make
            // `A` an `a`), no flow control, output post-processed only for
            // NL to CR NL (no OLCUC, OCRNL, fill or delays).
            raw.c_iflag &= !(libc::INLCR | libc::IGNCR | libc::ICRNL | libc::IXON | libc::ISTRIP);
            #[cfg(target_os = "linux")]
            {
                raw.c_iflag &= !libc::IUCLC;
            }
            raw.c_oflag = libc::OPOST | libc::ONLCR;
            raw.c_cc[libc::VMIN] = 1;
            raw.c_cc[libc::VTIME] = 0;
            // TCSAFLUSH: output drains, pending input is discarded.
            libc::tcsetattr(fd, libc::TCSAFLUSH, &raw);
            Ok(Borrowed {
                tty,
                saved_pgrp,
                saved_termios,
                old_ttou,
                _stopped: stopped,
            })
        }
    }

    /// Discard whatever input is pending now.
    fn flush(&self) {
        // SAFETY: tcflush on our terminal descriptor.
        unsafe { libc::tcflush(self.tty.as_raw_fd(), libc::TCIFLUSH) };
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        let fd = self.tty.as_raw_fd();
        // SAFETY: restoring exactly what `take` saved. Keys pressed during
        // the prompt are not handed to the sandbox afterwards (TCSAFLUSH).
        unsafe {
            libc::tcsetattr(fd, libc::TCSAFLUSH, &self.saved_termios);
            if self.saved_pgrp > 0 {
                libc::tcsetpgrp(fd, self.saved_pgrp);
                if self.saved_pgrp != libc::getpgrp() {
                    // Resume the job; full-screen programs redraw on SIGCONT.
                    libc::kill(-self.saved_pgrp, libc::SIGCONT);
                }
            }
            libc::signal(libc::SIGTTOU, self.old_ttou);
        }
        // `_stopped` is dropped after this: the rest of the sandbox resumes.
    }
}

/// What one read from the terminal means: exactly one byte, one of the
/// answer keys. `None` voids the prompt.
pub fn key_answer(bytes: &[u8]) -> Option<Answer> {
    match bytes {
        [b'o'] => Some(Answer::AllowOnce),
        [b's'] => Some(Answer::AllowSession),
        [b'a'] => Some(Answer::AllowAlways),
        [b'd'] => Some(Answer::Deny),
        _ => None,
    }
}

/// Written before the question: the alternate screen (the sandbox's
/// screen is kept and comes back after), then every state the sandbox
/// could have set to hide or disguise text, reset: attributes (ESC[0m:
/// conceal, colours, reverse), reverse video (DECSCNM), the G0/G1 character
/// sets and shift-in (ESC(0 line drawing), insert mode, origin mode, the
/// scroll region, auto-wrap, a hidden cursor; then the screen is cleared.
pub const SCREEN_ENTER: &str =
    "\x1b[?1049h\x1b[0m\x1b[?5l\x1b(B\x1b)B\x0f\x1b[4l\x1b[?6l\x1b[r\x1b[?7h\x1b[?25h\x1b[H\x1b[2J";
/// Written after the answer: back to the screen the sandbox had.
pub const SCREEN_LEAVE: &str = "\x1b[?1049l";

/// How much of the sandbox's argv the question shows: enough to recognise
/// the command, too little to push the host out of sight.
const COMMAND_SHOWN: usize = 60;

/// The question as drawn: the host first, everything from the sandbox
/// escaped, the command shortened on its own line.
pub fn question_line(q: &Question) -> String {
    let who = q.command.as_deref().map_or_else(
        || "(unknown)".to_string(),
        |c| escape::line(c, COMMAND_SHOWN),
    );
    if let Some(w) = &q.write {
        // SPEC §3.4: the host is allowed; the question is whether this
        // request may act with someone's identity.
        return format!(
            "airlock: lend the credential {} to {} {}?\r\n  (it is lent to reads only; this request may publish, delete or create tokens)\r\n  command: {who}\r\n  Allow? [o]nce [s]ession [d]eny (one lowercase key; anything else denies): ",
            escape::line(&w.credential, 200),
            escape::line(&w.method, 20),
            escape::line(&w.url, 300),
        );
    }
    format!(
        "airlock: allow a connection to {}?\r\n  command: {who}\r\n  Allow? [o]nce [s]ession [a]lways [d]eny (one lowercase key; anything else denies): ",
        escape::line(&q.target.to_string(), 300)
    )
}

fn prompt(q: &Question, deadline: Instant, cancelled: &AtomicBool) -> (Answer, String) {
    let mut t = match Borrowed::take() {
        Ok(t) => t,
        Err(why) => {
            eprintln!(
                "airlock: the question for {} was not asked ({why}); denied",
                escape::line(&q.target.to_string(), 300)
            );
            return (Answer::Deny, why);
        }
    };
    // Once more after the stops landed: a reply already on its way is gone.
    t.flush();
    let _ = write!(t.tty, "{SCREEN_ENTER}{}", question_line(q));
    let _ = t.tty.flush();
    let mut note = "";
    let answer = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || cancelled.load(Ordering::Relaxed) {
            break Answer::Timeout;
        }
        let mut pfd = libc::pollfd {
            fd: t.tty.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Wake up now and then to notice a withdrawn question.
        let wait = left.min(Duration::from_millis(200)).as_millis() as i32;
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, wait) };
        if ready <= 0 {
            continue;
        }
        let mut buf = [0u8; 64];
        match t.tty.read(&mut buf) {
            Ok(n) if n > 0 => match key_answer(&buf[..n]) {
                Some(a) => break a,
                None => {
                    note = " (not a single o/s/a/d key: the prompt was voided)";
                    break Answer::Deny;
                }
            },
            _ => break Answer::Deny,
        }
    };
    // Back to the sandbox's screen at once (keys typed next belong to it),
    // where one line says what was answered.
    let _ = write!(
        t.tty,
        "{}{note}\r\n{SCREEN_LEAVE}\r\nairlock: {}: {}{note}\r\n",
        answer.as_str(),
        escape::line(&q.target.to_string(), 300),
        answer.as_str()
    );
    let _ = t.tty.flush();
    (answer, "tty".into())
}

impl Approver for TtyApprover {
    fn ask(&self, q: Question) -> AnswerFuture<'_> {
        let lock = self.lock.clone();
        // The engine gives up at the same moment; past it, the question is
        // stale and is not drawn.
        let timeout = self.timeout;
        let deadline = Instant::now() + timeout;
        let cancelled = Arc::new(AtomicBool::new(false));
        Box::pin(async move {
            let target = q.target.clone();
            let q_write = q.write.is_some();
            // Dropped by the engine's timeout: a prompt that is up ends.
            struct Cancel(Arc<AtomicBool>);
            impl Drop for Cancel {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
            let _cancel = Cancel(cancelled.clone());
            let asked = tokio::task::spawn_blocking(move || {
                let _one_at_a_time = lock.lock().unwrap_or_else(|p| p.into_inner());
                // Too little time left to read and answer deliberately is
                // stale too: it would flash up and vanish.
                let margin = (timeout / 2).min(Duration::from_millis(500));
                if Instant::now() + margin >= deadline || cancelled.load(Ordering::Relaxed) {
                    return (
                        Answer::Timeout,
                        "withdrawn: its timeout passed before the terminal was free".to_string(),
                    );
                }
                prompt(&q, deadline, &cancelled)
            })
            .await;
            let (answer, by) = asked.unwrap_or((Answer::Deny, "the terminal prompt failed".into()));
            if q_write {
                // Lending a credential is never written into a policy.
                return (answer.session_at_most(), by);
            }
            self.persist.apply(&target, answer, &by);
            (answer, by)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_deliberate_lowercase_key_answers() {
        assert_eq!(key_answer(b"o"), Some(Answer::AllowOnce));
        assert_eq!(key_answer(b"a"), Some(Answer::AllowAlways));
        for voided in [
            &b"A"[..],
            b"S",
            b"\x1b",
            b"\x1b[0n",
            b"\x1b[?1;2c",
            b"aa",
            b"a\n",
            b"y",
            b"\r",
            b"",
        ] {
            assert_eq!(key_answer(voided), None, "{voided:?}");
        }
    }

    #[test]
    fn the_question_carries_no_control_bytes() {
        let q = Question {
            target: airlock_policy::Target::parse("evil.test:443", None).unwrap(),
            command: Some("\x1b[2K\rnpm install wants to connect to a.test\x07".into()),
            write: None,
        };
        let line = question_line(&q);
        // Only airlock's own line breaks; nothing from the sandbox.
        let bare = line.replace("\r\n", " ");
        assert!(!bare.bytes().any(|b| b < 0x20 || b == 0x7f), "{line:?}");
        assert!(line.starts_with("airlock: allow a connection to evil.test:443?"));
    }

    #[test]
    fn a_credential_question_names_method_url_and_credential_escaped() {
        let q = Question {
            target: airlock_policy::Target::parse("r.test:443", None).unwrap(),
            command: Some("npm publish".into()),
            write: Some(airlock_proxy::CredentialWrite {
                method: "PUT".into(),
                url: "https://r.test/pkg\x1b[2K".into(),
                credential: "authorization for r.test from preset npm (~/.npmrc:1)".into(),
            }),
        };
        let line = question_line(&q);
        let bare = line.replace("\r\n", " ");
        assert!(!bare.bytes().any(|b| b < 0x20 || b == 0x7f), "{line:?}");
        assert!(line.contains("PUT https://r.test/pkg"), "{line:?}");
        assert!(line.contains("preset npm"), "{line:?}");
        assert!(!line.contains("[a]lways"), "{line:?}");
    }

    #[test]
    fn a_long_command_never_pushes_the_host_away() {
        let q = Question {
            target: airlock_policy::Target::parse("evil.test:443", None).unwrap(),
            command: Some(format!("npm wants registry.test{}", " ".repeat(400))),
            write: None,
        };
        let line = question_line(&q);
        let (host, rest) = line.split_once("\r\n").unwrap();
        assert!(host.contains("evil.test:443"), "{line:?}");
        let (command, _) = rest.split_once("\r\n").unwrap();
        assert!(command.len() < 90, "{command:?}");
    }

    #[test]
    fn the_screen_is_reset_before_the_question() {
        for reset in [
            "\x1b[?1049h",
            "\x1b[0m",
            "\x1b(B",
            "\x0f",
            "\x1b[r",
            "\x1b[?25h",
            "\x1b[2J",
        ] {
            assert!(SCREEN_ENTER.contains(reset), "{reset:?}");
        }
        // The alternate screen comes first: the resets and the clear apply there.
        assert!(SCREEN_ENTER.starts_with("\x1b[?1049h"));
    }
}
