//! Per-request rules and credentials for inspected hosts (SPEC §5.3).

use crate::pattern::Pattern;
use crate::source::Located;

/// `METHOD /path/glob`: `*` is one path segment, `**` any number of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestAllow {
    pub method: String,
    pub segments: Vec<String>,
    pub text: String,
}

impl RequestAllow {
    pub fn parse(text: &str) -> Result<RequestAllow, String> {
        let (method, path) = text
            .trim()
            .split_once(' ')
            .ok_or_else(|| format!("request rule {text:?} must be \"METHOD /path\""))?;
        let method = method.trim();
        if method != "*" && !method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "request rule {text:?}: method must be uppercase or *"
            ));
        }
        let path = path.trim();
        if !path.starts_with('/') {
            return Err(format!("request rule {text:?}: path must start with /"));
        }
        Ok(RequestAllow {
            method: method.to_string(),
            segments: split_path(path).map(str::to_string).collect(),
            text: text.trim().to_string(),
        })
    }

    /// Match a request; `path` must already be `normalize_path`'s output.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        if self.method != "*" && self.method != method {
            return false;
        }
        let path = path.split(['?', '#']).next().unwrap_or("");
        let segs: Vec<&str> = split_path(path).collect();
        glob(&self.segments, &segs)
    }
}

/// The request target's path in the one form an origin cannot read any
/// other way (SPEC §5.3), or why it was refused. Percent-encoded
/// unreserved characters are decoded (RFC 3986 §6.2.2.2: `%2e` is `.`),
/// then dot segments are resolved and empty segments dropped. What would
/// still be ambiguous is refused: encoded slashes and backslashes (some
/// origins split on them, some don't), backslashes, NUL, double encoding
/// (`%252e`, decoded twice by some stacks), malformed escapes, `#`, and
/// `..` above the root. The query is kept as it was. The proxy forwards
/// this form, so the path matched is the path the origin gets.
pub fn normalize_path(path_and_query: &str) -> Result<String, String> {
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    if !path.starts_with('/') {
        return Err(format!("the path {path:?} does not start with /"));
    }
    if path.contains('#') {
        return Err("the path holds a fragment (#)".into());
    }
    if path.contains('\\') {
        return Err("the path holds a backslash, which some origins read as /".into());
    }
    let bytes = path.as_bytes();
    // Every escape decoded, to check the path is UTF-8 as an origin that
    // decodes everything would see it: overlong forms (%C0%AE is `.` to a
    // lax decoder) and other invalid sequences are refused.
    let mut every: Vec<u8> = Vec::with_capacity(path.len());
    let mut decoded = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            decoded.push(bytes[i] as char);
            every.push(bytes[i]);
            i += 1;
            continue;
        }
        let hex = path
            .get(i + 1..i + 3)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        let Some(hex) = hex else {
            return Err("the path holds a malformed %-escape".into());
        };
        let byte = u8::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
        every.push(byte);
        match byte {
            b'/' | b'\\' => {
                return Err(format!(
                    "the path holds an encoded {} (%{hex}), which some origins read as a separator",
                    byte as char
                ))
            }
            0 => return Err("the path holds an encoded NUL (%00)".into()),
            b'%' if path
                .get(i + 3..i + 5)
                .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit())) =>
            {
                return Err(
                    "the path is encoded twice (%25XX), which some origins decode twice".into(),
                )
            }
            b if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') => {
                decoded.push(b as char)
            }
            // Everything else keeps its escape, in upper case (RFC 3986 §6.2.2.1).
            _ => decoded.push_str(&format!("%{}", hex.to_ascii_uppercase())),
        }
        i += 3;
    }
    if std::str::from_utf8(&every).is_err() {
        return Err("the path holds invalid or overlong UTF-8 escapes".into());
    }
    let raw: Vec<&str> = decoded.split('/').skip(1).collect();
    for seg in &raw {
        // `..;x` is `..` to servers that drop path parameters (Tomcat and
        // its kin) and a plain name to this matcher: ambiguous, refused.
        let upper = seg.to_ascii_uppercase();
        let cut = [seg.find(';'), upper.find("%3B")]
            .into_iter()
            .flatten()
            .min();
        if let Some(cut) = cut {
            if matches!(&seg[..cut], "." | "..") {
                return Err(format!(
                    "the path segment {seg:?} is a dot segment with parameters, which some origins resolve as {:?}",
                    &seg[..cut]
                ));
            }
        }
    }
    let mut out: Vec<&str> = vec![];
    for seg in &raw {
        match *seg {
            "" | "." => {}
            ".." => {
                if out.pop().is_none() {
                    return Err("the path climbs above the root (..)".into());
                }
            }
            s => out.push(s),
        }
    }
    let mut norm = format!("/{}", out.join("/"));
    // A directory stays a directory: `/a/b/` and `/a/b/..` keep their slash.
    if !out.is_empty() && matches!(raw.last(), Some(&"" | &"." | &"..")) {
        norm.push('/');
    }
    if let Some(q) = query {
        norm.push('?');
        norm.push_str(q);
    }
    Ok(norm)
}

fn split_path(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|s| !s.is_empty())
}

fn glob(pat: &[String], segs: &[&str]) -> bool {
    match pat.split_first() {
        None => segs.is_empty(),
        Some((p, rest)) if p == "**" => (0..=segs.len()).any(|i| glob(rest, &segs[i..])),
        Some((p, rest)) => match segs.split_first() {
            Some((s, srest)) => (p == "*" || p == s) && glob(rest, srest),
            None => false,
        },
    }
}

#[derive(Debug, Clone)]
pub struct RequestRule {
    pub host: Pattern,
    pub allow: Vec<RequestAllow>,
    pub origin: Located<()>,
}

/// `[[network.hold]]` (SPEC §4.8): in a review run, a request to `host`
/// that one of `requests` names is kept in the changeset instead of sent,
/// until `airlock changes apply`. Outside a review run it does nothing.
#[derive(Debug, Clone)]
pub struct HoldRule {
    pub host: Pattern,
    pub requests: Vec<RequestAllow>,
    pub origin: Located<()>,
}

impl HoldRule {
    /// Whether the rule names this request; `path` must be
    /// `normalize_path`'s output.
    pub fn holds(&self, method: &str, path: &str) -> bool {
        self.requests.iter().any(|r| r.matches(method, path))
    }
}

/// A header the proxy sets on the way out; `value` may hold
/// `${env:NAME}`, read from the supervisor's environment.
#[derive(Clone)]
pub struct Credential {
    pub host: Pattern,
    pub header: String,
    pub value: String,
    pub origin: Located<()>,
    /// What it is lent to beyond reads (SPEC §3.4: `methods`). Empty for a
    /// credential a preset discovered, and for a `[[network.credential]]`
    /// that lists none: a credential reads, it does not publish, unless the
    /// person who wrote the entry said so.
    pub methods: Vec<RequestAllow>,
}

/// Requests every credential is lent to: reads. GET and HEAD, and the
/// POSTs that the tools airlock has presets for send to read (git's
/// smart-HTTP fetch, the advisory lookup `npm install` runs after every
/// install). Everything else would act with someone's identity: publish,
/// unpublish, token creation, `git push` (`git-receive-pack`), uploads.
const READS: &[&str] = &[
    "GET /**",
    "HEAD /**",
    "POST /**/git-upload-pack",
    "POST /-/npm/v1/security/advisories/bulk",
    "POST /-/npm/v1/security/audits/quick",
    "POST /-/npm/v1/security/audits",
];

/// Whether a request is a read that any credential is lent to; `path`
/// must be `normalize_path`'s output.
pub fn is_read(method: &str, path: &str) -> bool {
    READS.iter().any(|r| {
        RequestAllow::parse(r)
            .map(|r| r.matches(method, path))
            .unwrap_or(false)
    })
}

impl Credential {
    /// Whether the proxy may set this credential on the request without
    /// asking: a read, or a method the entry lends it to. `path` must be
    /// `normalize_path`'s output.
    pub fn lends(&self, method: &str, path: &str) -> bool {
        is_read(method, path) || self.methods.iter().any(|m| m.matches(method, path))
    }
}

/// One `methods` entry: a method (`PUT`, or `*` for every method) on any
/// path, or a `METHOD /path/glob` as in request rules.
pub fn parse_lent_method(text: &str) -> Result<RequestAllow, String> {
    let t = text.trim();
    if t.contains(' ') {
        return RequestAllow::parse(t).map_err(|e| format!("methods: {e}"));
    }
    if t.is_empty() || (t != "*" && !t.bytes().all(|b| b.is_ascii_uppercase())) {
        return Err(format!(
            "methods: {text:?} must be an uppercase method (PUT), * or \"METHOD /path\""
        ));
    }
    RequestAllow::parse(&format!("{t} /**"))
}

/// The value is a secret (a preset's credential holds the token itself):
/// never printed.
impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("host", &self.host.text)
            .field("header", &self.header)
            .field("value", &"<hidden>")
            .field("origin", &self.origin.origin)
            .field(
                "methods",
                &self.methods.iter().map(|m| &m.text).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Expand `${env:NAME}` references. Unknown variables are an error: a
/// credential that silently became empty would fail confusingly upstream.
pub fn expand_env(
    template: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed ${{ in {template:?}"))?;
        let name = after[..end]
            .strip_prefix("env:")
            .ok_or_else(|| format!("only ${{env:NAME}} is supported, in {template:?}"))?;
        let value =
            lookup(name).ok_or_else(|| format!("environment variable {name} is not set"))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_reads_and_lends_only_what_it_lists() {
        let c = |methods: &[&str]| Credential {
            host: crate::Pattern::parse("r.test", crate::PatternList::Allow).unwrap(),
            header: "Authorization".into(),
            value: "x".into(),
            origin: Located::new((), crate::Layer::Project, crate::Origin::BuiltIn),
            methods: methods
                .iter()
                .map(|m| parse_lent_method(m).unwrap())
                .collect(),
        };
        let reads = c(&[]);
        assert!(reads.lends("GET", "/pkg"));
        assert!(reads.lends("HEAD", "/"));
        assert!(reads.lends("POST", "/a/b.git/git-upload-pack"));
        assert!(reads.lends("POST", "/-/npm/v1/security/advisories/bulk"));
        for (m, p) in [
            ("PUT", "/victim-pkg"),
            ("POST", "/-/npm/v1/tokens"),
            ("DELETE", "/victim-pkg/-rev/1"),
            ("POST", "/a/b.git/git-receive-pack"),
            ("POST", "/legacy/"),
            ("PUT", "/api/v1/crates/new"),
            ("PATCH", "/x"),
            ("OPTIONS", "/x"),
        ] {
            assert!(!reads.lends(m, p), "{m} {p}");
        }
        let put = c(&["PUT"]);
        assert!(put.lends("PUT", "/victim-pkg") && !put.lends("DELETE", "/victim-pkg"));
        let all = c(&["*"]);
        assert!(all.lends("DELETE", "/x") && all.lends("POST", "/-/npm/v1/tokens"));
        let some = c(&["POST /api/**"]);
        assert!(some.lends("POST", "/api/x") && !some.lends("POST", "/other"));
        for bad in ["put", "", "PUT x", "P-T"] {
            assert!(parse_lent_method(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn globs() {
        let r = RequestAllow::parse("GET /repos/acme/**").unwrap();
        assert!(r.matches("GET", "/repos/acme"));
        assert!(r.matches("GET", "/repos/acme/x/y?z=1"));
        assert!(!r.matches("POST", "/repos/acme/x"));
        assert!(!r.matches("GET", "/repos/other/x"));
        let r = RequestAllow::parse("POST /repos/acme/*/pulls").unwrap();
        assert!(r.matches("POST", "/repos/acme/x/pulls"));
        assert!(!r.matches("POST", "/repos/acme/x/y/pulls"));
        assert!(RequestAllow::parse("get /x").is_err());
        assert!(RequestAllow::parse("GET x").is_err());
    }

    #[test]
    fn paths_are_normalised_or_refused() {
        let n = |p: &str| normalize_path(p);
        assert_eq!(n("/repos/acme/x").unwrap(), "/repos/acme/x");
        assert_eq!(
            n("/repos/acme/../../admin/secret").unwrap(),
            "/admin/secret"
        );
        assert_eq!(n("/repos/acme/%2e%2e/%2E%2E/admin").unwrap(), "/admin");
        assert_eq!(n("/repos/acme/.%2e/x").unwrap(), "/repos/x");
        assert_eq!(n("//repos///acme/./x/").unwrap(), "/repos/acme/x/");
        assert_eq!(
            n("/repos/%61cme/x?q=../..%2f").unwrap(),
            "/repos/acme/x?q=../..%2f"
        );
        assert_eq!(n("/a/%7e%20b").unwrap(), "/a/~%20b");
        assert_eq!(n("/").unwrap(), "/");
        // Parameters on an ordinary segment, and real UTF-8, are fine.
        assert_eq!(n("/repos/acme/x;v=1").unwrap(), "/repos/acme/x;v=1");
        assert_eq!(n("/a/%C3%A9").unwrap(), "/a/%C3%A9");
        for bad in [
            "/repos/acme/..%2f..%2fadmin",
            "/repos/acme/%2F..",
            "/repos\\acme/../admin",
            "/repos/acme/%5c..%5cadmin",
            "/repos/acme/%252e%252e/admin",
            "/repos/acme/%2",
            "/repos/acme/%zz",
            "/repos/%00/x",
            "/../etc",
            "/a/%2e%2e/%2e%2e/b",
            "relative",
            "/repos/acme/..;/..;/admin",
            "/repos/acme/..;x=1/..;/admin",
            "/repos/acme/.;/x",
            "/repos/acme/%2e%2e;/%2e%2e;/admin",
            "/repos/acme/..%3b/..%3B/admin",
            "/repos/acme/%C0%AE%C0%AE/admin",
            "/repos/acme/%c0%ae%c0%ae/%c0%ae%c0%ae/admin",
            "/repos/acme/%E0%80%AE/x",
            "/repos/acme/%ff/x",
        ] {
            assert!(n(bad).is_err(), "{bad} should be refused");
        }
        // Every normalised path matches the same way after normalising again.
        let r = RequestAllow::parse("GET /repos/acme/**").unwrap();
        assert!(!r.matches("GET", &n("/repos/acme/../../admin/secret").unwrap()));
        assert!(!r.matches("GET", &n("/repos/acme/%2e%2e/other").unwrap()));
        assert!(r.matches("GET", &n("/repos//acme/./x").unwrap()));
    }

    #[test]
    fn env_expansion() {
        let look = |k: &str| (k == "T").then(|| "secret".to_string());
        assert_eq!(
            expand_env("Bearer ${env:T}", look).unwrap(),
            "Bearer secret"
        );
        assert!(expand_env("${env:NOPE}", look).is_err());
        assert!(expand_env("${T}", look).is_err());
    }
}
