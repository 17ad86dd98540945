//! Secrets inside tool configuration: `user:password@` in URLs, and the
//! encodings the proxy needs to add them back (HTTP Basic).

use super::PresetCredential;

/// For an http(s) URL: the URL without `user:password@`, and when there
/// was one, the Basic credential for its host. `None` when `url` is not an
/// http(s) URL (passed on as it is).
pub fn strip_url_secret(url: &str) -> Option<(String, Option<PresetCredential>)> {
    let trimmed = url.trim();
    // cargo's `sparse+` prefix survives the rewrite.
    let (prefix, raw) = match trimmed.strip_prefix("sparse+") {
        Some(rest) => ("sparse+", rest),
        None => ("", trimmed),
    };
    let mut u = url::Url::parse(raw).ok()?;
    if !matches!(u.scheme(), "http" | "https") {
        return None;
    }
    if u.username().is_empty() && u.password().is_none() {
        return Some((trimmed.to_string(), None));
    }
    let user = percent_decode(u.username());
    let pass = u.password().map(percent_decode).unwrap_or_default();
    let host = super::url_host(raw)?;
    // Neither can fail on an http(s) URL with a host.
    let _ = u.set_username("");
    let _ = u.set_password(None);
    let cred = PresetCredential {
        host,
        header: "Authorization".into(),
        value: basic(&user, &pass),
        from: String::new(),
    };
    Some((format!("{prefix}{u}"), Some(cred)))
}

/// A userinfo (`user:password@`, or a bare `user@` on http(s), where it
/// is a token) found in `text` by `scrub_urls`.
pub struct UrlSecret<'a> {
    /// The URL as written, with its secret.
    pub url: &'a str,
    /// The Basic credential for its host when it is an http(s) URL.
    pub credential: Option<PresetCredential>,
}

/// `text` with the userinfo removed from every `scheme://user:password@`
/// in it, whatever the scheme (`http`, `https`, `socks5`, cargo's
/// `sparse+`/`git+` prefixes), and from a bare `user@` on http(s); each
/// removal is passed to `found`. Returns the clean text and whether
/// anything was removed. A `user@` without a password on another scheme
/// (`ssh://git@host`) names an account, not a secret, and is kept.
pub fn scrub_urls(text: &str, mut found: impl FnMut(UrlSecret<'_>)) -> (String, bool) {
    let mut out = String::with_capacity(text.len());
    let mut any = false;
    let mut rest = text;
    while let Some(sep) = rest.find("://") {
        // The scheme: the run of scheme characters before `://`.
        let start = rest[..sep]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        let tail = &rest[start..];
        // Userinfo may hold `,` `;` `?` `#` unencoded in a careless config:
        // only whitespace, quotes and the path's `/` end it, so a secret is
        // never cut in two (removing too much is the safe mistake).
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\''))
            .unwrap_or(tail.len());
        let url = &tail[..end];
        let auth_at = sep - start + 3;
        let authority_end = url[auth_at..].find('/').map_or(url.len(), |i| auth_at + i);
        let scheme = tail[..sep - start].to_ascii_lowercase();
        let web = matches!(scheme.rsplit('+').next(), Some("http" | "https"));
        out.push_str(&rest[..start]);
        match url[auth_at..authority_end].rfind('@') {
            Some(at) if web || url[auth_at..auth_at + at].contains(':') => {
                any = true;
                let credential = if web {
                    strip_url_secret(url).and_then(|(_, c)| c)
                } else {
                    None
                };
                found(UrlSecret { url, credential });
                // Schemes are case-insensitive; written as tools expect.
                out.push_str(&scheme);
                out.push_str("://");
                out.push_str(&url[auth_at + at + 1..authority_end]);
            }
            _ => out.push_str(&url[..authority_end]),
        }
        // Go on after the authority: a list of URLs in one word
        // (`a,b`) has each cleaned.
        rest = &rest[start + authority_end..];
    }
    out.push_str(rest);
    (out, any)
}

/// A libcurl-style proxy without a scheme (`user:password@host:port`, as
/// cargo's `http.proxy` takes it) without its userinfo; `None` when it has
/// none.
pub fn strip_bare_userinfo(value: &str) -> Option<String> {
    if value.contains("://") {
        return None;
    }
    let authority = value.split(['/', '?', '#']).next().unwrap_or(value);
    let at = authority.rfind('@')?;
    Some(value[at + 1..].to_string())
}

/// `Basic base64(user:pass)`.
pub fn basic(user: &str, pass: &str) -> String {
    format!("Basic {}", base64(format!("{user}:{pass}").as_bytes()))
}

pub fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim().trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        acc = acc << 6 | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits & 0xff) as u8);
        }
    }
    Some(out)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%')
            .then(|| s.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_user_and_password() {
        let (url, cred) = strip_url_secret("https://me:p%40ss@pypi.corp.test:8443/simple").unwrap();
        assert_eq!(url, "https://pypi.corp.test:8443/simple");
        let cred = cred.unwrap();
        assert_eq!(cred.host, "pypi.corp.test:8443");
        assert_eq!(cred.value, basic("me", "p@ss"));
        assert_eq!(cred.value, "Basic bWU6cEBzcw==");
        let (url, cred) = strip_url_secret("sparse+https://tok@cargo.corp.test/index/").unwrap();
        assert_eq!(url, "sparse+https://cargo.corp.test/index/");
        assert_eq!(cred.unwrap().value, basic("tok", ""));
        assert_eq!(
            strip_url_secret("https://plain.test/x"),
            Some(("https://plain.test/x".into(), None))
        );
        assert!(strip_url_secret("/etc/ssl/cert.pem").is_none());
    }

    #[test]
    fn scrub_urls_removes_every_password() {
        let clean = |t: &str| scrub_urls(t, |_| {}).0;
        assert_eq!(clean("a https://u:p@h.test/x b"), "a https://h.test/x b");
        assert_eq!(clean("socks5://u:p@h.test:1080"), "socks5://h.test:1080");
        assert_eq!(clean("ssh://git@h.test/r"), "ssh://git@h.test/r");
        assert_eq!(clean("HTTPS://tok@h.test/"), "https://h.test/");
        assert_eq!(
            clean("sparse+https://u:p@h.test/i/"),
            "sparse+https://h.test/i/"
        );
        // Unencoded delimiters in the password never cut it in two.
        assert_eq!(clean("https://u:p,w;x?y#z@h.test/"), "https://h.test/");
        assert_eq!(
            clean("https://a:b@x.test/,https://c:d@y.test/"),
            "https://x.test/,https://y.test/"
        );
        assert_eq!(clean("no url here"), "no url here");
        let mut hosts = vec![];
        scrub_urls("https://me:pw@h.test/ socks5://u:p@s.test", |s| {
            hosts.push(s.credential.map(|c| c.host));
        });
        assert_eq!(hosts, [Some("h.test".to_string()), None]);
        assert_eq!(
            strip_bare_userinfo("u:p@h.test:3128").as_deref(),
            Some("h.test:3128")
        );
        assert_eq!(strip_bare_userinfo("h.test:3128"), None);
    }

    #[test]
    fn base64_round_trips() {
        for s in ["", "a", "ab", "abc", "abcd", "user:pass"] {
            assert_eq!(base64_decode(&base64(s.as_bytes())).unwrap(), s.as_bytes());
        }
        assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
    }
}
