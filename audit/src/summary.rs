//! `airlock audit`: what an auditor asks of a log, per run, per command
//! and per host: connections, bytes, what was blocked and why, who
//! approved what, and which protected paths the sandbox touched.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::Serialize;

use crate::reader::{CommandField, Line};

/// Counts for one host, one command, or a whole run.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Connections (or plain-HTTP requests) the proxy allowed.
    pub connections: u64,
    /// Refusals by policy (every `deny` but the upstream failures).
    pub blocked: u64,
    /// Allowed, but the upstream was unreachable or timed out.
    pub failed: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Inspected HTTP requests.
    pub requests: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostSummary {
    pub host: String,
    pub port: Option<u16>,
    #[serde(flatten)]
    pub stats: Stats,
    /// Refusal reason -> count.
    pub reasons: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CommandSummary {
    /// `None` for connections the proxy could not attribute.
    pub argv: Option<Vec<String>>,
    #[serde(flatten)]
    pub stats: Stats,
    pub hosts: Vec<HostSummary>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockedSummary {
    pub host: String,
    pub port: Option<u16>,
    pub reason: String,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApprovalSummary {
    pub host: String,
    pub port: Option<u16>,
    pub answer: String,
    pub by: String,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProtectedSummary {
    pub path: String,
    pub change: String,
    pub action: String,
    pub dest: Option<String>,
}

/// One inspected URL of a run: how often, with which answers, how much.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UrlSummary {
    pub method: String,
    pub url: String,
    pub count: u64,
    /// Status -> count.
    pub statuses: BTreeMap<u16, u64>,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunSummary {
    pub run: String,
    /// The time stamp of the run's first line.
    pub started: Option<String>,
    pub command: Option<Vec<String>>,
    pub cwd: Option<String>,
    pub tier: Option<String>,
    pub learn: bool,
    /// `None` when the log holds no `end` line (still running, or killed).
    pub exit_code: Option<i32>,
    pub duration_ms: Option<u64>,
    #[serde(flatten)]
    pub stats: Stats,
    pub hosts: Vec<HostSummary>,
    pub commands: Vec<CommandSummary>,
    pub blocked: Vec<BlockedSummary>,
    pub approvals: Vec<ApprovalSummary>,
    pub protected: Vec<ProtectedSummary>,
    /// Inspected requests per (method, URL), in URL order.
    pub urls: Vec<UrlSummary>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Lines that held something.
    pub lines: u64,
    /// Lines that were not audit events (torn writes, other output).
    pub bad_lines: u64,
    pub runs: Vec<RunSummary>,
}

/// host -> port -> counts: looked up by `&str`, so the hot path does not
/// allocate for hosts it has seen.
type HostMap = HashMap<String, HashMap<Option<u16>, HostAcc>>;

fn host_entry<'m>(m: &'m mut HostMap, host: &str, port: Option<u16>) -> &'m mut HostAcc {
    if !m.contains_key(host) {
        m.insert(host.to_string(), HashMap::new());
    }
    m.get_mut(host)
        .expect("inserted above")
        .entry(port)
        .or_default()
}

#[derive(Default)]
struct HostAcc {
    stats: Stats,
    reasons: BTreeMap<String, u64>,
}

#[derive(Default)]
struct RunAcc {
    started: Option<String>,
    command: Option<Vec<String>>,
    cwd: Option<String>,
    tier: Option<String>,
    learn: bool,
    exit_code: Option<i32>,
    duration_ms: Option<u64>,
    hosts: HostMap,
    /// Keyed by the argv joined with NULs ("" = not attributed; a NUL can
    /// not occur in an argument).
    commands: HashMap<String, (Option<Vec<String>>, HostMap)>,
    blocked: BTreeMap<(String, Option<u16>, String), u64>,
    approvals: BTreeMap<(String, Option<u16>, String, String), u64>,
    protected: Vec<ProtectedSummary>,
    /// (url, method) -> (count, statuses, up, down).
    urls: BTreeMap<(String, String), UrlAcc>,
}

/// One URL's count, statuses, bytes up and down.
type UrlAcc = (u64, BTreeMap<u16, u64>, u64, u64);

/// Folds lines into a summary; feed it every line of every file in order.
#[derive(Default)]
pub struct Summariser {
    key: String,
    order: Vec<String>,
    runs: HashMap<String, RunAcc>,
    lines: u64,
    bad: u64,
}

fn own(s: &Option<std::borrow::Cow<'_, str>>) -> Option<String> {
    s.as_deref().map(str::to_string)
}

impl Summariser {
    pub fn counted(&mut self, lines: u64, bad: u64) {
        self.lines += lines;
        self.bad += bad;
    }

    pub fn add(&mut self, l: Line<'_>) {
        let id = l.run.as_deref().unwrap_or("");
        if !self.runs.contains_key(id) {
            self.order.push(id.to_string());
            self.runs.insert(id.to_string(), RunAcc::default());
        }
        let Some(run) = self.runs.get_mut(id) else {
            return;
        };
        if run.started.is_none() {
            run.started = own(&l.ts);
        }
        let host = l.host.as_deref().unwrap_or("");
        let key = &mut self.key;
        key.clear();
        if let Some(c) = &l.command {
            for (i, a) in c.argv().iter().enumerate() {
                if i > 0 {
                    key.push('\0');
                }
                key.push_str(a);
            }
        }
        // The command's own host map (created on first sight).
        fn by_command<'r>(run: &'r mut RunAcc, key: &str, l: &Line<'_>) -> &'r mut HostMap {
            if !run.commands.contains_key(key) {
                let argv = l.command.as_ref().map(CommandField::to_vec);
                run.commands.insert(key.to_string(), (argv, HashMap::new()));
            }
            &mut run.commands.get_mut(key).expect("inserted above").1
        }
        match &*l.event {
            "run" => {
                run.started = own(&l.ts).or(run.started.take());
                run.command = l.command.as_ref().map(CommandField::to_vec);
                run.cwd = own(&l.cwd);
                run.tier = own(&l.tier);
                run.learn = l.learn.unwrap_or(false);
            }
            "end" => {
                run.exit_code = l.exit_code;
                run.duration_ms = l.duration_ms;
            }
            "decision" => {
                let reason = l.reason.as_deref().unwrap_or("unknown");
                let allowed = l.decision.as_deref() == Some("allow");
                let failed = matches!(reason, "upstream-unreachable" | "upstream-timeout");
                let bump = |h: &mut HostAcc| {
                    if allowed {
                        h.stats.connections += 1;
                    } else if failed {
                        h.stats.failed += 1;
                    } else {
                        h.stats.blocked += 1;
                        match h.reasons.get_mut(reason) {
                            Some(n) => *n += 1,
                            None => {
                                h.reasons.insert(reason.to_string(), 1);
                            }
                        }
                    }
                };
                bump(host_entry(&mut run.hosts, host, l.port));
                bump(host_entry(by_command(run, key, &l), host, l.port));
                if !allowed && !failed {
                    *run.blocked
                        .entry((host.to_string(), l.port, reason.to_string()))
                        .or_default() += 1;
                }
            }
            "close" | "request" => {
                let request = &*l.event == "request";
                let bump = |h: &mut HostAcc| {
                    if request {
                        h.stats.requests += 1;
                    } else {
                        h.stats.bytes_up += l.bytes_up.unwrap_or(0);
                        h.stats.bytes_down += l.bytes_down.unwrap_or(0);
                    }
                };
                bump(host_entry(&mut run.hosts, host, l.port));
                bump(host_entry(by_command(run, key, &l), host, l.port));
                if request {
                    let k = (
                        own(&l.url).unwrap_or_default(),
                        own(&l.method).unwrap_or_default(),
                    );
                    let u = run.urls.entry(k).or_default();
                    u.0 += 1;
                    if let Some(st) = l.status {
                        *u.1.entry(st).or_default() += 1;
                    }
                    u.2 += l.bytes_up.unwrap_or(0);
                    u.3 += l.bytes_down.unwrap_or(0);
                }
            }
            "approval" => {
                let key = (
                    host.to_string(),
                    l.port,
                    own(&l.answer).unwrap_or_default(),
                    own(&l.by).unwrap_or_default(),
                );
                *run.approvals.entry(key).or_default() += 1;
            }
            "protected" => run.protected.push(ProtectedSummary {
                path: own(&l.path).unwrap_or_default(),
                change: own(&l.change).unwrap_or_default(),
                action: own(&l.action).unwrap_or_default(),
                dest: own(&l.dest),
            }),
            _ => {}
        }
    }

    pub fn finish(mut self) -> Summary {
        let runs = self
            .order
            .iter()
            .filter_map(|id| self.runs.remove(id).map(|r| finish_run(id, r)))
            .collect();
        Summary {
            lines: self.lines,
            bad_lines: self.bad,
            runs,
        }
    }
}

fn add(total: &mut Stats, s: &Stats) {
    total.connections += s.connections;
    total.blocked += s.blocked;
    total.failed += s.failed;
    total.bytes_up += s.bytes_up;
    total.bytes_down += s.bytes_down;
    total.requests += s.requests;
}

fn hosts(map: HostMap) -> (Stats, Vec<HostSummary>) {
    let mut v: Vec<_> = map
        .into_iter()
        .flat_map(|(host, ports)| {
            ports.into_iter().map(move |(port, a)| HostSummary {
                host: host.clone(),
                port,
                stats: a.stats,
                reasons: a.reasons,
            })
        })
        .collect();
    v.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
    let mut total = Stats::default();
    for h in &v {
        add(&mut total, &h.stats);
    }
    (total, v)
}

fn finish_run(id: &str, r: RunAcc) -> RunSummary {
    let (stats, host_list) = hosts(r.hosts);
    let mut commands: Vec<_> = r
        .commands
        .into_iter()
        .map(|(_, (argv, m))| {
            let (stats, hosts) = hosts(m);
            CommandSummary { argv, stats, hosts }
        })
        .collect();
    commands.sort_by(|a, b| a.argv.cmp(&b.argv));
    RunSummary {
        run: id.to_string(),
        started: r.started,
        command: r.command,
        cwd: r.cwd,
        tier: r.tier,
        learn: r.learn,
        exit_code: r.exit_code,
        duration_ms: r.duration_ms,
        stats,
        hosts: host_list,
        commands,
        blocked: r
            .blocked
            .into_iter()
            .map(|((host, port, reason), count)| BlockedSummary {
                host,
                port,
                reason,
                count,
            })
            .collect(),
        approvals: r
            .approvals
            .into_iter()
            .map(|((host, port, answer, by), count)| ApprovalSummary {
                host,
                port,
                answer,
                by,
                count,
            })
            .collect(),
        protected: r.protected,
        urls: r
            .urls
            .into_iter()
            .map(
                |((url, method), (count, statuses, bytes_up, bytes_down))| UrlSummary {
                    method,
                    url,
                    count,
                    statuses,
                    bytes_up,
                    bytes_down,
                },
            )
            .collect(),
    }
}

/// What the log says, shown safely on a terminal: the sandbox chose these
/// strings, so control characters are escaped.
pub fn printable(s: &str) -> String {
    s.chars().flat_map(char::escape_debug).collect::<String>()
}

fn argv_text(argv: &Option<Vec<String>>) -> String {
    match argv {
        Some(a) => printable(&a.join(" ")),
        None => "(not attributed)".into(),
    }
}

fn target(host: &str, port: Option<u16>) -> String {
    match port {
        Some(p) => format!("{}:{p}", printable(host)),
        None => printable(host),
    }
}

fn stats_text(s: &Stats) -> String {
    let mut t = format!(
        "{} connections, {} B up, {} B down",
        s.connections, s.bytes_up, s.bytes_down
    );
    if s.requests > 0 {
        let _ = write!(t, ", {} requests", s.requests);
    }
    if s.blocked > 0 {
        let _ = write!(t, ", {} blocked", s.blocked);
    }
    if s.failed > 0 {
        let _ = write!(t, ", {} failed upstream", s.failed);
    }
    t
}

fn host_line(out: &mut String, indent: &str, h: &HostSummary) {
    let _ = write!(
        out,
        "{indent}{}  {}",
        target(&h.host, h.port),
        stats_text(&h.stats)
    );
    if !h.reasons.is_empty() {
        let r: Vec<_> = h.reasons.iter().map(|(r, n)| format!("{r} x{n}")).collect();
        let _ = write!(out, " ({})", r.join(", "));
    }
    out.push('\n');
}

/// The human summary.
pub fn render_text(s: &Summary) -> String {
    render_text_with(s, false)
}

/// The human summary; with `urls`, each run's inspected requests per URL.
pub fn render_text_with(s: &Summary, urls: bool) -> String {
    let mut out = String::new();
    for r in &s.runs {
        let id = if r.run.is_empty() {
            "(no run id)"
        } else {
            &r.run
        };
        let _ = write!(out, "run {}", printable(id));
        if let Some(t) = &r.started {
            let _ = write!(out, "  {}", printable(t));
        }
        out.push('\n');
        if let Some(c) = &r.command {
            let _ = writeln!(out, "  command: {}", printable(&c.join(" ")));
        }
        let end = match (r.exit_code, r.duration_ms) {
            (Some(c), Some(ms)) => format!("exit {c} after {ms} ms"),
            _ => "no end line (still running or killed)".into(),
        };
        let tier = r.tier.as_deref().map(printable).unwrap_or("-".into());
        let _ = writeln!(out, "  tier: {tier}; {end}");
        if r.learn {
            let _ = writeln!(out, "  LEARN MODE: unknown hosts were allowed");
        }
        let _ = writeln!(out, "  total: {}", stats_text(&r.stats));
        if !r.hosts.is_empty() {
            let _ = writeln!(out, "  per host:");
            for h in &r.hosts {
                host_line(&mut out, "    ", h);
            }
        }
        if !r.commands.is_empty() {
            let _ = writeln!(out, "  per command:");
            for c in &r.commands {
                let _ = writeln!(out, "    {}", argv_text(&c.argv));
                for h in &c.hosts {
                    host_line(&mut out, "      ", h);
                }
            }
        }
        if !r.blocked.is_empty() {
            let _ = writeln!(out, "  blocked:");
            for b in &r.blocked {
                let _ = writeln!(
                    out,
                    "    {} ({}) x{}",
                    target(&b.host, b.port),
                    printable(&b.reason),
                    b.count
                );
            }
        }
        if !r.approvals.is_empty() {
            let _ = writeln!(out, "  approvals:");
            for a in &r.approvals {
                let _ = writeln!(
                    out,
                    "    {}: {} by {} x{}",
                    target(&a.host, a.port),
                    printable(&a.answer),
                    printable(&a.by),
                    a.count
                );
            }
        }
        if !r.protected.is_empty() {
            let _ = writeln!(out, "  protected paths:");
            for p in &r.protected {
                let _ = write!(
                    out,
                    "    {} {} ({})",
                    printable(&p.path),
                    printable(&p.change),
                    printable(&p.action)
                );
                if let Some(d) = &p.dest {
                    let _ = write!(out, " -> {}", printable(d));
                }
                out.push('\n');
            }
        }
        if urls && !r.urls.is_empty() {
            let _ = writeln!(out, "  per URL (inspected requests):");
            for u in &r.urls {
                let st: Vec<String> = u
                    .statuses
                    .iter()
                    .map(|(s, n)| {
                        if *n == 1 {
                            s.to_string()
                        } else {
                            format!("{s} x{n}")
                        }
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "    {} {}  x{}  status {}  {} B up, {} B down",
                    printable(&u.method),
                    printable(&u.url),
                    u.count,
                    st.join(", "),
                    u.bytes_up,
                    u.bytes_down
                );
            }
        } else if !urls && !r.urls.is_empty() {
            let _ = writeln!(
                out,
                "  {} inspected URLs (airlock audit --urls lists them)",
                r.urls.len()
            );
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "{} runs, {} lines{}",
        s.runs.len(),
        s.lines,
        if s.bad_lines > 0 {
            format!(", {} lines that were not audit events", s.bad_lines)
        } else {
            String::new()
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::for_each_line;

    fn summarise(log: &str) -> Summary {
        let mut s = Summariser::default();
        let (lines, bad) = for_each_line(log.as_bytes(), |l| s.add(l)).unwrap();
        s.counted(lines, bad);
        s.finish()
    }

    #[test]
    fn per_run_per_command_per_host() {
        let log = r#"{"event":"run","run":"r1","ts":"T0","command":["sh","-c","x"],"tier":"linux"}
{"event":"decision","run":"r1","host":"a.test","port":80,"decision":"allow","reason":"allowlisted","command":{"pid":2,"argv":["curl","a"]}}
{"event":"close","run":"r1","host":"a.test","port":80,"bytes_up":10,"bytes_down":200,"command":{"pid":2,"argv":["curl","a"]}}
{"event":"decision","run":"r1","host":"b.test","port":443,"decision":"deny","reason":"not-allowlisted","command":{"pid":3,"argv":["wget"]}}
{"event":"decision","run":"r1","host":"b.test","port":443,"decision":"deny","reason":"not-allowlisted","command":null}
{"event":"decision","run":"r2","host":"c.test","port":80,"decision":"allow","reason":"approved"}
{"event":"approval","run":"r1","host":"c.test","port":80,"answer":"allow-once","by":"tty"}
{"event":"protected","run":"r1","path":"/w/.git/config","change":"modified","action":"restored","dest":null}
{"event":"end","run":"r1","exit_code":3,"duration_ms":9}
"#;
        let s = summarise(log);
        assert_eq!(s.runs.len(), 2);
        let r = &s.runs[0];
        assert_eq!(r.run, "r1");
        assert_eq!(r.exit_code, Some(3));
        assert_eq!(r.stats.connections, 1);
        assert_eq!(r.stats.blocked, 2);
        assert_eq!(r.stats.bytes_down, 200);
        assert_eq!(r.hosts.len(), 2);
        assert_eq!(r.hosts[1].reasons["not-allowlisted"], 2);
        assert_eq!(r.commands.len(), 3);
        assert_eq!(r.commands[0].argv, None);
        assert_eq!(r.commands[1].argv, Some(vec!["curl".into(), "a".into()]));
        assert_eq!(r.commands[1].stats.bytes_up, 10);
        assert_eq!(
            r.blocked,
            vec![BlockedSummary {
                host: "b.test".into(),
                port: Some(443),
                reason: "not-allowlisted".into(),
                count: 2
            }]
        );
        assert_eq!(r.approvals[0].by, "tty");
        assert_eq!(r.protected[0].action, "restored");
        assert_eq!(s.runs[1].exit_code, None);
        let text = render_text(&s);
        assert!(text.contains("b.test:443 (not-allowlisted) x2"), "{text}");
    }

    #[test]
    fn hostile_strings_are_escaped_on_the_terminal() {
        let log = "{\"event\":\"decision\",\"run\":\"r\",\"host\":\"x\\u001b[2Jy\",\"port\":1,\"decision\":\"deny\",\"reason\":\"invalid-host\"}\n";
        let text = render_text(&summarise(log));
        assert!(!text.contains('\u{1b}'), "{text}");
    }
}
