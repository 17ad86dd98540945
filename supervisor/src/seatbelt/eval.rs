//! A small interpreter for the part of SBPL the generator emits, so that
//! tests ask "is this operation on this path allowed?" instead of comparing
//! text. It follows Seatbelt's rules as documented by Apple's own profiles
//! and the reverse-engineering literature:
//!
//! - the last rule that matches decides (hence `(deny default)` first);
//! - `"..."` is a string literal with backslash escapes; `#"..."` is a raw
//!   literal in which a backslash is the regex's, not the string's;
//! - `(param "N")` is the `-D N=value` text, unescaped;
//! - `(regex R)` searches the path with R (anchors are explicit);
//!   `subpath` is the path and everything below it; `literal` the path.
//!
//! Regexes are compiled with the `regex` crate after checking that they use
//! only constructs AppleMatch shares with it (no `{n}`, no `\d`-style
//! classes, no `(?` groups, no `.`), so a match here is a match there.
//! Test-only: malformed input panics with a message.

use std::cell::RefCell;
use std::collections::BTreeMap;

use regex::Regex;

use super::Profile;

#[derive(Debug, Clone)]
enum Sx {
    List(Vec<Sx>),
    Sym(String),
    /// A `"..."` literal, unescaped.
    Str(String),
    /// A `#"..."` literal, as written.
    Raw(String),
}

fn parse(text: &str) -> Vec<Sx> {
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    let mut stack: Vec<Vec<Sx>> = vec![vec![]];
    while i < chars.len() {
        let c = chars[i];
        match c {
            ';' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '(' => stack.push(vec![]),
            ')' => {
                let done = stack.pop().expect("unbalanced )");
                stack.last_mut().expect("unbalanced )").push(Sx::List(done));
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                loop {
                    let c = *chars.get(i).expect("unterminated string");
                    match c {
                        '"' => break,
                        '\\' => {
                            i += 1;
                            match chars[i] {
                                'n' => s.push('\n'),
                                't' => s.push('\t'),
                                'x' => {
                                    let hex: String = chars[i + 1..i + 3].iter().collect();
                                    s.push(
                                        char::from_u32(u32::from_str_radix(&hex, 16).unwrap())
                                            .unwrap(),
                                    );
                                    i += 2;
                                }
                                other => s.push(other),
                            }
                        }
                        c => s.push(c),
                    }
                    i += 1;
                }
                stack.last_mut().unwrap().push(Sx::Str(s));
            }
            '#' if chars.get(i + 1) == Some(&'"') => {
                let start = i + 2;
                let end = start
                    + chars[start..]
                        .iter()
                        .position(|&c| c == '"')
                        .expect("unterminated raw literal");
                stack
                    .last_mut()
                    .unwrap()
                    .push(Sx::Raw(chars[start..end].iter().collect()));
                i = end;
            }
            c if c.is_whitespace() => {}
            _ => {
                let start = i;
                while i < chars.len() && !chars[i].is_whitespace() && !"()\";".contains(chars[i]) {
                    i += 1;
                }
                stack
                    .last_mut()
                    .unwrap()
                    .push(Sx::Sym(chars[start..i].iter().collect()));
                continue;
            }
        }
        i += 1;
    }
    assert_eq!(stack.len(), 1, "unbalanced (");
    stack.pop().unwrap()
}

/// What an operation acts on.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    Path(&'a str),
    Mach(&'a str),
    /// `network-outbound` to `host:port` (`localhost:3128`).
    Tcp(&'a str),
    /// `network-outbound` to a unix socket.
    Unix(&'a str),
    /// `network-bind`/`network-inbound` on a unix socket.
    LocalUnix(&'a str),
    /// `network-bind`/`network-inbound` on an IP address.
    LocalIp,
}

#[derive(Debug, Clone, Copy)]
pub struct Query<'a> {
    pub op: &'a str,
    pub target: Target<'a>,
    /// The process holds the pty extension for this path.
    pub pty_extension: bool,
}

pub fn path<'a>(op: &'a str, p: &'a str) -> Query<'a> {
    Query {
        op,
        target: Target::Path(p),
        pty_extension: false,
    }
}

pub struct Evaluator {
    rules: Vec<(bool, Vec<String>, Vec<Sx>)>,
    params: BTreeMap<String, String>,
    compiled: RefCell<BTreeMap<String, Regex>>,
}

impl Evaluator {
    pub fn new(profile: &Profile) -> Evaluator {
        let mut rules = vec![];
        for form in parse(&profile.text) {
            let Sx::List(items) = form else {
                panic!("top-level atom {form:?}")
            };
            let Some(Sx::Sym(head)) = items.first() else {
                panic!("empty form")
            };
            let allow = match head.as_str() {
                "version" => continue,
                "allow" => true,
                "deny" => false,
                other => panic!("unknown form {other}"),
            };
            let ops = items[1..]
                .iter()
                .map_while(|x| match x {
                    Sx::Sym(s) => Some(s.clone()),
                    _ => None,
                })
                .collect::<Vec<_>>();
            assert!(!ops.is_empty(), "rule without operations");
            let filters = items[1 + ops.len()..].to_vec();
            // A deny with no filter denies the operation everywhere; the
            // generator only writes that for the fixed list of operations
            // it never allows. Anything else is a lost filter list.
            assert!(
                !filters.is_empty() || ops.len() == 1,
                "rule {ops:?} without filters"
            );
            rules.push((allow, ops, filters));
        }
        let mut params = BTreeMap::new();
        for (k, v) in &profile.params {
            assert!(
                params.insert(k.clone(), v.clone()).is_none(),
                "parameter {k} defined twice"
            );
        }
        let e = Evaluator {
            rules,
            params,
            compiled: RefCell::default(),
        };
        // Every parameter the text uses is defined, every regex compiles.
        for (_, _, filters) in &e.rules {
            for f in filters {
                e.check(f);
            }
        }
        e
    }

    fn value(&self, x: &Sx) -> String {
        match x {
            Sx::Str(s) | Sx::Raw(s) => s.clone(),
            Sx::List(l) => match l.as_slice() {
                [Sx::Sym(p), Sx::Str(name)] if p == "param" => self
                    .params
                    .get(name)
                    .unwrap_or_else(|| panic!("parameter {name} is used but not passed"))
                    .clone(),
                _ => panic!("not a value: {x:?}"),
            },
            Sx::Sym(s) => panic!("symbol {s} where a value belongs"),
        }
    }

    fn check(&self, x: &Sx) {
        if let Sx::List(l) = x {
            if let Some(Sx::Sym(h)) = l.first() {
                if h == "regex" || h == "path-regex" {
                    self.is_match(&self.value(&l[1]), "");
                    return;
                }
                if h == "param" {
                    self.value(x);
                    return;
                }
            }
            l.iter().for_each(|y| self.check(y));
        }
    }

    fn is_match(&self, re: &str, p: &str) -> bool {
        let mut cache = self.compiled.borrow_mut();
        cache
            .entry(re.to_string())
            .or_insert_with(|| compile(re))
            .is_match(p)
    }

    fn path_filter(&self, f: &Sx, p: &str) -> bool {
        let Sx::List(l) = f else {
            panic!("not a filter: {f:?}")
        };
        let Some(Sx::Sym(h)) = l.first() else {
            panic!("filter without a name")
        };
        match h.as_str() {
            "literal" | "path-literal" => p == self.value(&l[1]),
            "subpath" => {
                let s = self.value(&l[1]);
                s == "/" || p == s || p.starts_with(&format!("{}/", s.trim_end_matches('/')))
            }
            "regex" | "path-regex" => self.is_match(&self.value(&l[1]), p),
            other => panic!("unknown path filter {other}"),
        }
    }

    fn matches(&self, f: &Sx, q: &Query) -> bool {
        let Sx::List(l) = f else {
            panic!("not a filter: {f:?}")
        };
        let Some(Sx::Sym(h)) = l.first() else {
            panic!("filter without a name")
        };
        let sym = |i: usize| match l.get(i) {
            Some(Sx::Sym(s)) => s.as_str(),
            other => panic!("expected a symbol, got {other:?}"),
        };
        match (h.as_str(), q.target) {
            ("require-all", _) => l[1..].iter().all(|g| self.matches(g, q)),
            ("require-any", _) => l[1..].iter().any(|g| self.matches(g, q)),
            ("extension", _) => q.pty_extension && self.value(&l[1]) == "com.apple.sandbox.pty",
            ("literal" | "subpath" | "regex", Target::Path(p)) => self.path_filter(f, p),
            ("literal" | "subpath" | "regex", _) => false,
            ("global-name", Target::Mach(n)) => self.value(&l[1]) == n,
            ("remote", t) => match (sym(1), t) {
                ("tcp", Target::Tcp(hp)) => self.value(&l[2]) == hp,
                ("ip", Target::Tcp(_)) => l.len() == 2,
                ("unix-socket", Target::Unix(p)) => self.path_filter(&l[2], p),
                ("tcp" | "ip" | "unix-socket", _) => false,
                (other, _) => panic!("unknown remote {other}"),
            },
            ("local", t) => match (sym(1), t) {
                ("ip", Target::LocalIp) => true,
                ("unix-socket", Target::LocalUnix(p)) => self.path_filter(&l[2], p),
                ("ip" | "unix-socket", _) => false,
                (other, _) => panic!("unknown local {other}"),
            },
            (
                "global-name"
                | "target"
                | "sysctl-name"
                | "sysctl-name-prefix"
                | "ipc-posix-name-prefix",
                _,
            ) => false,
            (other, _) => panic!("unknown filter {other}"),
        }
    }

    /// Whether the profile allows the query: the last matching rule decides.
    pub fn allows(&self, q: &Query) -> bool {
        self.decide(q).0
    }

    /// The verdict, and the index of the rule that gave it (for messages).
    pub fn decide(&self, q: &Query) -> (bool, usize) {
        let mut verdict = None;
        for (i, (allow, ops, filters)) in self.rules.iter().enumerate() {
            let op_matches = ops.iter().any(|o| {
                o == "default"
                    || o == q.op
                    || o.strip_suffix('*').is_some_and(|pre| q.op.starts_with(pre))
            });
            if op_matches && (filters.is_empty() || filters.iter().any(|f| self.matches(f, q))) {
                verdict = Some((*allow, i));
            }
        }
        verdict.expect("no rule matched, not even (deny default)")
    }
}

/// Compile a regex as AppleMatch reads it, refusing constructs whose
/// meaning differs between the two engines (or that AppleMatch lacks).
pub fn compile(re: &str) -> Regex {
    let mut chars = re.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let n = chars.next().expect("trailing backslash");
                assert!(
                    !n.is_ascii_alphanumeric(),
                    "{re:?}: \\{n} is not a literal escape in AppleMatch"
                );
            }
            '{' => panic!("{re:?}: counted repetition"),
            '(' if chars.peek() == Some(&'?') => panic!("{re:?}: (? group"),
            // Whether AppleMatch's `.` matches a newline is not documented;
            // the generator writes negated classes instead.
            '.' => panic!("{re:?}: unescaped ."),
            _ => {}
        }
    }
    Regex::new(re).unwrap_or_else(|e| panic!("{re:?} does not compile: {e}"))
}
