//! `--ask socket:PATH` (SPEC §5.2): JSON Lines over a unix socket that
//! airlock listens on (mode 0600), for IDEs and agent harnesses. Every
//! connected client sees every question; the first valid answer wins.
//!
//! airlock → client: `{"type":"ask","id":"1","host":"h","port":443,"command":"npm install"}`,
//! `{"type":"answered","id":"1","verdict":"deny"}` when another client (or
//! the timeout) settled it, `{"type":"error","message":"..."}` for a bad line.
//! client → airlock: `{"type":"answer","id":"1","verdict":"allow-once"}` with
//! verdict `allow-once`, `allow-session`, `allow-always` or `deny`.
//!
//! Only clients of airlock's own uid outside the sandbox are served (peer
//! credentials); a question whose timeout passed is withdrawn
//! (`"verdict":"timeout"`) and not sent to clients that connect later.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use airlock_proxy::{Answer, AnswerFuture, Approver, Question};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use super::Persist;

#[derive(Deserialize)]
struct ClientLine {
    #[serde(rename = "type")]
    kind: String,
    id: Option<String>,
    verdict: Option<String>,
}

pub fn parse_verdict(s: &str) -> Option<Answer> {
    match s {
        "allow-once" => Some(Answer::AllowOnce),
        "allow-session" => Some(Answer::AllowSession),
        "allow-always" => Some(Answer::AllowAlways),
        "deny" => Some(Answer::Deny),
        _ => None,
    }
}

struct Pending {
    line: String,
    reply: oneshot::Sender<(Answer, String)>,
}

#[derive(Default)]
struct Hub {
    clients: Mutex<Vec<(u64, mpsc::UnboundedSender<String>)>>,
    pending: Mutex<HashMap<String, Pending>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Hub {
    fn broadcast(&self, line: &str) {
        lock(&self.clients).retain(|(_, tx)| tx.send(line.to_string()).is_ok());
    }

    /// Settle a question; false if it was settled already or never asked.
    fn settle(&self, id: &str, answer: Answer, by: String) -> bool {
        let Some(p) = lock(&self.pending).remove(id) else {
            return false;
        };
        let _ = p.reply.send((answer, by));
        self.broadcast(
            &json!({"type": "answered", "id": id, "verdict": answer.as_str()}).to_string(),
        );
        true
    }
}

pub struct SocketApprover {
    hub: Arc<Hub>,
    next_id: AtomicU64,
    persist: Persist,
    path: PathBuf,
    /// Removed already: not again, since the path may be another run's by then.
    removed: std::sync::atomic::AtomicBool,
}

impl SocketApprover {
    /// Listen on `path`; must be called inside the tokio runtime.
    pub fn bind(path: &Path, persist: Persist) -> Result<Arc<SocketApprover>> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                bail!(
                    "{} exists and is not a socket; refusing to replace it",
                    path.display()
                );
            }
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!("{} is in use by another listener", path.display());
            }
            std::fs::remove_file(path)
                .with_context(|| format!("removing the stale socket {}", path.display()))?;
        }
        // 0600 from the moment it exists: bind() creates the file with the
        // umask's mode, and a chmod after it would leave a window. Nothing
        // else creates files while the run is being set up.
        // SAFETY: umask only swaps the process's file-creation mask.
        let old = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(path);
        // SAFETY: as above, restoring it.
        unsafe { libc::umask(old) };
        let listener = bound.with_context(|| format!("listening on {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod 0600 {}", path.display()))?;
        let hub = Arc::new(Hub::default());
        tokio::spawn(accept(listener, hub.clone()));
        Ok(Arc::new(SocketApprover {
            hub,
            next_id: AtomicU64::new(1),
            persist,
            path: path.to_path_buf(),
            removed: std::sync::atomic::AtomicBool::new(false),
        }))
    }
}

impl SocketApprover {
    fn remove(&self) {
        if !self.removed.swap(true, Ordering::SeqCst) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for SocketApprover {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Who may answer (SPEC §5.2): a client of our own uid whose process is
/// not part of the sandbox, checked with the kernel's word for it
/// (SO_PEERCRED), not only the socket file's mode. `Err` says why not.
pub fn admit(uid: u32, pid: Option<i32>) -> Result<String, String> {
    // SAFETY: geteuid has no preconditions.
    let ours = unsafe { libc::geteuid() };
    if uid != ours {
        return Err(format!("uid {uid} is not airlock's uid {ours}"));
    }
    let Some(pid) = pid else {
        return Err("the client's pid is unknown".into());
    };
    // The sandbox's connect() calls are made by airlock itself on its
    // behalf (linux/unixconnect.rs): such a peer is airlock's own pid.
    if u32::try_from(pid).is_ok_and(|p| p == std::process::id()) {
        return Err(format!(
            "pid {pid} is airlock itself: a connection made on the sandbox's behalf"
        ));
    }
    if super::sandbox::contains(pid) {
        return Err(format!(
            "pid {pid} is inside the sandbox (or in another PID namespace)"
        ));
    }
    Ok(format!("uid={uid} pid={pid}"))
}

async fn accept(listener: UnixListener, hub: Arc<Hub>) {
    let mut next = 1u64;
    while let Ok((mut stream, _)) = listener.accept().await {
        let who = match stream.peer_cred() {
            Ok(c) => admit(c.uid(), c.pid()),
            Err(e) => Err(format!("no peer credentials: {e}")),
        };
        match who {
            Ok(by) => {
                tokio::spawn(client(stream, next, by, hub.clone()));
                next += 1;
            }
            Err(why) => {
                tracing::warn!("approval socket: refused a client: {why}");
                let line =
                    json!({"type": "error", "message": format!("refused: {why}")}).to_string();
                let _ = stream.write_all(format!("{line}\n").as_bytes()).await;
            }
        }
    }
}

async fn client(stream: UnixStream, n: u64, by: String, hub: Arc<Hub>) {
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    // A new client sees the questions already waiting.
    for p in lock(&hub.pending).values() {
        let _ = tx.send(p.line.clone());
    }
    lock(&hub.clients).push((n, tx.clone()));
    let writer = tokio::spawn(async move {
        while let Some(mut line) = rx.recv().await {
            line.push('\n');
            if write.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
    });
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let error = |message: String| json!({"type": "error", "message": message}).to_string();
        let parsed: Result<ClientLine, _> = serde_json::from_str(&line);
        let reply = match parsed {
            Err(e) => Some(error(format!("not a JSON object of the protocol: {e}"))),
            Ok(l) if l.kind != "answer" => {
                Some(error(format!("unknown message type {:?}", l.kind)))
            }
            Ok(l) => match (l.id, l.verdict.as_deref().and_then(parse_verdict)) {
                (None, _) => Some(error("an answer needs an id".into())),
                (_, None) => Some(error(
                    "verdict must be allow-once, allow-session, allow-always or deny".into(),
                )),
                (Some(id), Some(answer)) => {
                    if hub.settle(&id, answer, by.clone()) {
                        None
                    } else {
                        Some(error(format!("no open question with id {id:?}")))
                    }
                }
            },
        };
        if let Some(r) = reply {
            let _ = tx.send(r);
        }
    }
    lock(&hub.clients).retain(|(id, _)| *id != n);
    drop(tx);
    let _ = writer.await;
}

impl Approver for SocketApprover {
    fn close(&self) {
        self.remove();
    }

    fn also_waiting(&self, target: &airlock_policy::Target) {
        if let Some(why) = self.unheard() {
            super::notify(&format!(
                "airlock: also waiting for the answer about {}:{} ({why})",
                airlock_proxy::escape::line(&target.host.to_string(), 200),
                target.port
            ));
        }
    }

    fn unheard(&self) -> Option<String> {
        let shown = crate::text::shown(&self.path);
        lock(&self.hub.clients).is_empty().then(|| {
            format!("nobody is connected to the approval socket {shown}: `airlock approve --socket {shown}` answers")
        })
    }

    fn ask(&self, q: Question) -> AnswerFuture<'_> {
        Box::pin(async move {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed).to_string();
            let mut msg = json!({
                "type": "ask", "id": id, "host": q.target.host.to_string(), "port": q.target.port,
                "command": q.command,
            });
            if let Some(w) = &q.write {
                // SPEC §3.4: the host is allowed; this asks to lend a
                // credential to a request beyond reads.
                msg["kind"] = json!("credential-write");
                msg["method"] = json!(w.method);
                msg["url"] = json!(w.url);
                msg["credential"] = json!(w.credential);
            }
            let line = msg.to_string();
            if let Some(why) = self.unheard() {
                super::notify(&format!(
                    "airlock: asking about {}:{} and waiting for an answer ({why})",
                    airlock_proxy::escape::line(&q.target.host.to_string(), 200),
                    q.target.port
                ));
            }
            let (reply, answer) = oneshot::channel();
            lock(&self.hub.pending).insert(
                id.clone(),
                Pending {
                    line: line.clone(),
                    reply,
                },
            );
            self.hub.broadcast(&line);
            // Dropped by the engine's timeout: withdraw the question.
            struct Withdraw<'a>(&'a Hub, String);
            impl Drop for Withdraw<'_> {
                fn drop(&mut self) {
                    if lock(&self.0.pending).remove(&self.1).is_some() {
                        self.0.broadcast(
                            &json!({"type": "answered", "id": self.1, "verdict": "timeout"})
                                .to_string(),
                        );
                    }
                }
            }
            let _withdraw = Withdraw(&self.hub, id);
            match answer.await {
                // Lending a credential is never written into a policy.
                Ok((a, by)) if q.write.is_some() => (a.session_at_most(), by),
                Ok((a, by)) => {
                    self.persist.apply(&q.target, a, &by);
                    (a, by)
                }
                Err(_) => (Answer::Deny, "the approval socket closed".into()),
            }
        })
    }
}
