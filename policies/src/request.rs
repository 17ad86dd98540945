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

    pub fn matches(&self, method: &str, path: &str) -> bool {
        if self.method != "*" && self.method != method {
            return false;
        }
        let path = path.split(['?', '#']).next().unwrap_or("");
        let segs: Vec<&str> = split_path(path).collect();
        glob(&self.segments, &segs)
    }
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

/// A header the proxy sets on the way out; `value` may hold
/// `${env:NAME}`, read from the supervisor's environment.
#[derive(Debug, Clone)]
pub struct Credential {
    pub host: Pattern,
    pub header: String,
    pub value: String,
    pub origin: Located<()>,
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
