//! Which sandboxed process opened a proxy connection (SPEC §6 `command`):
//! the peer's port leads to a socket inode in the sandbox's network
//! namespace, and the inode to the process holding it.

use std::net::SocketAddr;

use airlock_proxy::{Client, ClientIdentity};

pub struct SandboxProcesses {
    /// A process inside the sandbox's network namespace (the helper).
    pub anchor: u32,
}

fn socket_inode(anchor: u32, port: u16) -> Option<String> {
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{anchor}/net/{table}")).ok()?;
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let local_port = cols
                .get(1)?
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) {
                return cols.get(9).map(|s| s.to_string());
            }
        }
    }
    None
}

fn read_argv(pid: &str) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The pid as the sandbox sees it (the last NSpid entry).
fn inner_pid(pid: &str) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last()?.parse().ok())
}

impl ClientIdentity for SandboxProcesses {
    fn identify(&self, peer: SocketAddr) -> Option<Client> {
        let inode = socket_inode(self.anchor, peer.port())?;
        let netns = std::fs::read_link(format!("/proc/{}/ns/net", self.anchor)).ok()?;
        for pid in crate::procfs::pids() {
            if std::fs::read_link(format!("/proc/{pid}/ns/net")).ok() != Some(netns.clone()) {
                continue;
            }
            if crate::procfs::holds_socket(pid, &inode) {
                let name = pid.to_string();
                return Some(Client {
                    pid: inner_pid(&name)?,
                    argv: read_argv(&name),
                });
            }
        }
        None
    }
}
