//! Outside Linux there is no /proc to walk: only the foreground job is
//! suspended while the terminal asks (tty.rs), and the approval socket
//! relies on its peer's uid (socket.rs). Documented as a limitation.

pub fn watch(_anchor: u32) {}

pub fn contains(_pid: i32) -> bool {
    false
}

pub struct Stopped;

impl Stopped {
    pub fn count(&self) -> usize {
        0
    }
}

#[derive(Debug)]
pub struct NotStopped(pub String);

pub fn stop_all() -> Result<Stopped, NotStopped> {
    Ok(Stopped)
}
