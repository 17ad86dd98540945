//! squid as a reference proxy for the benchmarks, when it is installed
//! (Debian: `apt-get install squid`). It runs in the foreground on a free
//! loopback port with a generated minimal configuration: CONNECT allowed
//! to the given ports only, no cache, no access log, and its one log file
//! in its own temporary directory, never in a system directory.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const BINARIES: [&str; 3] = ["/usr/sbin/squid", "/usr/bin/squid", "/usr/local/sbin/squid"];

pub struct Squid {
    child: Child,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Squid {
    /// `None` when squid is not installed or did not start (why goes to stderr).
    pub fn start(connect_ports: &[u16]) -> Option<Squid> {
        let bin = BINARIES.into_iter().find(|p| Path::new(p).exists())?;
        let dir = tempfile::tempdir().ok()?;
        // squid started as root drops to its own user before it opens
        // its log, so that user must be able to write here.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).ok()?;
        let port = TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let ports: Vec<String> = connect_ports.iter().map(u16::to_string).collect();
        let d = dir.path().display();
        let conf = format!(
            "http_port 127.0.0.1:{port}\n\
             pid_filename none\n\
             cache deny all\n\
             cache_mem 0 MB\n\
             access_log none\n\
             cache_store_log none\n\
             cache_log {d}/cache.log\n\
             coredump_dir {d}\n\
             netdb_filename none\n\
             pinger_enable off\n\
             shutdown_lifetime 0 seconds\n\
             acl bench_ports port {}\n\
             acl bench_connect method CONNECT\n\
             http_access allow bench_connect bench_ports\n\
             http_access deny all\n",
            ports.join(" ")
        );
        let path = dir.path().join("squid.conf");
        std::fs::write(&path, conf).ok()?;
        let mut child = Command::new(bin)
            .arg("-N")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().ok()?;
        for _ in 0..250 {
            if TcpStream::connect(addr).is_ok() {
                return Some(Squid {
                    child,
                    addr,
                    _dir: dir,
                });
            }
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = std::fs::read_to_string(dir.path().join("cache.log")).unwrap_or_default();
        eprintln!("squid did not start: {}", log.lines().last().unwrap_or(""));
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Squid {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
