//! What of the host environment looks like a secret (SPEC §4.3): by name,
//! and by value (credentials inside a URL, well-known token shapes). Pure,
//! so the supervisor's scrub and the presets' passed variables share one
//! judgement.

/// The strict pass list of `[env] inherit = "none"`.
pub const STRICT_PASS: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "COLORTERM",
    "LANG",
    "LC_*",
    "TZ",
    "PWD",
];

/// Names withheld unless named exactly, matched against the upper-cased
/// name. SPEC §4.3's list, plus spellings of the same idea it would miss
/// (`GITHUBTOKEN`, `CLIENTSECRET`, `MYSQL_PWD`, `REDIS_PASS`, an
/// `..._PAT` personal access token, `OPENAI_APIKEY`, `LD_AUDIT`).
const SECRET_NAMES: &[&str] = &[
    "*TOKEN",
    "*_TOKEN_*",
    "*SECRET*",
    "*_KEY",
    "*APIKEY*",
    "*API_KEY*",
    "*PRIVATE_KEY*",
    "*PASSWORD*",
    "*PASSWD*",
    "*_PASS",
    "*_PWD",
    "*_PAT",
    "*CREDENTIAL*",
    "AWS_*",
    "SSH_AUTH_SOCK",
    "DBUS_SESSION_BUS_ADDRESS",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
];

/// `*` matches any run of characters (none included).
pub fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            let Some(tail) = name.strip_prefix(head) else {
                return false;
            };
            if rest.is_empty() {
                return true;
            }
            (0..=tail.len()).any(|i| tail.is_char_boundary(i) && glob(rest, &tail[i..]))
        }
    }
}

/// Whether a variable's name looks like a secret, in any letter case.
pub fn secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if NOT_SECRET.contains(&upper.as_str()) {
        return false;
    }
    SECRET_NAMES.iter().any(|p| glob(p, &upper)) || auth_part(&upper)
}

/// Names a pattern above takes that hold no credential: `AWS_CA_BUNDLE`
/// is a CA bundle's path, one of the trust variables SPEC §4.3 lists
/// (withheld, an AWS SDK behind a company's CA failed inside: harness
/// round 12).
const NOT_SECRET: &[&str] = &["AWS_CA_BUNDLE"];

/// SPEC's `*_AUTH*`, except `_AUTHOR` (`GIT_AUTHOR_NAME`: a commit made in
/// the sandbox keeps its author) and `_AUTHORITY` (a CA's path), which
/// are no credential. `_AUTHORIZATION` is one.
fn auth_part(upper: &str) -> bool {
    upper.match_indices("_AUTH").any(|(i, m)| {
        let after = &upper[i + m.len()..];
        !after.starts_with("OR") || after.starts_with("ORIZ")
    })
}

/// Whether a value holds a credential: a URL with credentials in it
/// (`scheme://user:password@`, `scheme://:password@`, `https://TOKEN@`),
/// also percent-encoded (a URL inside a URL), a private key, or a token of
/// a well-known shape.
pub fn secret_value(value: &str) -> bool {
    if url_credentials(value) {
        return true;
    }
    let decoded = percent_decode(value);
    if decoded != value && url_credentials(&decoded) {
        return true;
    }
    if value.contains("PRIVATE KEY-----") {
        return true;
    }
    value
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '"' | '\'' | '='))
        .any(token_shaped)
}

/// Every `://` in the value (lists hold several URLs) is looked at: the
/// authority runs to the next `/`, `?`, `#` or whitespace, and a userinfo
/// is what precedes its last `@`. Conservative on purpose: a comma list
/// `https://a@h1,https://h2` is caught by its first URL's authority.
fn url_credentials(value: &str) -> bool {
    value.match_indices("://").any(|(i, _)| {
        let scheme = scheme_before(&value[..i]);
        let rest = &value[i + 3..];
        let end = rest
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .unwrap_or(rest.len());
        let Some((userinfo, _host)) = rest[..end].rsplit_once('@') else {
            return false;
        };
        if userinfo.contains(':') {
            // A password, even an empty one: `TOKEN:@host` is how several
            // registries spell a token.
            return true;
        }
        // A user alone: a login name for ssh (whose secret is a key kept
        // elsewhere), a token anywhere else (`https://ghp_...@github.com`).
        !userinfo.is_empty()
            && !matches!(
                scheme.as_str(),
                "ssh" | "git+ssh" | "ssh+git" | "sftp" | "scp"
            )
    })
}

/// The URL scheme that ends at the end of `before`, lower-cased.
fn scheme_before(before: &str) -> String {
    let start = before
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
        .map_or(0, |i| i + 1);
    before[start..].to_ascii_lowercase()
}

/// Tokens whose prefix says what they are (GitHub, GitLab, Slack, npm,
/// PyPI, AWS access keys): a whole word of the value, long enough that a
/// name like `npm_config_cache` is not one.
fn token_shaped(word: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "ghp_",
        "gho_",
        "ghu_",
        "ghs_",
        "ghr_",
        "github_pat_",
        "glpat-",
        "xoxb-",
        "xoxp-",
        "npm_",
        "pypi-",
        "AKIA",
    ];
    PREFIXES.iter().any(|p| {
        word.strip_prefix(p).is_some_and(|rest| {
            rest.len() >= 16
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                && rest.bytes().any(|b| b.is_ascii_digit())
        })
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_withheld_name_pattern_in_any_case() {
        for n in [
            "NPM_TOKEN",
            "npm_token",
            "GITHUBTOKEN",
            "GH_TOKEN_2",
            "CLIENT_SECRET",
            "client_secret_value",
            "MYSECRETTHING",
            "MY_API_KEY",
            "my_api_key",
            "OPENAI_APIKEY",
            "STRIPE_API_KEY_TEST",
            "SSH_PRIVATE_KEY_B64",
            "DB_PASSWORD",
            "PGPASSWORD",
            "password",
            "FTP_PASSWD",
            "REDIS_PASS",
            "MYSQL_PWD",
            "AZURE_DEVOPS_EXT_PAT",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "docker_credential",
            "NPM_CONFIG__AUTH",
            "npm_config__authToken",
            "HTTP_AUTHORIZATION",
            "BASIC_AUTH",
            "AWS_REGION",
            "aws_profile",
            "SSH_AUTH_SOCK",
            "DBUS_SESSION_BUS_ADDRESS",
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "ld_library_path",
            "LD_AUDIT",
        ] {
            assert!(secret_name(n), "{n} is not withheld");
        }
        for n in [
            "CI",
            "NODE_ENV",
            "PATH",
            "PWD",
            "OLDPWD",
            "JAVA_HOME",
            "VIRTUAL_ENV",
            "RUST_LOG",
            "GOFLAGS",
            "GOPROXY",
            "GIT_AUTHOR_NAME",
            "GIT_AUTHOR_EMAIL",
            "REQUESTS_CA_AUTHORITY",
            "AWS_CA_BUNDLE",
            "aws_ca_bundle",
            "XAUTHORITY",
            "KEYBOARD_LAYOUT",
            "PASSPORT_DIR",
            "LC_ALL",
            "SSH_CONNECTION",
        ] {
            assert!(!secret_name(n), "{n} is withheld");
        }
    }

    #[test]
    fn credentials_in_urls() {
        for v in [
            "https://user:pass@example.com/simple",
            "postgres://app:s3cret@db:5432/app",
            "redis://:password@cache:6379",
            "https://TOKEN:@registry.example/",
            "https://ghx_not_a_known_prefix@github.com/acme/repo.git",
            "http://mirror.example/ https://u:p@private.example/simple",
            "https://a.example,https://u:p@b.example",
            "https://u:p@a.example,https://b.example",
            "https://user%3Apass@example.com/",
            "https%3A%2F%2Fuser%3Apass%40example.com%2F",
            "amqp+ssl://guest:guest@mq/",
            "ssh://git:hunter2@example.com/repo",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nabc",
            "ghp_0123456789abcdefABCDEF0123456789abcd",
            "Bearer glpat-0123456789abcdefghij",
            "AKIAIOSFODNN7EXAMPLE1",
        ] {
            assert!(secret_value(v), "{v:?} is passed");
        }
        for v in [
            "https://example.com/simple",
            "https://example.com/path?q=a:b@c",
            "ssh://git@example.com/acme/repo.git",
            "git@example.com:acme/repo.git",
            "/home/u/.cache",
            "localhost,127.0.0.1",
            "npm_config_cache",
            "production",
            "mailto:me@example.com",
        ] {
            assert!(!secret_value(v), "{v:?} is withheld");
        }
    }

    #[test]
    fn globs() {
        assert!(glob("LC_*", "LC_ALL"));
        assert!(glob("*", ""));
        assert!(glob("*_KEY", "_KEY"));
        assert!(!glob("*_KEY", "KEY"));
        assert!(glob("A*B*C", "AxxBxxC"));
        assert!(!glob("A*B*C", "AxxCxxB"));
        assert!(glob("é*", "éa"));
    }
}
