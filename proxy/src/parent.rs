//! A parent (upstream) HTTP proxy, as corporate networks require (SPEC
//! §5.4, `--upstream-proxy`): every upstream connection the engine has
//! decided and checked is opened as a CONNECT tunnel through it. The
//! decision stays airlock's: the parent is asked for the address airlock
//! resolved and checked (`CONNECT 203.0.113.7:443`), never for a name it
//! would resolve again, so an answer the parent gets differently (DNS
//! rebinding) cannot lead a tunnel to a private address. TLS still names
//! the host (SNI) for parents that look.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest response head accepted from the parent.
const MAX_HEAD: usize = 16 * 1024;

#[derive(Clone)]
pub struct UpstreamProxy {
    /// `host:port` of the parent.
    addr: String,
    /// `Basic ...`, from the URL's user information.
    auth: Option<String>,
}

impl std::fmt::Debug for UpstreamProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        write!(
            f,
            "UpstreamProxy({}{})",
            self.addr,
            if self.auth.is_some() {
                ", with credentials"
            } else {
                ""
            }
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ParentError {
    #[error("--upstream-proxy {0:?}: {1}")]
    Url(String, String),
}

impl UpstreamProxy {
    /// `http://[user:password@]host:port[/]`. Only plain http: the tunnel
    /// to the parent carries TLS end to end already, and a parent reached
    /// over TLS is not supported (said, not ignored).
    pub fn parse(url: &str) -> Result<UpstreamProxy, ParentError> {
        let bad = |why: &str| ParentError::Url(url.to_string(), why.to_string());
        let rest = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some((scheme, _)) => {
                return Err(bad(&format!(
                    "the scheme {scheme}:// is not supported; give the parent as http://host:port"
                )))
            }
            None => url,
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#']) {
            return Err(bad("give the parent as http://host:port, with no path"));
        }
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        let port_ok = hostport
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p != 0));
        if !port_ok {
            return Err(bad(
                "the parent needs a host and a port (http://proxy.corp:3128)",
            ));
        }
        let auth = userinfo.map(|u| {
            let decoded = percent_encoding::percent_decode_str(u).decode_utf8_lossy();
            let (user, pass) = decoded.split_once(':').unwrap_or((&decoded, ""));
            airlock_policy::preset::basic(user, pass)
        });
        Ok(UpstreamProxy {
            addr: hostport.to_string(),
            auth,
        })
    }

    /// The parent's address as given, for messages.
    pub fn shown(&self) -> &str {
        &self.addr
    }

    /// A tunnel to `to` through the parent, ready for the client's bytes.
    pub async fn connect(&self, to: SocketAddr, limit: Duration) -> Result<TcpStream, String> {
        tokio::time::timeout(limit, self.open(to))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "the upstream proxy {} did not open a tunnel to {to} within {limit:?}",
                    self.addr
                ))
            })
    }

    async fn open(&self, to: SocketAddr) -> Result<TcpStream, String> {
        let mut s = TcpStream::connect(&self.addr)
            .await
            .map_err(|e| format!("connecting to the upstream proxy {} failed: {e}", self.addr))?;
        let _ = s.set_nodelay(true);
        let mut head = format!("CONNECT {to} HTTP/1.1\r\nHost: {to}\r\n");
        if let Some(a) = &self.auth {
            head.push_str(&format!("Proxy-Authorization: {a}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())
            .await
            .map_err(|e| format!("writing to the upstream proxy {} failed: {e}", self.addr))?;
        // Byte by byte up to the blank line: whatever follows is the
        // origin's, and must reach the client untouched.
        let mut got = Vec::with_capacity(256);
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            if got.len() >= MAX_HEAD {
                return Err(format!(
                    "the upstream proxy {} sent an over-long answer",
                    self.addr
                ));
            }
            match s.read(&mut byte).await {
                Ok(0) => {
                    return Err(format!(
                        "the upstream proxy {} closed the connection before answering CONNECT {to}",
                        self.addr
                    ))
                }
                Ok(_) => got.push(byte[0]),
                Err(e) => {
                    return Err(format!(
                        "reading from the upstream proxy {} failed: {e}",
                        self.addr
                    ))
                }
            }
        }
        let line = String::from_utf8_lossy(got.split(|b| *b == b'\n').next().unwrap_or(&[]))
            .trim()
            .to_string();
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok());
        match status {
            Some(200..=299) => Ok(s),
            Some(407) => Err(format!(
                "the upstream proxy {} wants credentials ({}): give them in the URL, http://user:password@host:port",
                self.addr,
                crate::escape::line(&line, 120)
            )),
            _ => Err(format!(
                "the upstream proxy {} refused CONNECT {to}: {}",
                self.addr,
                crate::escape::line(&line, 120)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let p = UpstreamProxy::parse("http://proxy.corp:3128/").unwrap();
        assert_eq!(p.shown(), "proxy.corp:3128");
        assert!(p.auth.is_none());
        let p = UpstreamProxy::parse("http://me:p%40ss@10.0.0.1:8080").unwrap();
        assert_eq!(
            p.auth.as_deref(),
            Some(airlock_policy::preset::basic("me", "p@ss").as_str())
        );
        assert!(!format!("{p:?}").contains("ss"));
        for bad in [
            "https://p:1",
            "http://p",
            "http://p:0",
            "http://p:1/x",
            "socks5://p:1",
        ] {
            assert!(UpstreamProxy::parse(bad).is_err(), "{bad}");
        }
    }
}
