//! `--ask tty` (SPEC §5.2): the question goes to /dev/tty. While it asks,
//! the sandbox's foreground job is moved off the terminal and given back
//! afterwards, as a shell does with job control, so the sandboxed
//! program's own terminal reads don't swallow the answer.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
/// group in the foreground, raw single-key input, all restored on drop.
struct Borrowed {
    tty: File,
    saved_pgrp: libc::pid_t,
    saved_termios: libc::termios,
    old_ttou: libc::sighandler_t,
}

impl Borrowed {
    fn take() -> std::io::Result<Borrowed> {
        let tty = OpenOptions::new().read(true).write(true).open("/dev/tty")?;
        let fd = tty.as_raw_fd();
        // SAFETY: terminal ioctls and signals on a descriptor and a process
        // group we own; SIGTTOU ignored so a background group may change the
        // foreground.
        unsafe {
            let old_ttou = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            let saved_pgrp = libc::tcgetpgrp(fd);
            if saved_pgrp > 0 && saved_pgrp != libc::getpgrp() {
                // Suspend the job as a shell does on ^Z: full-screen programs
                // restore the terminal on SIGTSTP; SIGSTOP catches the ones
                // that ignore it. A stopped reader can't take our key.
                libc::kill(-saved_pgrp, libc::SIGTSTP);
                std::thread::sleep(std::time::Duration::from_millis(30));
                libc::kill(-saved_pgrp, libc::SIGSTOP);
            }
            libc::tcsetpgrp(fd, libc::getpgrp());
            let mut saved_termios: libc::termios = std::mem::zeroed();
            libc::tcgetattr(fd, &mut saved_termios);
            let mut raw = saved_termios;
            // No ISIG: ^C at the prompt is read as a key (deny), not a
            // signal that would take airlock down.
            raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
            raw.c_cc[libc::VMIN] = 1;
            raw.c_cc[libc::VTIME] = 0;
            libc::tcsetattr(fd, libc::TCSANOW, &raw);
            Ok(Borrowed {
                tty,
                saved_pgrp,
                saved_termios,
                old_ttou,
            })
        }
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        let fd = self.tty.as_raw_fd();
        // SAFETY: restoring exactly what `take` saved.
        unsafe {
            libc::tcsetattr(fd, libc::TCSANOW, &self.saved_termios);
            if self.saved_pgrp > 0 {
                libc::tcsetpgrp(fd, self.saved_pgrp);
                if self.saved_pgrp != libc::getpgrp() {
                    // Resume the job; full-screen programs redraw on SIGCONT.
                    libc::kill(-self.saved_pgrp, libc::SIGCONT);
                }
            }
            libc::signal(libc::SIGTTOU, self.old_ttou);
        }
    }
}

fn prompt(q: &Question, timeout: Duration) -> (Answer, String) {
    let mut t = match Borrowed::take() {
        Ok(t) => t,
        Err(e) => return (Answer::Deny, format!("no terminal to ask on: {e}")),
    };
    let who = q.command.as_deref().unwrap_or("a sandboxed command");
    let _ = write!(
        t.tty,
        "\r\nairlock: {who} wants to connect to {}. Allow? [o]nce [s]ession [a]lways [d]eny: ",
        q.target
    );
    let deadline = Instant::now() + timeout;
    let answer = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Answer::Timeout;
        }
        let mut pfd = libc::pollfd {
            fd: t.tty.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready =
            unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if ready <= 0 {
            continue;
        }
        let mut key = [0u8; 1];
        match t.tty.read(&mut key) {
            Ok(1) => match key[0].to_ascii_lowercase() {
                b'o' => break Answer::AllowOnce,
                b's' => break Answer::AllowSession,
                b'a' => break Answer::AllowAlways,
                b'd' | b'n' | 3 | 4 => break Answer::Deny,
                _ => {}
            },
            _ => break Answer::Deny,
        }
    };
    let _ = write!(t.tty, "{}\r\n", answer.as_str());
    (answer, "tty".into())
}

impl Approver for TtyApprover {
    fn ask(&self, q: Question) -> AnswerFuture<'_> {
        let lock = self.lock.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let target = q.target.clone();
            let asked = tokio::task::spawn_blocking(move || {
                let _one_at_a_time = lock.lock().unwrap_or_else(|p| p.into_inner());
                prompt(&q, timeout)
            })
            .await;
            let (answer, by) = asked.unwrap_or((Answer::Deny, "the terminal prompt failed".into()));
            self.persist.apply(&target, answer, &by);
            (answer, by)
        })
    }
}
