//! A git smart-HTTP server on 127.0.0.1 over HTTPS (a test CA), for the
//! review tests: each request runs `git http-backend` as CGI on bare
//! repositories under `root`, and only a request carrying exactly the
//! expected `Authorization` is served (401 otherwise), so a push that
//! arrives proves the credential came with it. Every request is recorded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::tls::TestPki;

pub struct GitServer {
    pub addr: SocketAddr,
    pub root: PathBuf,
    /// `METHOD PATH auth=<ok|missing|wrong>` per request.
    pub seen: Arc<Mutex<Vec<String>>>,
}

impl GitServer {
    pub fn start(pki: &TestPki, root: &Path, authorization: &str) -> GitServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(vec![]));
        let (log, config) = (seen.clone(), pki.server_config());
        let (root_, auth) = (root.to_path_buf(), authorization.to_string());
        std::thread::spawn(move || {
            for tcp in listener.incoming().map_while(Result::ok) {
                let (config, log, root, auth) =
                    (config.clone(), log.clone(), root_.clone(), auth.clone());
                std::thread::spawn(move || {
                    let _ = tcp.set_read_timeout(Some(std::time::Duration::from_secs(30)));
                    let Ok(conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut tls = rustls::StreamOwned::new(conn, tcp);
                    serve(&mut tls, &root, &auth, &log);
                });
            }
        });
        GitServer {
            addr,
            root: root.to_path_buf(),
            seen,
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

fn read_body<S: Read>(stream: &mut S, head: &str) -> Option<Vec<u8>> {
    let field = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    if field("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        let mut out = vec![];
        loop {
            let mut line = vec![];
            let mut b = [0u8; 1];
            while !line.ends_with(b"\r\n") {
                stream.read_exact(&mut b).ok()?;
                line.push(b[0]);
            }
            let text = String::from_utf8_lossy(&line);
            let size = usize::from_str_radix(text.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0u8; size + 2];
            stream.read_exact(&mut chunk).ok()?;
            if size == 0 {
                return Some(out);
            }
            out.extend_from_slice(&chunk[..size]);
        }
    }
    let len: usize = field("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).ok()?;
    Some(body)
}

fn serve<S: Read + Write>(stream: &mut S, root: &Path, auth: &str, log: &Mutex<Vec<String>>) {
    loop {
        let Some(head) = crate::read_head(stream) else {
            return;
        };
        let mut parts = head.lines().next().unwrap_or("").split(' ');
        let (method, target) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let field = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        let Some(body) = read_body(stream, &head) else {
            return;
        };
        let given = field("authorization");
        let verdict = match &given {
            Some(a) if a == auth => "ok",
            Some(_) => "wrong",
            None => "missing",
        };
        if let Ok(mut l) = log.lock() {
            l.push(format!("{method} {target} auth={verdict}"));
        }
        let (status, headers, out) = if verdict != "ok" {
            (
                "401 Unauthorized".to_string(),
                vec![(
                    "WWW-Authenticate".to_string(),
                    "Basic realm=\"git\"".to_string(),
                )],
                b"credentials wanted\n".to_vec(),
            )
        } else {
            cgi(root, &method, &target, &field, &body)
        };
        let mut resp = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", out.len());
        for (k, v) in headers {
            resp.push_str(&format!("{k}: {v}\r\n"));
        }
        resp.push_str("\r\n");
        if stream.write_all(resp.as_bytes()).is_err() || stream.write_all(&out).is_err() {
            return;
        }
        let _ = stream.flush();
    }
}

type Headers = Vec<(String, String)>;

/// `git http-backend` for one request: its status, headers and body.
fn cgi(
    root: &Path,
    method: &str,
    target: &str,
    field: &dyn Fn(&str) -> Option<String>,
    body: &[u8],
) -> (String, Headers, Vec<u8>) {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut c = std::process::Command::new("git");
    c.arg("http-backend")
        .env_clear()
        .env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
        )
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", root)
        // receive-pack is served only to an authenticated user.
        .env("REMOTE_USER", "tester")
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("REQUEST_METHOD", method)
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("CONTENT_LENGTH", body.len().to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    if let Some(t) = field("content-type") {
        c.env("CONTENT_TYPE", t);
    }
    if let Some(p) = field("git-protocol") {
        c.env("GIT_PROTOCOL", p);
    }
    if let Some(e) = field("content-encoding") {
        c.env("HTTP_CONTENT_ENCODING", e);
    }
    let Ok(mut child) = c.spawn() else {
        return ("500 Internal".into(), vec![], b"no git\n".to_vec());
    };
    let mut stdin = child.stdin.take().expect("stdin");
    let input = body.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child
        .wait_with_output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    let _ = writer.join();
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let Some((at, skip)) = split else {
        return ("500 Internal".into(), vec![], out);
    };
    let mut status = "200 OK".to_string();
    let mut headers = vec![];
    for line in String::from_utf8_lossy(&out[..at]).lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        if k.eq_ignore_ascii_case("status") {
            status = v.trim().to_string();
        } else {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    (status, headers, out[at + skip..].to_vec())
}
