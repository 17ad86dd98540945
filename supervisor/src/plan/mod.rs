//! The concrete boundary a policy compiles to: resolved paths, the
//! environment and the network mode. Built by the supervisor, carried to
//! the sandbox helper, and printed by `airlock policy profile`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use airlock_policy::{NetworkMode, Policy};
use serde::{Deserialize, Serialize};

use crate::paths::{absolute_glob, lexical, resolve_path};

pub mod macos;
pub mod protected;

/// The fixed port of the proxy listener inside the sandbox's network namespace.
pub const SANDBOX_PROXY_PORT: u16 = 3128;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Net {
    /// A new network namespace whose only way out is the proxy.
    Proxy,
    /// A new network namespace with loopback only.
    None,
    /// The host's network: no boundary.
    Host,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Host variables left outside (names only), for the exit report.
    #[serde(skip)]
    pub withheld_env: Vec<String>,
    /// `[env].pass` globs that matched a withheld name, for stderr.
    #[serde(skip)]
    pub env_warnings: Vec<String>,
    pub cwd: PathBuf,
    pub net: Net,
    /// Landlock read (and execute) roots.
    pub read: Vec<PathBuf>,
    /// Landlock read-write roots (that exist).
    pub write: Vec<PathBuf>,
    /// Writable roots under /tmp, bound back into the private /tmp.
    pub tmp_binds: Vec<PathBuf>,
    /// `--read` paths under /tmp, bound back read-only into the private
    /// /tmp.
    #[serde(default)]
    pub tmp_read_binds: Vec<PathBuf>,
    /// `--publish` ports: served at the host's 127.0.0.1 (linux/publish.rs).
    #[serde(default)]
    pub publish: Vec<u16>,
    /// Hidden: tmpfs over directories, /dev/null over files.
    pub deny_read: Vec<PathBuf>,
    /// Made read-only with bind mounts, when they exist: the policy's
    /// `deny_write` plus the protected set (SPEC §4.5).
    pub deny_write: Vec<PathBuf>,
    /// Directories inside writable roots that must not be renamed or
    /// replaced, because a protection lies below them: made mount points.
    #[serde(default)]
    pub pin: Vec<PathBuf>,
    /// airlock's own outputs (audit log, report) inside writable roots.
    #[serde(default)]
    pub own_outputs: Vec<PathBuf>,
    /// The protected set, with the writable root each path lies in.
    #[serde(skip)]
    pub protected: Vec<crate::plan::protected::Protected>,
    /// `deny_read` globs in the middle of a path, as absolute globs: the
    /// Seatbelt profile compiles them to regexes; Linux mounts cannot.
    pub deny_read_globs: Vec<String>,
    /// `deny_read` as written (links not followed), for the watch on the
    /// names the host could move or link into place (linux/denywatch.rs).
    #[serde(default)]
    pub deny_read_names: Vec<PathBuf>,
    /// `.env` files found in the writable roots when the run starts
    /// (dotenv.rs): hidden by mounts like `deny_read` files, but kept apart
    /// because the degraded tier cannot carve a file out of a writable root
    /// without taking the root's own write access.
    #[serde(default)]
    pub deny_read_env: Vec<PathBuf>,
    /// Hidden files watched for reads (linux/readwatch.rs): each covered
    /// by its own empty file instead of `/dev/null`: (hidden, cover).
    #[serde(default)]
    pub deny_read_masks: Vec<(PathBuf, PathBuf)>,
    /// A project's tool configuration holding a registry credential,
    /// covered read-only by a copy without it (project_secrets.rs):
    /// (file, copy).
    #[serde(default)]
    pub sanitised: Vec<(PathBuf, PathBuf)>,
    /// The search for them stopped at its budget.
    #[serde(default)]
    pub deny_read_env_truncated: bool,
    /// Tool configuration files the `.env` search met below the roots,
    /// for project_secrets.rs.
    #[serde(skip)]
    pub project_configs: Vec<PathBuf>,
    /// Those of them git tracks with other content: git inside sees them
    /// emptied (dotenv_git.rs), which the run says.
    #[serde(default)]
    pub deny_read_env_in_git: Vec<PathBuf>,
    /// Deny entries the mount layer cannot express, for warnings.
    pub unsupported: Vec<String>,
    pub allow_degraded: bool,
    /// Set when the degraded tier runs (SPEC §4.4): no namespaces, the
    /// proxy on this host loopback port (`None` with `--network none`).
    #[serde(default, with = "degraded_serde")]
    pub degraded: Option<Option<u16>>,
    /// What only the macOS Seatbelt profile uses (SPEC §4.2).
    #[serde(default)]
    pub macos: crate::plan::macos::MacosPlan,
    /// Host pathname sockets left connectable (`[filesystem] unix_sockets`).
    #[serde(default)]
    pub unix_sockets: Vec<PathBuf>,
    #[serde(default)]
    pub limits: Limits,
    /// How the environment was filtered, for a session's commands.
    #[serde(skip)]
    pub env_rule: Option<crate::env::Rule>,
    /// Why the command cannot start in the caller's directory: the run
    /// is refused (`Plan::start_dir`).
    #[serde(skip)]
    pub start_note: Option<StartRefused>,
    /// Writes are not watched for the report (`AIRLOCK_BENCH_NO_WRITE_NOTES`,
    /// for measuring what watching costs; the boundary is the same).
    #[serde(default)]
    pub no_write_notes: bool,
    /// A session (SPEC §4.7): PID 1 starts the commands the supervisor
    /// sends, not `argv`.
    #[serde(default)]
    pub session: bool,
    /// `--review` (SPEC §4.8): each writable root is an overlay whose
    /// upper layer is the changeset's; empty without it.
    #[serde(default)]
    pub review: Vec<Layer>,
    /// The supervisor's log filter, for a helper forked before it was set
    /// up (`linux::Spawned::before_parsing`).
    #[serde(default)]
    pub log: String,
}

/// One writable root held for review: PID 1 mounts an overlay on `root`
/// with the host's tree below and `upper` (and overlayfs's `work`) in the
/// changeset, outside every sandbox's reach.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Layer {
    pub root: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
}

/// `Some(None)` (the degraded tier with `--network none`) must not travel
/// as JSON `null`, which reads back as `None` (the full tier): it goes as
/// `[null]`.
mod degraded_serde {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Option<u16>>, s: S) -> Result<S::Ok, S::Error> {
        v.map(|port| (port,)).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<u16>>, D::Error> {
        Ok(Option::<(Option<u16>,)>::deserialize(d)?.map(|(port,)| port))
    }
}

/// `[limits]` as the sandbox enforces them (SPEC §4.6).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Limits {
    pub pids: u32,
    /// Whether a policy set `pids` (then failing to enforce it is an error).
    pub pids_configured: bool,
    pub memory: Option<u64>,
    /// Bytes of the private /tmp and /dev/shm each.
    pub tmp: u64,
    /// Set by the supervisor as it starts the full tier: PID 1 caps pids
    /// with its PID namespace's own pid_max, and the helper sets no
    /// RLIMIT_NPROC (`linux/limits.rs`). One decision, carried to both.
    #[serde(default)]
    pub pids_by_pid_max: bool,
    /// Whether a policy set `tmp` (the degraded tier refuses to run when
    /// it cannot enforce it).
    #[serde(default)]
    pub tmp_configured: bool,
}

pub const DEFAULT_PIDS: u32 = 4096;
pub const DEFAULT_TMP: u64 = 1 << 30;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            pids: DEFAULT_PIDS,
            pids_configured: false,
            memory: None,
            tmp: DEFAULT_TMP,
            pids_by_pid_max: false,
            tmp_configured: false,
        }
    }
}

/// Follow symlinks where the path exists, so a mount covers the real target.
fn real(p: PathBuf) -> PathBuf {
    crate::resolve::canonical(&p).unwrap_or(p)
}

pub struct Options<'a> {
    pub argv: &'a [String],
    pub workspace: &'a Path,
    pub home: &'a Path,
    pub extra_write: &'a [PathBuf],
    pub read_only: bool,
    pub net: Net,
    pub allow_degraded: bool,
    pub host_env: Vec<(String, String)>,
    /// The caller's current directory, where the command starts when the
    /// sandbox can see it.
    pub cwd: Option<&'a Path>,
    /// Whether the Seatbelt side is wanted: on macOS, or for `policy
    /// profile --target macos` (it resolves every deny entry again).
    pub macos: bool,
}

pub fn net_mode(policy: &Policy, flag: Option<&str>) -> Result<Net, String> {
    let mode = match flag {
        Some("proxy") => NetworkMode::Proxy,
        Some("none") => NetworkMode::None,
        Some("host") => NetworkMode::Host,
        Some(other) => return Err(format!("--network {other}: expected proxy, none or host")),
        None => policy.mode.value,
    };
    if mode == NetworkMode::Host && policy.sandbox_required() {
        let at = policy
            .require_sandbox
            .as_ref()
            .map(|r| r.origin.to_string())
            .unwrap_or_default();
        return Err(format!(
            "--network host is refused: the managed policy requires the sandbox ({at})"
        ));
    }
    Ok(match mode {
        NetworkMode::Proxy => Net::Proxy,
        NetworkMode::None => Net::None,
        NetworkMode::Host => Net::Host,
    })
}

/// The roots searched for `.env` files: the workspace (read-only or not:
/// its secrets are the project's either way), `--write` and policy `write`
/// entries, but not the caches presets add (airlock's own, large, and
/// holding no project's secrets).
fn dotenv_roots(policy: &Policy, o: &Options, write: &[PathBuf]) -> Vec<PathBuf> {
    let res = |raw: &str| resolve_path(raw, o.home, o.workspace).map(real);
    let mut roots: Vec<PathBuf> = policy
        .write
        .iter()
        .filter(|w| !matches!(w.origin, airlock_policy::Origin::Preset { .. }))
        .filter_map(|w| res(&w.value))
        .chain(
            o.extra_write
                .iter()
                .filter_map(|p| res(&p.to_string_lossy())),
        )
        .filter(|p| write.contains(p))
        .chain([real(o.workspace.to_path_buf())])
        .collect();
    roots.sort();
    roots.dedup();
    // A root inside another is searched with it.
    let all = roots.clone();
    roots.retain(|r| !all.iter().any(|o| o != r && r.starts_with(o)));
    roots
}

pub fn build(policy: &Policy, o: &Options) -> Plan {
    let res = |raw: &str| resolve_path(raw, o.home, o.workspace);
    let mut unsupported = vec![];
    let mut globs = vec![];
    let mut paths = |list: &[airlock_policy::Located<String>], what: &str| -> Vec<PathBuf> {
        let mut out = vec![];
        for e in list {
            match res(&e.value) {
                Some(p) => out.push(real(p)),
                None => {
                    unsupported.push(format!("{what} {:?} ({})", e.value, e.origin));
                    if what == "deny_read" {
                        globs.push(absolute_glob(&e.value, o.home, o.workspace));
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    };
    let read = paths(&policy.read, "read");
    let mut deny_read = paths(&policy.deny_read, "deny_read");
    let mut deny_read_names: Vec<PathBuf> = policy
        .deny_read
        .iter()
        .filter_map(|e| res(&e.value))
        .collect();
    // The CA key never enters the sandbox, inspection or not.
    if let Some(ca) = airlock_ca::default_dir() {
        deny_read_names.push(ca.clone());
        deny_read.push(real(ca));
    }
    let mut deny_write = paths(&policy.deny_write, "deny_write");
    // airlock's own user policy: a sandbox that could write it could allow itself anything.
    if let Some(dir) =
        crate::places::user_policy_path().and_then(|p| p.parent().map(Path::to_path_buf))
    {
        deny_write.push(real(dir));
    }
    let unix_sockets = paths(&policy.unix_sockets, "unix_sockets");
    let mut write: Vec<PathBuf> = paths(&policy.write, "write");
    let workspace = real(o.workspace.to_path_buf());
    if o.read_only {
        write.retain(|p| !p.starts_with(&workspace));
    }
    write.extend(
        o.extra_write
            .iter()
            .filter_map(|p| res(&p.to_string_lossy()))
            .map(real),
    );
    write.retain(|p| p.exists());
    // The quarantine holds what earlier checks set aside, a file of the
    // user's among it at times (one made on the host while a session ran):
    // no later sandbox reads it (red team round 16).
    for w in &write {
        let q = w.join(".airlock/quarantine");
        if std::fs::symlink_metadata(&q).is_ok_and(|m| m.is_dir()) {
            deny_read.push(q);
        }
    }
    write.sort();
    write.dedup();
    let env_found = crate::dotenv::find_with_prefetch(&dotenv_roots(policy, o, &write));
    // The protected set (SPEC §4.5): what lies in a writable root and is
    // obeyed or run later. What exists is made read-only; every ancestor
    // whose parent is writable is pinned, so no rename carries it away.
    let mut airlock_files = crate::places::managed_policy_files();
    airlock_files
        .extend(crate::places::user_policy_path().and_then(|p| p.parent().map(Path::to_path_buf)));
    airlock_files.extend(airlock_ca::default_dir());
    // A hidden login reached through a link (a dotfile manager's `~/.kube
    // -> dotfiles/kube`) is covered where it leads; the link's own name is
    // protected too, or a run swaps it for a directory of its own that the
    // host's tools then obey (red team round 10).
    let linked: Vec<PathBuf> = deny_read_names
        .iter()
        .filter(|n| real(n.to_path_buf()) != **n)
        .cloned()
        .collect();
    let protected = crate::plan::protected::compute(&crate::plan::protected::Inputs {
        roots: &write,
        home: o.home,
        deny_write: &deny_write,
        deny_read: &[deny_read.as_slice(), linked.as_slice()].concat(),
        airlock_files: &airlock_files,
    });
    let denied = crate::paths::Prefixes::new(&deny_read);
    for p in &protected {
        let path = p.path();
        let is_git_dir = path.file_name() == Some(std::ffi::OsStr::new(".git"))
            && path.is_dir()
            && !path.is_symlink();
        let hidden = denied.covers(&path);
        if !is_git_dir && !hidden && std::fs::symlink_metadata(&path).is_ok() {
            deny_write.push(real(path));
        }
    }
    // airlock's own state (held changesets, sessions) is read-only where a
    // writable root holds it (HOME writable): a sandbox that rewrote a held
    // changeset would have `changes apply` write its hooks. Kept out of the
    // protected set: airlock itself writes there while the sandbox runs
    // (this run's changeset, a session's records), which the post-run
    // check would take for the sandbox's. Its ancestors are pinned below.
    for d in crate::places::own_state_dirs() {
        if write.iter().any(|r| crate::paths::under(&d, r)) {
            deny_write.push(d);
        }
    }
    deny_write.sort();
    deny_write.dedup();
    // The `.env` files found too: a directory that holds one, renamed
    // where the next run's search does not look (`node_modules`, a link
    // in its place), would carry the secret out of its cover (red team
    // round 8). Inside the sandbox such a directory cannot be renamed.
    let pin_targets: Vec<PathBuf> = protected
        .iter()
        .map(crate::plan::protected::Protected::path)
        .chain(deny_read.iter().cloned())
        .chain(deny_write.iter().cloned())
        .chain(env_found.files.iter().cloned())
        // A found `.env` that is a link is hidden where it leads: the
        // directories on the way there are pinned too, or run 1 moves
        // them and the dangling link is dropped from the next search
        // (red team round 9).
        .chain(
            env_found
                .files
                .iter()
                .filter_map(|p| crate::resolve::canonical(p).filter(|c| c != p)),
        )
        .collect();
    let pin = crate::plan::protected::ancestors_to_pin(&pin_targets, &write);
    let tmp_binds = write
        .iter()
        .filter(|p| p.starts_with("/tmp") && p.as_path() != Path::new("/tmp"))
        .cloned()
        .collect();

    // The variables credentials are read from: the proxy adds them, and
    // the sandbox never sees them (SPEC §3.1), whatever their names.
    let credential_vars = std::cell::RefCell::new(vec![]);
    for c in &policy.credentials {
        let _ = airlock_policy::request::expand_env(&c.value, |name| {
            credential_vars.borrow_mut().push(name.to_string());
            Some(String::new())
        });
    }
    let mut credential_vars = credential_vars.into_inner();
    // And those a preset read a credential from (npm's `${NAME}` in a
    // token), with the preset on or not: the token never enters the
    // sandbox, whichever way it is spelled.
    for r in policy.presets.iter().chain([&policy.secrets]) {
        credential_vars.extend(r.withheld_env.iter().cloned());
    }
    let env_rule = crate::env::Rule {
        inherit: policy.env_inherit.value,
        pass: policy.env_pass.clone(),
        set: policy
            .env_set
            .iter()
            .map(|(k, v)| (k.clone(), v.value.clone()))
            .collect(),
        also_secret: credential_vars,
        drop_proxy: o.net != Net::Host,
    };
    let scrubbed = env_rule.apply(o.host_env.clone());
    let mut env = scrubbed.env;
    if o.net == Net::Proxy {
        crate::env::add_proxy(&mut env, SANDBOX_PROXY_PORT);
    }
    let mut plan = Plan {
        argv: o.argv.to_vec(),
        env,
        withheld_env: scrubbed.withheld,
        env_warnings: scrubbed.warnings,
        env_rule: Some(env_rule),
        cwd: workspace.clone(),
        net: o.net,
        read,
        write,
        tmp_binds,
        tmp_read_binds: vec![],
        publish: vec![],
        deny_read,
        deny_write,
        pin,
        own_outputs: vec![],
        protected,
        deny_read_globs: globs,
        deny_read_names,
        deny_read_env: env_found.files,
        deny_read_env_truncated: env_found.truncated,
        project_configs: env_found.configs.clone(),
        deny_read_env_in_git: env_found.git_emptied,
        deny_read_masks: vec![],
        sanitised: vec![],
        unsupported,
        allow_degraded: o.allow_degraded,
        degraded: None,
        macos: if o.macos {
            crate::plan::macos::MacosPlan::from_policy(policy, o.home, o.workspace)
        } else {
            Default::default()
        },
        unix_sockets,
        limits: Limits {
            pids: policy.pids.as_ref().map_or(DEFAULT_PIDS, |p| p.value),
            pids_configured: policy.pids.is_some(),
            memory: policy.memory.as_ref().map(|m| m.value),
            tmp: policy.tmp.as_ref().map_or(DEFAULT_TMP, |t| t.value),
            pids_by_pid_max: false,
            tmp_configured: policy.tmp.is_some(),
        },
        log: String::new(),
        start_note: None,
        no_write_notes: std::env::var_os("AIRLOCK_BENCH_NO_WRITE_NOTES").is_some(),
        session: false,
        review: vec![],
    };
    // The command starts where it was asked to (SPEC §2): the caller's
    // directory, unless the sandbox cannot see it.
    if let Some(cwd) = o.cwd {
        match plan.start_dir(cwd) {
            Ok(dir) => plan.cwd = dir,
            Err(why) => plan.start_note = Some(why),
        }
    }
    plan.env
        .insert("PWD".into(), plan.cwd.display().to_string());
    plan
}

impl Plan {
    /// What PID 1's mounts cover (mounts.rs): every `deny_read` path and
    /// found `.env` file (where its link leads), as they exist now, kept
    /// by `keep` on their metadata (links followed).
    pub fn covered(&self, keep: impl Fn(&std::fs::Metadata) -> bool) -> Vec<PathBuf> {
        self.covered_where(|_| true, keep)
    }

    /// [`Plan::covered`], in the supervisor as it starts the run: a path
    /// that did not resolve when the plan was made, moments ago, is not
    /// looked up again (most of the built-in list is absent on a machine).
    /// Not for the helper, whose answers must postdate its watch.
    pub fn covered_at_start(&self, keep: impl Fn(&std::fs::Metadata) -> bool) -> Vec<PathBuf> {
        self.covered_where(|p| !crate::resolve::known_absent(p), keep)
    }

    fn covered_where(
        &self,
        look: impl Fn(&Path) -> bool,
        keep: impl Fn(&std::fs::Metadata) -> bool,
    ) -> Vec<PathBuf> {
        self.deny_read
            .iter()
            .cloned()
            .chain(
                self.deny_read_env
                    .iter()
                    .filter_map(|p| crate::resolve::canonical(p)),
            )
            .filter(|p| look(p) && std::fs::metadata(p).is_ok_and(|m| keep(&m)))
            .collect()
    }

    /// The hidden directories that exist: a read below one fails with
    /// "Permission denied" and nothing reports it (linux/readwatch.rs).
    /// airlock's own (its CA) is no secret of the user's to name.
    pub fn hidden_dirs(&self) -> Vec<PathBuf> {
        let own = crate::places::ca_dir().ok();
        self.deny_read
            .iter()
            .filter(|p| own.as_ref().is_none_or(|o| !p.starts_with(o)))
            .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
            .cloned()
            .collect()
    }

    /// The hidden directories the command's own words name (`cat
    /// ~/.ssh/id_rsa`, `ls $HOME/.aws`, `.aws/config` from HOME): a read
    /// below one fails with "Permission denied" and raises no event to
    /// report it by (linux/readwatch.rs), so a command that failed and
    /// named one is told so, each time, at the point of failure (harness
    /// round 12). Words only: a path the command builds is not seen.
    pub fn hidden_named(&self, argv: &[String], cwd: &Path) -> Vec<PathBuf> {
        let home = self.env.get("HOME").map(PathBuf::from);
        let hidden = self.hidden_dirs();
        hidden
            .into_iter()
            .filter(|h| {
                let mut forms = vec![(h.display().to_string(), false)];
                if let Some(rel) = home.as_ref().and_then(|home| h.strip_prefix(home).ok()) {
                    for head in ["~/", "$HOME/", "${HOME}/"] {
                        forms.push((format!("{head}{}", rel.display()), false));
                    }
                }
                if let Ok(rel) = h.strip_prefix(cwd) {
                    forms.push((rel.display().to_string(), true));
                }
                argv.iter()
                    .any(|a| forms.iter().any(|(f, rel)| names(a, f, *rel)))
            })
            .collect()
    }

    /// Where a command asked to start in `wanted` starts: that directory,
    /// as the sandbox sees it, or why the sandbox cannot use it. It is
    /// then refused, never moved to the workspace root: `rm -rf *` or
    /// `git clean -fdx` meant for a scratch directory would land in the
    /// project (harness round 12).
    pub fn start_dir(&self, wanted: &Path) -> Result<PathBuf, StartRefused> {
        let dir = real(lexical(wanted));
        let shown = crate::text::shown(&dir);
        let refused = |why: &str, bring: Option<String>| StartRefused {
            dir: shown.clone(),
            why: why.to_string(),
            bring_in: bring,
        };
        let under = |roots: &[PathBuf]| roots.iter().any(|r| dir.starts_with(r));
        if !under(&self.read) && !under(&self.write) {
            return Err(refused(
                "it is outside every readable root",
                Some(format!("--read {shown}")),
            ));
        }
        if under(&self.deny_read) {
            return Err(refused("it is hidden by deny_read", None));
        }
        if dir == Path::new("/tmp") {
            return Err(refused(
                "the sandbox has a private /tmp of its own; the host's is not there",
                None,
            ));
        }
        if dir.starts_with("/tmp") && !under(&self.tmp_binds) && !under(&self.tmp_read_binds) {
            return Err(refused(
                "it is under the host's /tmp, and the sandbox's /tmp is a private one of its own",
                Some(format!("--write {shown}")),
            ));
        }
        if ["/run", "/var/run", "/dev/shm", "/proc"]
            .iter()
            .any(|h| dir.starts_with(h))
        {
            return Err(refused("it is hidden inside the sandbox", None));
        }
        Ok(dir)
    }
}

/// Whether `text` names `path` as a word: what comes before is not part
/// of a longer name (for a relative path, not a `/` either), and what
/// follows ends the name or goes below it.
fn names(text: &str, path: &str, relative: bool) -> bool {
    if path.is_empty() {
        return false;
    }
    let part = |c: char| c.is_alphanumeric() || matches!(c, '.' | '-' | '_' | '~' | '$' | '}');
    text.match_indices(path).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + path.len()..].chars().next();
        before.is_none_or(|c| !(part(c) || (relative && c == '/')))
            && after.is_none_or(|c| c == '/' || !part(c))
    })
}

/// Why a command cannot start in the caller's directory.
#[derive(Debug, Clone)]
pub struct StartRefused {
    pub dir: String,
    pub why: String,
    /// The option that would bring the directory in, if one can.
    pub bring_in: Option<String>,
}

impl StartRefused {
    /// The refusal, with the ways on: `flag` words how a sandbox-shaping
    /// option is given (`"give it"`, or `"start a session with"`).
    pub fn said(&self, seen: &Path, with: &str) -> String {
        let bring = self
            .bring_in
            .as_ref()
            .map_or(String::new(), |b| format!(", or {with} {b}"));
        let seen = crate::text::shown(seen);
        // The workspace itself, when it is the refused directory, is no
        // example (red team round 15).
        let example = match seen == self.dir {
            true => String::new(),
            false => format!(", such as {seen}"),
        };
        format!(
            "refused: the command would start in {}, which the sandbox cannot use ({}); it is not run elsewhere instead: cd first into a directory the sandbox sees{example}{bring}",
            self.dir, self.why
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_degraded_tier_without_a_port_survives_the_trip() {
        for d in [None, Some(None), Some(Some(4000))] {
            let mut v = serde_json::json!({});
            v["degraded"] = serde_json::to_value(d.map(|p: Option<u16>| (p,))).unwrap();
            #[derive(Deserialize)]
            struct T {
                #[serde(default, with = "degraded_serde")]
                degraded: Option<Option<u16>>,
            }
            let t: T = serde_json::from_value(v).unwrap();
            assert_eq!(t.degraded, d);
        }
    }

    #[test]
    fn a_command_names_a_path_as_a_word() {
        for (text, path, rel, want) in [
            ("cat /h/.ssh/id_rsa", "/h/.ssh", false, true),
            ("ls /h/.ssh", "/h/.ssh", false, true),
            ("ls '/h/.ssh'", "/h/.ssh", false, true),
            ("ls /h/.sshx", "/h/.ssh", false, false),
            ("ls /x/h/.ssh", "/h/.ssh", false, false),
            ("ls a/h/.ssh", "/h/.ssh", false, false),
            ("cat ~/.aws/config", "~/.aws", false, true),
            ("cat .aws/config", ".aws", true, true),
            ("cat x/.aws/config", ".aws", true, false),
            ("cat my.aws/config", ".aws", true, false),
            ("", ".aws", true, false),
        ] {
            assert_eq!(names(text, path, rel), want, "{text} {path}");
        }
    }

    #[test]
    fn paths_resolve_against_home_and_workspace() {
        let (h, w) = (Path::new("/home/u"), Path::new("/work/p"));
        assert_eq!(
            resolve_path("~/.ssh", h, w).unwrap(),
            PathBuf::from("/home/u/.ssh")
        );
        assert_eq!(
            resolve_path(".git/hooks", h, w).unwrap(),
            PathBuf::from("/work/p/.git/hooks")
        );
        assert_eq!(
            resolve_path("secrets/**", h, w).unwrap(),
            PathBuf::from("/work/p/secrets")
        );
        assert_eq!(
            resolve_path("../x", h, w).unwrap(),
            PathBuf::from("/work/x")
        );
        assert_eq!(resolve_path(".", h, w).unwrap(), PathBuf::from("/work/p"));
        assert!(resolve_path("a/*/b", h, w).is_none());
    }
}
