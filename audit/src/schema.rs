//! The audit schema (SPEC §6): one typed event per kind. The field names
//! are a stable interface (docs/src/audit.md, "Schema"): renaming one breaks
//! every SIEM query written against it, so they only ever grow.

use serde::{Deserialize, Serialize};

/// The sandboxed process that opened a connection, found from the
/// socket's owner: its pid inside the sandbox and its argv.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    pub pid: u32,
    pub argv: Vec<String>,
}

/// Who ran airlock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub uid: u32,
    pub name: Option<String>,
}

/// A policy file applied to a run, with the hash of what was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyFile {
    pub path: String,
    /// `user`, `project`, `command-line` or `managed`.
    pub layer: String,
    pub sha256: String,
}

/// `run`: the first line of every run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub version: String,
    pub command: Vec<String>,
    pub cwd: Option<String>,
    pub workspace: String,
    pub user: User,
    pub tier: String,
    pub policies: Vec<PolicyFile>,
    /// `true` for `airlock run --learn`: unknown hosts were allowed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub learn: bool,
}

/// `end`: the last line of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    pub exit_code: i32,
    pub duration_ms: u64,
}

/// `decision`: one per connection (or request) the proxy decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub host: String,
    /// `None` when the request named no port that could be parsed.
    pub port: Option<u16>,
    pub ip: Option<String>,
    /// `allow` or `deny`.
    pub decision: String,
    pub reason: String,
    pub rule: Option<String>,
    /// The policy file and line of the rule.
    pub source: Option<String>,
    /// `connect`, `http`, `socks5` or `transparent` (captured).
    pub protocol: String,
    pub command: Option<Command>,
    /// The client's source address as the proxy saw it.
    pub client: String,
    pub detail: Option<String>,
}

/// `close`: a connection ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Close {
    pub host: String,
    pub port: u16,
    pub command: Option<Command>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
    pub error: Option<String>,
}

/// `request`: one inspected HTTP request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub host: String,
    pub port: u16,
    pub command: Option<Command>,
    pub method: String,
    pub url: String,
    pub status: u16,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Header lines, values redacted unless the policy allows them.
    pub request_headers: Vec<String>,
}

/// `approval`: a question, its answer and who gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    pub host: String,
    pub port: u16,
    pub question: String,
    /// `allow-once`, `allow-session`, `allow-always`, `deny` or `timeout`.
    pub answer: String,
    /// `tty`, `uid N pid M` of a socket client, or why nobody did.
    pub by: String,
    pub command: Option<Command>,
}

/// `protected`: a protected path the sandbox created or changed (§4.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Protected {
    pub path: String,
    /// `created`, `modified` or `removed`.
    pub change: String,
    /// `quarantined`, `restored` or `reported`.
    pub action: String,
    /// Where a quarantined copy went.
    pub dest: Option<String>,
}

/// `dns`: a name the sandbox asked its DNS server for (SPEC §5.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// The name as asked (escaped: the sandbox chose it).
    pub name: String,
    /// The record type (`A`, `AAAA`, `TXT`, ...).
    #[serde(rename = "type")]
    pub qtype: String,
    /// The addresses answered; empty for a refusal or no records.
    pub answer: Vec<String>,
    /// `answered`, `placeholder` (awaiting approval: nothing was looked
    /// up), `refused`, `failed` or `not-a-name`.
    pub outcome: String,
    /// Why it was refused, when it was.
    pub reason: Option<String>,
    /// The client's source address.
    pub client: String,
}

/// Every kind of line; the kind is the `event` field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    Run(Run),
    End(End),
    Decision(Decision),
    Close(Close),
    Request(Request),
    Approval(Approval),
    Protected(Protected),
    Dns(Dns),
}

impl Event {
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Run(_) => "run",
            Event::End(_) => "end",
            Event::Decision(_) => "decision",
            Event::Close(_) => "close",
            Event::Request(_) => "request",
            Event::Approval(_) => "approval",
            Event::Protected(_) => "protected",
            Event::Dns(_) => "dns",
        }
    }
}

/// One line: the common fields and the event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// RFC 3339, UTC, milliseconds.
    pub ts: String,
    /// The connection id; 0 for run-wide events.
    pub conn: u64,
    pub run: String,
    #[serde(flatten)]
    pub event: Event,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_one_flat_object_with_the_common_fields() {
        let r = Record {
            ts: "2026-01-01T00:00:00.000Z".into(),
            conn: 7,
            run: "r1".into(),
            event: Event::End(End {
                exit_code: 3,
                duration_ms: 12,
            }),
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["event"], "end");
        assert_eq!(v["conn"], 7);
        assert_eq!(v["run"], "r1");
        assert_eq!(v["exit_code"], 3);
        assert_eq!(v["ts"], "2026-01-01T00:00:00.000Z");
        let back: Record = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }
}
