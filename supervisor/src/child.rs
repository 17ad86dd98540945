//! Asking a helper program (git) a question with a time limit: its
//! standard output, read as it comes (no polling: git answers in a few
//! milliseconds), or nothing when it does not answer in time (a config
//! that includes something endless must not hang the run).

use std::process::{Command, Stdio};
use std::time::Duration;

/// `cmd`'s standard output, with stdin and stderr closed; `None` when it
/// cannot start or does not finish within `limit` (it is killed then).
pub fn output_within(cmd: &mut Command, limit: Duration) -> Option<Vec<u8>> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(mut so) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut buf = vec![];
            let _ = std::io::Read::read_to_end(&mut so, &mut buf);
            let _ = tx.send(buf);
        });
    }
    let Ok(out) = rx.recv_timeout(limit) else {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    };
    let _ = child.wait();
    Some(out)
}
