//! Which sandboxed process opened a proxy connection (SPEC §6 `command`):
//! the peer's port leads to a socket inode in the sandbox's network
//! namespace, and the inode to the process holding it.

use std::net::SocketAddr;
use std::path::PathBuf;

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
        let want = format!("socket:[{inode}]");
        let netns = std::fs::read_link(format!("/proc/{}/ns/net", self.anchor)).ok()?;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            if std::fs::read_link(format!("/proc/{name}/ns/net")).ok() != Some(netns.clone()) {
                continue;
            }
            let Ok(fds) = std::fs::read_dir(PathBuf::from(format!("/proc/{name}/fd"))) else {
                continue;
            };
            let holds = fds.flatten().any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str())
            });
            if holds {
                return Some(Client {
                    pid: inner_pid(&name)?,
                    argv: read_argv(&name),
                });
            }
        }
        None
    }
}
