//! Reading one policy file into a `Fragment`, with every problem reported
//! as `file:line:column: message`. Unknown keys are errors, never ignored.

use std::net::IpAddr;
use std::ops::Range;
use std::str::FromStr;

use ipnet::IpNet;
use toml::Spanned;

use crate::fragment::Fragment;
use crate::host::Host;
use crate::model::{PolicyFile, Text};
use crate::pattern::{Pattern, PatternList};
use crate::preset;
use crate::request::{Credential, HoldRule, RequestAllow, RequestRule};
use crate::source::{line_col, Diagnostic, Layer, Located, Origin};
use crate::units::{parse_duration, parse_size};

struct Ctx<'a> {
    path: &'a str,
    text: &'a str,
    layer: Layer,
    errors: Vec<Diagnostic>,
}

impl Ctx<'_> {
    fn error(&mut self, span: Range<usize>, message: impl Into<String>) {
        let (line, column) = line_col(self.text, span.start);
        self.errors.push(Diagnostic {
            file: self.path.to_string(),
            line,
            column,
            message: message.into(),
        });
    }

    fn locate<T>(&self, value: T, span: &Range<usize>) -> Located<T> {
        let (line, _) = line_col(self.text, span.start);
        Located::new(
            value,
            self.layer,
            Origin::File {
                path: self.path.to_string(),
                line,
            },
        )
    }

    fn text(&self, t: &Text) -> Located<String> {
        self.locate(t.get_ref().clone(), &t.span())
    }

    fn texts(&self, ts: &[Text]) -> Vec<Located<String>> {
        ts.iter().map(|t| self.text(t)).collect()
    }

    fn patterns(&mut self, ts: &[Text], list: PatternList, key: &str) -> Vec<Located<Pattern>> {
        let mut out = vec![];
        for t in ts {
            match Pattern::parse(t.get_ref(), list) {
                Ok(p) => out.push(self.locate(p, &t.span())),
                Err(e) => self.error(t.span(), format!("network.{key}: {e}")),
            }
        }
        out
    }

    fn parsed<T>(
        &mut self,
        t: &Option<Text>,
        key: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Option<Located<T>> {
        let t = t.as_ref()?;
        match parse(t.get_ref()) {
            Ok(v) => Some(self.locate(v, &t.span())),
            Err(e) => {
                self.error(t.span(), format!("{key}: {e}"));
                None
            }
        }
    }

    fn count(&mut self, v: &Option<Spanned<i64>>, key: &str) -> Option<Located<u32>> {
        let v = v.as_ref()?;
        match u32::try_from(*v.get_ref()) {
            Ok(n) if n > 0 => Some(self.locate(n, &v.span())),
            _ => {
                self.error(v.span(), format!("{key} must be a positive whole number"));
                None
            }
        }
    }
}

/// Parse and validate one policy file's text.
pub fn load_str(text: &str, path: &str, layer: Layer) -> Result<Fragment, Vec<Diagnostic>> {
    let file: PolicyFile = match toml::from_str(text) {
        Ok(f) => f,
        Err(e) => {
            let (line, column) = e.span().map_or((1, 1), |s| line_col(text, s.start));
            return Err(vec![Diagnostic {
                file: path.to_string(),
                line,
                column,
                message: e.message().trim().to_string(),
            }]);
        }
    };
    let mut cx = Ctx {
        path,
        text,
        layer,
        errors: vec![],
    };
    let mut f = Fragment::empty(layer, path);

    if let Some(v) = &file.version {
        if *v.get_ref() != 1 {
            cx.error(
                v.span(),
                "unsupported policy version; this airlock reads version = 1",
            );
        }
    }
    for p in &file.presets {
        if preset::find(p.get_ref()).is_none() {
            cx.error(
                p.span(),
                format!(
                    "unknown preset {:?}; `airlock policy presets` lists them",
                    p.get_ref()
                ),
            );
        } else {
            f.presets.push(cx.text(p));
        }
    }
    f.require_sandbox = file
        .require_sandbox
        .as_ref()
        .map(|v| cx.locate(*v.get_ref(), &v.span()));

    let fs = &file.filesystem;
    f.write = fs.write.as_deref().map(|v| cx.texts(v)).unwrap_or_default();
    f.read = fs.read.as_deref().map(|v| cx.texts(v));
    f.deny_read = fs
        .deny_read
        .as_deref()
        .map(|v| cx.texts(v))
        .unwrap_or_default();
    f.deny_write = fs
        .deny_write
        .as_deref()
        .map(|v| cx.texts(v))
        .unwrap_or_default();
    f.unix_sockets = fs
        .unix_sockets
        .as_deref()
        .map(|v| cx.texts(v))
        .unwrap_or_default();
    for p in f
        .write
        .iter()
        .chain(f.deny_read.iter())
        .chain(f.deny_write.iter())
        .chain(f.unix_sockets.iter())
    {
        if p.value.is_empty() || p.value.contains('\0') {
            cx.errors.push(Diagnostic {
                file: path.to_string(),
                line: match &p.origin {
                    Origin::File { line, .. } => *line,
                    _ => 1,
                },
                column: 1,
                message: format!("filesystem: invalid path {:?}", p.value),
            });
        }
    }

    let net = &file.network;
    f.mode = net
        .mode
        .as_ref()
        .map(|v| cx.locate(*v.get_ref(), &v.span()));
    f.allow = cx.patterns(&net.allow, PatternList::Allow, "allow");
    f.deny = cx.patterns(&net.deny, PatternList::Deny, "deny");
    f.inspect = cx.patterns(&net.inspect, PatternList::Inspect, "inspect");
    f.unknown = net
        .unknown
        .as_ref()
        .map(|v| cx.locate(*v.get_ref(), &v.span()));
    f.user_allow = net
        .user_allow
        .as_ref()
        .map(|v| cx.locate(*v.get_ref(), &v.span()));
    f.ask_timeout = cx.parsed(&net.ask_timeout, "network.ask_timeout", parse_duration);
    f.connect_timeout = cx.parsed(
        &net.connect_timeout,
        "network.connect_timeout",
        parse_duration,
    );
    f.idle_timeout = cx.parsed(&net.idle_timeout, "network.idle_timeout", parse_duration);
    f.max_tunnels = cx.count(&net.max_tunnels, "network.max_tunnels");
    for t in &net.allow_private {
        match parse_cidr(t.get_ref()) {
            Ok(n) => f.allow_private.push(cx.locate(n, &t.span())),
            Err(e) => cx.error(t.span(), format!("network.allow_private: {e}")),
        }
    }
    for (host, ip) in &net.resolve {
        match (Host::parse(host), IpAddr::from_str(ip.get_ref())) {
            (Ok(Host::Name(h)), Ok(addr)) => {
                f.resolve.push((Host::Name(h), cx.locate(addr, &ip.span())))
            }
            (Ok(Host::Ip(_)), _) => cx.error(
                ip.span(),
                format!("network.resolve: {host:?} is already an address"),
            ),
            (Err(e), _) => cx.error(ip.span(), format!("network.resolve: {e}")),
            (_, Err(_)) => cx.error(
                ip.span(),
                format!("network.resolve: {:?} is not an IP address", ip.get_ref()),
            ),
        }
    }
    f.upstream_ca = cx.texts(&net.upstream_ca);
    for r in &net.request {
        let Some(host) = cx
            .patterns(
                std::slice::from_ref(&r.host),
                PatternList::Allow,
                "request.host",
            )
            .pop()
        else {
            continue;
        };
        let mut allow = vec![];
        for a in &r.allow {
            match RequestAllow::parse(a.get_ref()) {
                Ok(v) => allow.push(v),
                Err(e) => cx.error(a.span(), format!("network.request: {e}")),
            }
        }
        let origin = cx.locate((), &r.host.span());
        // Rules restrict: a rule host without a port covers every port of
        // that host, or `--inspect host` on another port would pass all.
        let mut host = host.value;
        if host.ports == crate::pattern::Ports::Web {
            host.ports = crate::pattern::Ports::Any;
        }
        f.request_rules.push(RequestRule {
            host,
            allow,
            origin,
        });
    }
    for r in &net.hold {
        let Some(host) = cx
            .patterns(
                std::slice::from_ref(&r.host),
                PatternList::Allow,
                "hold.host",
            )
            .pop()
        else {
            continue;
        };
        let mut requests = vec![];
        for a in &r.requests {
            match RequestAllow::parse(a.get_ref()) {
                Ok(v) => requests.push(v),
                Err(e) => cx.error(a.span(), format!("network.hold: {e}")),
            }
        }
        if r.requests.is_empty() {
            cx.error(
                r.host.span(),
                "network.hold: list the requests to hold, e.g. requests = [\"POST /**\"]"
                    .to_string(),
            );
        }
        let origin = cx.locate((), &r.host.span());
        // As request rules: a host without a port holds on every port.
        let mut host = host.value;
        if host.ports == crate::pattern::Ports::Web {
            host.ports = crate::pattern::Ports::Any;
        }
        f.hold_rules.push(HoldRule {
            host,
            requests,
            origin,
        });
    }
    for c in &net.credential {
        let Some(host) = cx
            .patterns(
                std::slice::from_ref(&c.host),
                PatternList::Allow,
                "credential.host",
            )
            .pop()
        else {
            continue;
        };
        let header = c.header.get_ref();
        if header.is_empty()
            || !header
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            cx.error(
                c.header.span(),
                format!("network.credential: invalid header name {header:?}"),
            );
            continue;
        }
        let mut methods = vec![];
        for m in &c.methods {
            match crate::request::parse_lent_method(m.get_ref()) {
                Ok(v) => methods.push(v),
                Err(e) => cx.error(m.span(), format!("network.credential: {e}")),
            }
        }
        let origin = cx.locate((), &c.host.span());
        f.credentials.push(Credential {
            host: host.value,
            header: header.clone(),
            value: c.value.get_ref().clone(),
            origin,
            methods,
        });
    }

    f.env_inherit = file
        .env
        .inherit
        .as_ref()
        .map(|v| cx.locate(*v.get_ref(), &v.span()));
    f.env_pass = cx.texts(&file.env.pass);
    f.env_set = file
        .env
        .set
        .iter()
        .map(|(k, v)| (k.clone(), cx.text(v)))
        .collect();

    f.timeout = cx.parsed(&file.limits.timeout, "limits.timeout", parse_duration);
    f.memory = cx.parsed(&file.limits.memory, "limits.memory", parse_size);
    f.pids = cx.count(&file.limits.pids, "limits.pids");
    f.tmp = cx.parsed(&file.limits.tmp, "limits.tmp", parse_size);
    f.audit_log = file.audit.log.as_ref().map(|t| cx.text(t));
    f.audit_otlp = file.audit.otlp.as_ref().map(|t| cx.text(t));
    let flag =
        |v: &Option<toml::Spanned<bool>>| v.as_ref().map(|v| cx.locate(*v.get_ref(), &v.span()));
    f.macos_keychain = flag(&file.macos.keychain);
    f.macos_dnssd = flag(&file.macos.dnssd);

    if cx.errors.is_empty() {
        Ok(f)
    } else {
        Err(cx.errors)
    }
}

/// A CIDR, or a single address as its /32 or /128.
pub fn parse_cidr(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    if let Ok(n) = IpNet::from_str(s) {
        return Ok(n.trunc());
    }
    IpAddr::from_str(s)
        .map(IpNet::from)
        .map_err(|_| format!("{s:?} is not a CIDR (write e.g. \"10.0.0.0/8\")"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errs(text: &str) -> Vec<String> {
        load_str(text, "p.toml", Layer::Project)
            .err()
            .unwrap_or_default()
            .iter()
            .map(|d| d.to_string())
            .collect()
    }

    #[test]
    fn full_example_loads() {
        let text = r#"
version = 1
presets = ["github"]
[filesystem]
write = [".", "~/.cache/pip"]
read  = ["/"]
deny_read  = ["~/.ssh", ".env", "secrets/**"]
deny_write = [".git/hooks"]
unix_sockets = ["~/.docker/run/docker.sock"]
[network]
mode = "proxy"
allow = ["example.com", "*.example.com", "git.example.com:22"]
deny  = ["uploads.example.com"]
unknown = "ask"
ask_timeout = "60s"
allow_private = ["10.0.0.0/8"]
inspect = ["api.example.com"]
resolve = { "registry.test" = "127.0.0.1" }
upstream_ca = []
connect_timeout = "10s"
idle_timeout = "300s"
max_tunnels = 1024
[[network.request]]
host = "api.example.com"
allow = ["GET /repos/acme/**", "POST /repos/acme/*/pulls"]
[[network.credential]]
host = "api.example.com"
header = "Authorization"
value = "Bearer ${env:EXAMPLE_TOKEN}"
[env]
pass = ["LANG", "LC_*"]
set = { CI = "1" }
[limits]
timeout = "30m"
memory = "8G"
pids = 4096
tmp = "2G"
"#;
        let f = load_str(text, "p.toml", Layer::Project).unwrap();
        assert_eq!(f.allow.len(), 3);
        assert_eq!(
            f.allow[2].origin,
            Origin::File {
                path: "p.toml".into(),
                line: 12
            }
        );
        assert_eq!(f.request_rules[0].allow.len(), 2);
        assert_eq!(f.memory.unwrap().value, 8 << 30);
        assert_eq!(f.tmp.unwrap().value, 2 << 30);
        assert_eq!(f.unix_sockets[0].value, "~/.docker/run/docker.sock");
    }

    #[test]
    fn hold_rules_parse_with_the_request_grammar() {
        let text = "[[network.hold]]\nhost = \"git.test\"\nrequests = [\"POST /**/git-receive-pack\", \"PUT /*\"]\n";
        let f = load_str(text, "p.toml", Layer::Project).unwrap();
        let h = &f.hold_rules[0];
        assert!(h.holds("POST", "/acme/app.git/git-receive-pack"));
        assert!(h.holds("PUT", "/pkg"));
        assert!(!h.holds("POST", "/acme/app.git/git-upload-pack"));
        assert!(!h.holds("GET", "/pkg"));
        assert!(!h.holds("PUT", "/a/b"));
        // A port-less host holds on every port, as request rules restrict.
        let t = crate::Target::parse("git.test:8443", None).unwrap();
        assert_eq!(h.host.matches(&t), crate::PatternMatch::Yes);
        assert_eq!(
            h.origin.origin,
            Origin::File {
                path: "p.toml".into(),
                line: 2
            }
        );
        for bad in [
            "[[network.hold]]\nhost = \"git.test\"\nrequests = [\"post /x\"]\n",
            "[[network.hold]]\nhost = \"git.test\"\nrequests = [\"POST x\"]\n",
            "[[network.hold]]\nhost = \"git.test\"\n",
            "[[network.hold]]\nhost = \"*.com\"\nrequests = [\"POST /**\"]\n",
            "[[network.hold]]\nhost = \"git.test\"\nrequests = [\"POST /**\"]\nallow = [\"GET /\"]\n",
        ] {
            assert!(load_str(bad, "p.toml", Layer::Project).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_hold_rule_implies_inspection() {
        let text = "[network]\nallow = [\"git.test\"]\n[[network.hold]]\nhost = \"git.test\"\nrequests = [\"POST /**\"]\n";
        let f = load_str(text, "p.toml", Layer::Project).unwrap();
        let p = crate::Policy::build(vec![f], &crate::preset::tests::FakeProbe::default());
        assert_eq!(p.hold_rules.len(), 1);
        let t = crate::Target::parse("git.test:443", None).unwrap();
        assert!(crate::inspects(&p, &t));
        assert!(!crate::inspects(
            &p,
            &crate::Target::parse("other.test:443", None).unwrap()
        ));
    }

    #[test]
    fn credential_methods_are_validated() {
        let text = "[[network.credential]]\nhost = \"r.test\"\nheader = \"Authorization\"\nvalue = \"x\"\nmethods = [\"PUT\", \"POST /-/v1/**\"]\n";
        let f = load_str(text, "p.toml", Layer::Project).unwrap();
        let c = &f.credentials[0];
        assert!(c.lends("PUT", "/pkg") && c.lends("POST", "/-/v1/x"));
        assert!(!c.lends("DELETE", "/pkg"));
        // Without `methods`: reads only.
        let f = load_str(&text.replace("methods", "#"), "p.toml", Layer::Project).unwrap();
        assert!(f.credentials[0].methods.is_empty());
        let e = errs(&text.replace("\"PUT\"", "\"put\""));
        assert!(
            e.iter()
                .any(|e| e.contains("p.toml:5") && e.contains("methods")),
            "{e:?}"
        );
    }

    #[test]
    fn macos_switches_load_with_their_line_and_reject_unknown_keys() {
        let f = load_str("[macos]\nkeychain = true\n", "p.toml", Layer::Project).unwrap();
        let k = f.macos_keychain.unwrap();
        assert!(k.value);
        assert_eq!(
            k.origin,
            Origin::File {
                path: "p.toml".into(),
                line: 2
            }
        );
        assert!(f.macos_dnssd.is_none());
        assert!(errs("[macos]\nbonjour = true\n")[0].contains("bonjour"));
    }

    #[test]
    fn errors_carry_line_and_column() {
        assert_eq!(
            errs("[network]\nallow = [\"ex*.com\"]\n"),
            vec!["p.toml:2:10: network.allow: invalid host pattern \"ex*.com\": * may appear only as the whole first label (*.example.com)"]
        );
        let e = errs("[network]\nallow = [\"*\"]\n");
        assert!(e[0].starts_with("p.toml:2:10: network.allow:"), "{e:?}");
        let e = errs("[netwrok]\nallow = []\n");
        assert!(
            e[0].starts_with("p.toml:1:2:") && e[0].contains("netwrok"),
            "{e:?}"
        );
        let e = errs("[network]\nallow = \"example.com\"\n");
        assert!(e[0].starts_with("p.toml:2:9:"), "{e:?}");
        let e = errs("[network]\nask_timeout = \"soon\"\n");
        assert!(e[0].starts_with("p.toml:2:15:"), "{e:?}");
        let e = errs("presets = [\"nope\"]\n");
        assert!(e[0].contains("unknown preset"), "{e:?}");
        let e = errs("[filesystem]\nunix_sockets = [\"\"]\n");
        assert!(e[0].starts_with("p.toml:2:"), "{e:?}");
        let e = errs("[limits]\ntmp = \"lots\"\n");
        assert!(e[0].starts_with("p.toml:2:7:"), "{e:?}");
        let e = errs("version = 2\n");
        assert!(e[0].starts_with("p.toml:1:11:"), "{e:?}");
    }

    #[test]
    fn several_errors_are_all_reported() {
        let e = errs("[network]\nallow = [\"*.com\", \"a.*.b\"]\nallow_private = [\"x\"]\n");
        assert_eq!(e.len(), 3, "{e:?}");
    }
}
