//! Requests a review run held (SPEC §4.8), kept in the changeset's
//! `requests/` directory: one file per request (a JSON line, then the body
//! as it came) and `index.json`, the order and state of each. The proxy
//! hands them over through [`Keeper`]; `changes apply` replays them after
//! the files, with the user's credentials set again from their policy, as
//! the proxy would have set them.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use airlock_proxy::hold::{HeldRequest, Holder, Receipt, DEFAULT_CAP};

/// What all the held requests of one run may weigh together: past it,
/// requests are refused (`hold-refused`), so a command cannot fill the
/// disk through the changeset.
const TOTAL_CAP: u64 = 1 << 30;
/// How many requests one run may hold.
const COUNT_CAP: usize = 10_000;

pub fn dir(changeset: &Path) -> PathBuf {
    changeset.join("requests")
}

/// Where a held request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Held,
    /// An apply began sending it; if that apply was interrupted, whether
    /// the origin got it is unknown.
    Sending,
    Sent,
    Failed,
}

/// One line of `index.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    pub method: String,
    pub url: String,
    pub size: u64,
    pub content_type: Option<String>,
    pub why: String,
    pub file: String,
    pub state: State,
    /// The origin's status and what apply made of it, once sent.
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub result: Option<String>,
}

impl Entry {
    /// `POST host/path`, as summaries show it.
    pub fn short(&self) -> String {
        let rest = self
            .url
            .split_once("://")
            .map_or(self.url.as_str(), |(_, r)| r);
        let rest = rest.split('?').next().unwrap_or(rest);
        airlock_proxy::escape::line(&format!("{} {rest}", self.method), 200)
    }
}

/// What `apply` needs to rebuild the run's policy (its credentials, hosts,
/// `--resolve` and upstream trust) without the run's command line: the
/// policy flags, with files made absolute. Never a credential's value.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Settings {
    pub policy: Vec<PathBuf>,
    pub preset: Vec<String>,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub inspect: Vec<String>,
    pub resolve: Vec<String>,
    pub allow_private: Vec<String>,
    pub upstream_ca: Vec<PathBuf>,
    pub upstream_proxy: Option<String>,
    pub dns_server: Option<std::net::SocketAddr>,
    pub write: Vec<PathBuf>,
}

impl Settings {
    pub fn of(args: &crate::cli::PolicyArgs, write: &[PathBuf]) -> Settings {
        let abs = |p: &PathBuf| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        Settings {
            policy: args.policy.iter().map(abs).collect(),
            preset: args.preset.clone(),
            allow: args.allow.clone(),
            deny: args.deny.clone(),
            inspect: args.inspect.clone(),
            resolve: args.resolve.clone(),
            allow_private: args.allow_private.clone(),
            upstream_ca: args.upstream_ca.iter().map(abs).collect(),
            upstream_proxy: args.upstream_proxy.clone(),
            dns_server: args.dns_server,
            write: write.iter().map(abs).collect(),
        }
    }

    pub fn policy_args(&self, workspace: &Path) -> crate::cli::PolicyArgs {
        crate::cli::PolicyArgs {
            policy: self.policy.clone(),
            preset: self.preset.clone(),
            allow: self.allow.clone(),
            deny: self.deny.clone(),
            inspect: self.inspect.clone(),
            resolve: self.resolve.clone(),
            allow_private: self.allow_private.clone(),
            upstream_ca: self.upstream_ca.clone(),
            upstream_proxy: self.upstream_proxy.clone(),
            dns_server: self.dns_server,
            workspace: Some(workspace.to_path_buf()),
            ..Default::default()
        }
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

pub fn load(changeset: &Path) -> Result<Vec<Entry>> {
    let p = dir(changeset).join("index.json");
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b).with_context(|| format!("reading {}", p.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
        Err(e) => Err(e).with_context(|| format!("reading {}", p.display())),
    }
}

pub fn save(changeset: &Path, entries: &[Entry]) -> Result<()> {
    let p = dir(changeset).join("index.json");
    write_atomic(&p, &serde_json::to_vec_pretty(entries)?)
        .with_context(|| format!("writing {}", p.display()))
}

pub fn settings(changeset: &Path) -> Result<Settings> {
    let p = dir(changeset).join("settings.json");
    let b = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_slice(&b).with_context(|| format!("reading {}", p.display()))
}

/// The header line of a request's file.
#[derive(Serialize, Deserialize)]
struct Head {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    why: String,
    size: u64,
}

/// A kept request, read back whole.
pub fn read(changeset: &Path, e: &Entry) -> Result<HeldRequest> {
    let p = dir(changeset).join(&e.file);
    let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
    let nl = bytes
        .iter()
        .position(|b| *b == b'\n')
        .with_context(|| format!("{} is damaged", p.display()))?;
    let head: Head = serde_json::from_slice(&bytes[..nl])
        .with_context(|| format!("{} is damaged", p.display()))?;
    let body = bytes[nl + 1..].to_vec();
    if body.len() as u64 != head.size || head.method != e.method || head.url != e.url {
        anyhow::bail!("{} does not match the index: it is not sent", p.display());
    }
    Ok(HeldRequest {
        method: head.method,
        url: head.url,
        headers: head.headers,
        body: body.into(),
        why: head.why,
    })
}

/// The proxy's side of the changeset: keeps each held request durably,
/// in order, or nothing of it.
pub struct Keeper {
    changeset: PathBuf,
    id: String,
    entries: Mutex<(Vec<Entry>, u64)>,
}

impl Keeper {
    /// Made before the proxy serves: `requests/` with the settings apply
    /// will rebuild the policy from.
    pub fn new(changeset: &Path, id: &str, settings: &Settings) -> Result<Arc<Keeper>> {
        let d = dir(changeset);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&d)
            .with_context(|| format!("creating {}", d.display()))?;
        write_atomic(
            &d.join("settings.json"),
            &serde_json::to_vec_pretty(settings)?,
        )
        .with_context(|| format!("writing {}", d.display()))?;
        Ok(Arc::new(Keeper {
            changeset: changeset.to_path_buf(),
            id: id.to_string(),
            entries: Mutex::new((vec![], 0)),
        }))
    }

    fn keep(&self, req: HeldRequest) -> Result<Receipt, String> {
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (entries, total) = &mut *guard;
        if entries.len() >= COUNT_CAP {
            return Err(format!("the run already holds {COUNT_CAP} requests"));
        }
        let size = req.body.len() as u64;
        if *total + size > TOTAL_CAP {
            return Err(format!(
                "the run's held requests would weigh more than {} MiB together",
                TOTAL_CAP >> 20
            ));
        }
        let seq = entries.len() as u64 + 1;
        let file = format!("{seq:06}.req");
        let path = dir(&self.changeset).join(&file);
        let content_type = req
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .map(|(_, v)| v.clone());
        let head = Head {
            method: req.method.clone(),
            url: req.url.clone(),
            headers: req.headers,
            why: req.why.clone(),
            size,
        };
        let mut bytes = serde_json::to_vec(&head).map_err(|e| e.to_string())?;
        bytes.push(b'\n');
        bytes.extend_from_slice(&req.body);
        write_atomic(&path, &bytes).map_err(|e| format!("writing {}: {e}", path.display()))?;
        entries.push(Entry {
            seq,
            method: req.method,
            url: req.url,
            size,
            content_type,
            why: req.why,
            file,
            state: State::Held,
            status: None,
            result: None,
        });
        if let Err(e) = save(&self.changeset, entries) {
            // Nothing partial: the request is refused and its file goes.
            entries.pop();
            let _ = std::fs::remove_file(&path);
            return Err(format!("{e:#}"));
        }
        *total += size;
        Ok(Receipt {
            seq,
            changeset: self.id.clone(),
        })
    }
}

impl Holder for Keeper {
    fn cap(&self) -> u64 {
        DEFAULT_CAP
    }

    fn hold(&self, req: HeldRequest) -> Result<Receipt, String> {
        self.keep(req)
    }
}

/// `1 request held (POST host/path)`, or `None` when none was.
pub fn summary(entries: &[Entry]) -> Option<String> {
    let waiting: Vec<&Entry> = entries.iter().filter(|e| e.state != State::Sent).collect();
    if waiting.is_empty() {
        return None;
    }
    let n = waiting.len();
    let mut shown: Vec<String> = waiting.iter().take(3).map(|e| e.short()).collect();
    if n > 3 {
        shown.push(format!("and {} more", n - 3));
    }
    Some(format!(
        "{n} request{} held ({})",
        if n == 1 { "" } else { "s" },
        shown.join(", ")
    ))
}

/// Git's smart-HTTP push answers 200 even when it refuses a ref: what its
/// report says, for a `git-receive-pack` exchange. `Some(Err)`: git would
/// report the push failed (unpack error, a ref `ng`, a fatal message).
pub fn git_report(
    req: &HeldRequest,
    status: u16,
    ctype: Option<&str>,
    body: &[u8],
) -> Option<Result<String, String>> {
    if !req.url.split('?').next()?.ends_with("/git-receive-pack") || status != 200 {
        return None;
    }
    if ctype != Some("application/x-git-receive-pack-result") {
        return Some(Err(format!(
            "the origin did not answer as git's receive-pack ({})",
            ctype.unwrap_or("no content type")
        )));
    }
    // The first command line carries the capabilities after a NUL.
    let first = pkt_lines(&req.body)
        .into_iter()
        .next()
        .flatten()
        .unwrap_or_default();
    let caps = first
        .split(|b| *b == 0)
        .nth(1)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .unwrap_or_default();
    let sideband = caps
        .split(' ')
        .any(|c| c == "side-band-64k" || c == "side-band");
    let report = if sideband {
        let mut data = vec![];
        for line in pkt_lines(body).into_iter().flatten() {
            match line.split_first() {
                Some((1, rest)) => data.extend_from_slice(rest),
                Some((3, rest)) => {
                    return Some(Err(format!(
                        "the remote failed: {}",
                        String::from_utf8_lossy(rest).trim()
                    )))
                }
                _ => {}
            }
        }
        data
    } else {
        body.to_vec()
    };
    let mut oks = vec![];
    let mut ngs = vec![];
    let mut unpack = None;
    for line in pkt_lines(&report).into_iter().flatten() {
        let l = String::from_utf8_lossy(&line).trim_end().to_string();
        if let Some(u) = l.strip_prefix("unpack ") {
            unpack = Some(u.to_string());
        } else if let Some(r) = l.strip_prefix("ok ") {
            oks.push(r.to_string());
        } else if let Some(r) = l.strip_prefix("ng ") {
            ngs.push(r.to_string());
        }
    }
    match unpack.as_deref() {
        Some("ok") => {}
        Some(e) => return Some(Err(format!("the remote could not unpack the push: {e}"))),
        None if caps.contains("report-status") => {
            return Some(Err("the remote sent no push report".into()))
        }
        None => {}
    }
    if !ngs.is_empty() {
        let shown: Vec<String> = ngs
            .iter()
            .map(|n| match n.split_once(' ') {
                Some((r, why)) => format!("{r} ({why})"),
                None => n.clone(),
            })
            .collect();
        return Some(Err(format!(
            "the remote rejected {}",
            airlock_proxy::escape::line(&shown.join(", "), 300)
        )));
    }
    Some(Ok(format!(
        "git: {} updated",
        airlock_proxy::escape::line(&oks.join(", "), 300)
    )))
}

/// Git's pkt-lines: `None` for a flush (`0000`) or other special packet;
/// stops at the first malformed length.
fn pkt_lines(mut b: &[u8]) -> Vec<Option<Vec<u8>>> {
    let mut out = vec![];
    while b.len() >= 4 {
        let Some(len) = std::str::from_utf8(&b[..4])
            .ok()
            .and_then(|h| usize::from_str_radix(h, 16).ok())
        else {
            break;
        };
        if len < 4 {
            out.push(None);
            b = &b[4..];
            continue;
        }
        if len > b.len() {
            break;
        }
        out.push(Some(b[4..len].to_vec()));
        b = &b[len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(s: &[u8]) -> Vec<u8> {
        let mut v = format!("{:04x}", s.len() + 4).into_bytes();
        v.extend_from_slice(s);
        v
    }

    fn push(caps: &str) -> HeldRequest {
        let mut body = pkt(format!(
            "{} {} refs/heads/main\0{caps}\n",
            "0".repeat(40),
            "1".repeat(40)
        )
        .as_bytes());
        body.extend_from_slice(b"0000PACK");
        HeldRequest {
            method: "POST".into(),
            url: "https://git.test/a.git/git-receive-pack".into(),
            headers: vec![],
            body: body.into(),
            why: String::new(),
        }
    }

    const CT: Option<&str> = Some("application/x-git-receive-pack-result");

    #[test]
    fn git_reports_are_read_with_and_without_sideband() {
        let plain = push("report-status");
        let mut ok = pkt(b"unpack ok\n");
        ok.extend(pkt(b"ok refs/heads/main\n"));
        ok.extend(b"0000");
        assert!(git_report(&plain, 200, CT, &ok).unwrap().is_ok());
        let mut ng = pkt(b"unpack ok\n");
        ng.extend(pkt(b"ng refs/heads/main failed to update ref\n"));
        ng.extend(b"0000");
        let e = git_report(&plain, 200, CT, &ng).unwrap().unwrap_err();
        assert!(e.contains("refs/heads/main (failed to update ref)"), "{e}");

        let sb = push("report-status side-band-64k agent=git/2");
        let mut wrapped = vec![];
        let mut band = vec![1u8];
        band.extend(&ng);
        wrapped.extend(pkt(&band));
        wrapped.extend(pkt(b"\x02remote: progress\n"));
        wrapped.extend(b"0000");
        assert!(git_report(&sb, 200, CT, &wrapped).unwrap().is_err());
        let mut good = vec![1u8];
        good.extend(&ok);
        let mut wrapped = pkt(&good);
        wrapped.extend(b"0000");
        assert!(git_report(&sb, 200, CT, &wrapped).unwrap().is_ok());
        // No report where one was asked for, or another content type: failed.
        assert!(git_report(&plain, 200, CT, b"0000").unwrap().is_err());
        assert!(git_report(&plain, 200, Some("text/html"), &ok)
            .unwrap()
            .is_err());
        // Not a push: not git's business.
        let mut other = push("report-status");
        other.url = "https://r.test/pkg".into();
        assert!(git_report(&other, 200, None, b"").is_none());
    }

    #[test]
    fn a_kept_request_reads_back_whole_and_in_order() {
        let d = tempfile::tempdir().unwrap();
        let k = Keeper::new(d.path(), "0badc0de", &Settings::default()).unwrap();
        for i in 0..3u8 {
            let r = k
                .hold(HeldRequest {
                    method: "PUT".into(),
                    url: format!("https://r.test/p{i}"),
                    headers: vec![("content-type".into(), "application/json".into())],
                    body: vec![i; 10 + i as usize].into(),
                    why: "test".into(),
                })
                .unwrap();
            assert_eq!(r.seq, i as u64 + 1);
        }
        let entries = load(d.path()).unwrap();
        assert_eq!(entries.len(), 3);
        let back = read(d.path(), &entries[2]).unwrap();
        assert_eq!(back.url, "https://r.test/p2");
        assert_eq!(&back.body[..], &[2u8; 12][..]);
        assert_eq!(entries[0].content_type.as_deref(), Some("application/json"));
        assert_eq!(
            summary(&entries).unwrap(),
            "3 requests held (PUT r.test/p0, PUT r.test/p1, PUT r.test/p2)"
        );
        // A file that no longer matches its index is never sent.
        std::fs::write(dir(d.path()).join(&entries[1].file), b"{}\nx").unwrap();
        assert!(read(d.path(), &entries[1]).is_err());
    }
}

/// One held request's fate in an apply.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub seq: u64,
    pub method: String,
    pub url: String,
    /// `sent`, `already-sent`, `failed`, `unknown` or `not-sent`.
    pub outcome: &'static str,
    pub status: Option<u16>,
    pub detail: String,
}

/// Replay the changeset's held requests in order (SPEC §4.8), each marked
/// `sending` on disk before it goes and `sent` or `failed` after, so an
/// interrupted apply never sends one twice: one left `sending` is reported
/// as unknown and stops the rest, as a failure does. `Ok(true)`: every
/// request has been sent.
pub fn replay_all(changeset: &Path, meta: &super::Meta, out: &mut Vec<Outcome>) -> Result<bool> {
    let mut entries = load(changeset)?;
    if entries.iter().all(|e| e.state == State::Sent) {
        for e in &entries {
            out.push(outcome(
                e,
                "already-sent",
                e.result.clone().unwrap_or_default(),
            ));
        }
        return Ok(true);
    }
    let engine = replay_engine(changeset, meta, &entries)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut stopped: Option<u64> = None;
    for i in 0..entries.len() {
        if let Some(at) = stopped {
            let e = &entries[i];
            out.push(outcome(
                e,
                "not-sent",
                format!("request {at} did not go through"),
            ));
            continue;
        }
        match entries[i].state {
            State::Sent => {
                let e = &entries[i];
                out.push(outcome(
                    e,
                    "already-sent",
                    e.result.clone().unwrap_or_default(),
                ));
                continue;
            }
            State::Sending => {
                let e = &entries[i];
                out.push(outcome(e, "unknown", "an earlier apply was interrupted while sending it: whether the origin got it is unknown, so it is not sent again; check the origin, then `airlock changes discard` the changeset".into()));
                stopped = Some(e.seq);
                continue;
            }
            State::Held | State::Failed => {}
        }
        let req = match read(changeset, &entries[i]) {
            Ok(r) => r,
            Err(err) => {
                let e = &entries[i];
                out.push(outcome(e, "failed", format!("{err:#}")));
                stopped = Some(e.seq);
                continue;
            }
        };
        entries[i].state = State::Sending;
        save(changeset, &entries)?;
        let sent = runtime.block_on(airlock_proxy::hold::replay(&engine, &req));
        let (state, status, result) = match sent {
            Err(why) => (State::Failed, None, format!("not answered: {why}")),
            Ok(r) => {
                let git = git_report(&req, r.status, r.content_type.as_deref(), &r.body);
                match git {
                    Some(Ok(g)) => (State::Sent, Some(r.status), g),
                    Some(Err(g)) => (State::Failed, Some(r.status), g),
                    None if (200..300).contains(&r.status) => {
                        (State::Sent, Some(r.status), String::new())
                    }
                    None => {
                        let text =
                            String::from_utf8_lossy(&r.body[..r.body.len().min(300)]).into_owned();
                        (
                            State::Failed,
                            Some(r.status),
                            format!(
                                "the origin answered {}: {}",
                                r.status,
                                airlock_proxy::escape::line(text.trim(), 300)
                            ),
                        )
                    }
                }
            }
        };
        entries[i].state = state;
        entries[i].status = status;
        entries[i].result = Some(result.clone());
        save(changeset, &entries)?;
        let e = &entries[i];
        if state == State::Sent {
            out.push(outcome(e, "sent", result));
        } else {
            out.push(outcome(e, "failed", result));
            stopped = Some(e.seq);
        }
    }
    engine.close_approver();
    runtime.shutdown_background();
    Ok(stopped.is_none())
}

fn outcome(e: &Entry, what: &'static str, detail: String) -> Outcome {
    Outcome {
        seq: e.seq,
        method: e.method.clone(),
        url: e.url.clone(),
        outcome: what,
        status: e.status,
        detail,
    }
}

/// Who answers for the hosts of a replay: the person who runs `changes
/// apply`, by doing so, for exactly the hosts the run's held requests go
/// to. A request is held only once its host was allowed in the run, by
/// the policy or by an approval (nobody is there to ask at apply time);
/// what the policy now denies stays denied (no question is asked then),
/// and any other host is refused.
struct ReplayApprover {
    hosts: Vec<(String, u16)>,
}

impl airlock_proxy::Approver for ReplayApprover {
    fn ask(&self, q: airlock_proxy::approve::Question) -> airlock_proxy::approve::AnswerFuture<'_> {
        let ok = q.write.is_none()
            && self
                .hosts
                .iter()
                .any(|(h, p)| *h == q.target.host.to_string() && *p == q.target.port);
        Box::pin(async move {
            match ok {
                true => (
                    airlock_proxy::approve::Answer::AllowOnce,
                    "a held request's host, released by `airlock changes apply`".to_string(),
                ),
                false => (
                    airlock_proxy::approve::Answer::Deny,
                    "not a held request's host".to_string(),
                ),
            }
        })
    }
}

/// `https://host[:port]/…` as (host, port).
fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split('/').next()?;
    let target = airlock_policy::Target::parse(authority, Some(443)).ok()?;
    Some((target.host.to_string(), target.port))
}

/// The engine a replay goes through: the run's policy rebuilt from its
/// recorded settings (credentials read now, from the user's configuration
/// and environment), the held requests' own hosts approved
/// ([`ReplayApprover`]), no audit log.
fn replay_engine(
    changeset: &Path,
    meta: &super::Meta,
    entries: &[Entry],
) -> Result<Arc<airlock_proxy::Engine>> {
    let s = settings(changeset)?;
    let args = s.policy_args(&meta.workspace);
    let built = crate::policy::build_policy(
        &args,
        &s.write,
        crate::policy::Named::NeedTrust,
        &crate::probe::Runner,
    )
    .context("rebuilding the run's policy to send its held requests")?;
    let policy = built.policy;
    let inspect = crate::inspect_setup::for_policy(&policy)?;
    Ok(airlock_proxy::Engine::new(airlock_proxy::EngineConfig {
        policy: Arc::new(policy),
        audit: None,
        approver: Arc::new(ReplayApprover {
            hosts: entries.iter().filter_map(|e| host_port(&e.url)).collect(),
        }),
        identity: Arc::new(airlock_proxy::SourceAddressOnly),
        dns_server: s.dns_server,
        inspect,
        lend_to: airlock_proxy::LendTo::Sandbox,
        upstream_proxy: crate::inspect_setup::upstream_proxy(&args)?,
    }))
}
