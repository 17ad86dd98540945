//! A real pseudo-terminal for the terminal tests: the command gets the
//! slave side as its controlling terminal, the test types into the master
//! side and reads every byte written to the screen.

use std::io::Read;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Everything written to the terminal so far, as raw bytes.
#[derive(Clone, Default)]
pub struct Screen(Arc<Mutex<Vec<u8>>>);

impl Screen {
    pub fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    pub fn count(&self, text: &str) -> usize {
        self.text().matches(text).count()
    }

    /// Wait up to 10 s for `text` to appear.
    pub fn wait_for(&self, text: &str) -> bool {
        self.wait_for_n(text, 1)
    }

    /// Wait up to 10 s for `text` to appear `n` times.
    pub fn wait_for_n(&self, text: &str, n: usize) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.count(text) >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }
}

/// Run `cmd` on a fresh 24x80 pty as its controlling terminal; returns
/// the child, the master side, and the screen as it fills.
pub fn on_pty(mut cmd: Command) -> (Child, std::fs::File, Screen) {
    let (mut master, mut slave) = (0, 0);
    let size = libc::winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty fills two descriptors.
    assert_eq!(
        unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                &size,
            )
        },
        0
    );
    cmd.env("TERM", "xterm");
    // SAFETY: the slave descriptor is valid; the dups hand it to the child.
    unsafe {
        use std::os::fd::FromRawFd;
        use std::os::unix::process::CommandExt;
        cmd.stdin(std::process::Stdio::from_raw_fd(libc::dup(slave)))
            .stdout(std::process::Stdio::from_raw_fd(libc::dup(slave)))
            .stderr(std::process::Stdio::from_raw_fd(libc::dup(slave)))
            .pre_exec(|| {
                libc::setsid();
                libc::ioctl(0, libc::TIOCSCTTY, 0);
                Ok(())
            });
    }
    let child = cmd.spawn().expect("spawn on the pty");
    // SAFETY: closing our copy of the slave; taking ownership of the master.
    unsafe { libc::close(slave) };
    let master: std::fs::File = unsafe { std::os::fd::FromRawFd::from_raw_fd(master) };
    let screen = Screen::default();
    let sink = screen.0.clone();
    let mut reader = master.try_clone().expect("pty master");
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(&buf[..n]);
        }
    });
    (child, master, screen)
}
