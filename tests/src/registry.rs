//! Package registries on 127.0.0.1 over HTTPS (a test CA), for the preset
//! tests: each answers from a route function and records every request's
//! line and Authorization header, so a test can prove the proxy, not the
//! sandbox, supplied the credential.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

use crate::tls::TestPki;

/// What a route answers: status, content type, body.
pub type Reply = (u16, &'static str, Vec<u8>);
/// `(method, path, authorization) -> reply`.
pub type Routes = dyn Fn(&str, &str, Option<&str>) -> Reply + Send + Sync;

pub struct Registry {
    pub addr: SocketAddr,
    /// `METHOD PATH auth=<Authorization or ->` per request.
    pub seen: Arc<Mutex<Vec<String>>>,
}

impl Registry {
    pub fn start(pki: &TestPki, routes: Arc<Routes>) -> Registry {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(vec![]));
        let log = seen.clone();
        let config = pki.server_config();
        std::thread::spawn(move || {
            for tcp in listener.incoming().map_while(Result::ok) {
                let (config, routes, log) = (config.clone(), routes.clone(), log.clone());
                std::thread::spawn(move || {
                    let _ = tcp.set_read_timeout(Some(std::time::Duration::from_secs(20)));
                    let Ok(conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut tls = rustls::StreamOwned::new(conn, tcp);
                    serve(&mut tls, &*routes, &log);
                });
            }
        });
        Registry { addr, seen }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

fn serve<S: Read + Write>(stream: &mut S, routes: &Routes, log: &Mutex<Vec<String>>) {
    loop {
        let Some(head) = crate::read_head(stream) else {
            return;
        };
        let mut parts = head.lines().next().unwrap_or("").split(' ');
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let field = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        let auth = field("authorization");
        let len: usize = field("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len.min(1 << 20)];
        if stream.read_exact(&mut body).is_err() {
            return;
        }
        if let Ok(mut l) = log.lock() {
            l.push(format!(
                "{method} {path} auth={}",
                auth.as_deref().unwrap_or("-")
            ));
        }
        let (status, ctype, body) = routes(method, path, auth.as_deref());
        let reason = match status {
            200 => "OK",
            401 => "Unauthorized",
            404 => "Not Found",
            _ => "Other",
        };
        let mut resp = format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nContent-Type: {ctype}\r\n",
            body.len()
        );
        if status == 401 {
            resp.push_str("WWW-Authenticate: Basic realm=\"test\"\r\n");
        }
        resp.push_str("\r\n");
        if stream.write_all(resp.as_bytes()).is_err() || stream.write_all(&body).is_err() {
            return;
        }
    }
}

/// A gzipped tarball of `files` under `prefix/`, made with the host's tar.
pub fn tarball(dir: &std::path::Path, prefix: &str, files: &[(&str, &str)]) -> Vec<u8> {
    let root = dir.join("tarball-src");
    let _ = std::fs::remove_dir_all(&root);
    for (name, text) in files {
        let p = root.join(prefix).join(name);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
    }
    let out = dir.join("tarball.tgz");
    let ok = std::process::Command::new("tar")
        .arg("czf")
        .arg(&out)
        .arg("-C")
        .arg(&root)
        .arg(prefix)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "tar failed");
    std::fs::read(&out).expect("read tarball")
}

/// Lowercase hex SHA-1 of `bytes`, from the host's sha1sum.
pub fn sha1_hex(bytes: &[u8]) -> String {
    let mut child = std::process::Command::new("sha1sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha1sum");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(bytes)
        .expect("write");
    let out = child.wait_with_output().expect("sha1sum output");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}
