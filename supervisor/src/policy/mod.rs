//! Gathering policy from its places (SPEC §3.3): built-in defaults, the
//! user file, the project file, the command line and the managed file;
//! with trust in project files (`trust`) and the machine as presets see
//! it (`machine`). The policy stage of the pipeline (SPEC §1): it takes
//! the request's flags and gives the plan stage a `Built` policy.

pub mod machine;
pub mod trust;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use airlock_policy::{
    flag_rule, load_str, parse_cidr, Diagnostic, Fragment, Host, Layer, Located, Origin,
    PatternList, Policy,
};
use anyhow::{bail, Context, Result};

use crate::cli::PolicyArgs;
use crate::places::{managed_policy_path, user_policy_path};
use crate::text::shown;
use machine::{Sandboxed, SystemProbe};
use trust::Trust;

pub fn format_diagnostics(diags: &[Diagnostic]) -> String {
    diags
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Load one file; `Ok(None)` when it does not exist and need not.
pub fn load_file(
    path: &Path,
    layer: Layer,
    required: bool,
) -> Result<Option<Fragment>, Vec<Diagnostic>> {
    let shown = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => load_str(&text, &shown, layer).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => Ok(None),
        Err(e) => Err(vec![Diagnostic {
            file: shown,
            line: 1,
            column: 1,
            message: format!("cannot read: {e}"),
        }]),
    }
}

/// The workspace (SPEC §2): `--workspace`, else the nearest ancestor of the
/// current directory that holds `airlock.toml` or `.git`, else the current
/// directory. Returns it and whether it was named explicitly.
pub fn workspace_dir(args: &PolicyArgs) -> Result<(PathBuf, bool)> {
    if let Some(w) = &args.workspace {
        let dir = std::fs::canonicalize(w)
            .with_context(|| format!("workspace {} does not exist", w.display()))?;
        return Ok((dir, true));
    }
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let cwd = std::fs::canonicalize(&cwd).context("cannot resolve the current directory")?;
    // A project policy anywhere above wins over a nearer repository: a
    // sandbox that creates `sub/.git` must not make `sub` the next run's
    // workspace and so drop the project's restrictions. A `.git` counts only
    // when git would take it as one.
    let policy_root = cwd
        .ancestors()
        .find(|d| std::fs::symlink_metadata(d.join("airlock.toml")).is_ok());
    let git_root = || cwd.ancestors().find(|d| is_repository(&d.join(".git")));
    let found = policy_root.or_else(git_root).map(Path::to_path_buf);
    Ok((found.unwrap_or(cwd), false))
}

/// The project a workspace belongs to, whose airlock-owned caches it gets
/// (SPEC §3.4): the nearest directory from the workspace upwards that git
/// would take as a repository's top level, else the workspace. The search
/// stops below HOME and `/` (a dotfiles repository there is not a project
/// every directory below shares). Found here, outside the sandbox, from
/// the canonical workspace: a run cannot choose the path it starts from,
/// and a `.git` a sandbox made can name only a directory it could write
/// all along, so no key it shapes reaches another project's caches.
pub fn project_root(workspace: &Path) -> PathBuf {
    let home = std::env::var_os("HOME").and_then(|h| std::fs::canonicalize(h).ok());
    project_root_in(workspace, home.as_deref())
}

fn project_root_in(workspace: &Path, home: Option<&Path>) -> PathBuf {
    let workspace = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    for dir in workspace.ancestors() {
        if dir == Path::new("/") || home == Some(dir) {
            break;
        }
        if is_repository(&dir.join(".git")) {
            return dir.to_path_buf();
        }
    }
    workspace
}

/// Whether git would take this `.git` entry as a repository: a directory
/// holding `HEAD`, or a file pointing elsewhere with `gitdir:`.
fn is_repository(dot_git: &Path) -> bool {
    match std::fs::symlink_metadata(dot_git) {
        Ok(m) if m.is_dir() => std::fs::symlink_metadata(dot_git.join("HEAD")).is_ok(),
        Ok(m) if m.is_file() => std::fs::read(dot_git).is_ok_and(|b| b.starts_with(b"gitdir:")),
        _ => false,
    }
}

/// `run` makes the workspace writable: `/` and HOME only when named.
pub fn check_workspace_scope(workspace: &Path, explicit: bool) -> Result<()> {
    if explicit {
        return Ok(());
    }
    let home = std::env::var_os("HOME").and_then(|h| std::fs::canonicalize(h).ok());
    if workspace == Path::new("/") || home.as_deref() == Some(workspace) {
        bail!(
            "the workspace would be {} (found from the current directory), and `run` makes the workspace writable; \
             name it explicitly with --workspace {} if that is really meant, or cd into a project",
            shown(workspace),
            shown(workspace)
        );
    }
    Ok(())
}

fn loc<T>(value: T, flag: &str, text: &str) -> Located<T> {
    Located::new(
        value,
        Layer::CommandLine,
        Origin::Flag {
            flag: format!("{flag} {text}"),
        },
    )
}

/// The fragment made of command-line flags.
pub fn flags_fragment(args: &PolicyArgs) -> Result<Fragment> {
    let mut f = Fragment::empty(Layer::CommandLine, "command line");
    for (list, name, values) in [
        (PatternList::Allow, "--allow", &args.allow),
        (PatternList::Deny, "--deny", &args.deny),
        (PatternList::Inspect, "--inspect", &args.inspect),
    ] {
        for v in values {
            let rule = flag_rule(name, v, list).map_err(anyhow::Error::msg)?;
            match list {
                PatternList::Allow => f.allow.push(rule),
                PatternList::Deny => f.deny.push(rule),
                PatternList::Inspect => f.inspect.push(rule),
            }
        }
    }
    for r in &args.resolve {
        let (host, ip) = r
            .split_once('=')
            .with_context(|| format!("--resolve {r}: write HOST=IP"))?;
        let host = match Host::parse(host).with_context(|| format!("--resolve {r}"))? {
            h @ Host::Name(_) => h,
            Host::Ip(_) => bail!("--resolve {r}: {host} is already an address"),
        };
        let ip: IpAddr = ip
            .trim_matches(['[', ']'])
            .parse()
            .with_context(|| format!("--resolve {r}: {ip:?} is not an IP address"))?;
        f.resolve.push((host, loc(ip, "--resolve", r)));
    }
    for c in &args.allow_private {
        let net = parse_cidr(c).map_err(|e| anyhow::anyhow!("--allow-private {c}: {e}"))?;
        f.allow_private.push(loc(net, "--allow-private", c));
    }
    for p in &args.preset {
        if airlock_policy::preset::find(p).is_none() {
            bail!("--preset {p}: unknown preset; `airlock policy presets` lists them");
        }
        f.presets.push(loc(p.clone(), "--preset", p));
    }
    for ca in &args.upstream_ca {
        let s = ca.display().to_string();
        f.upstream_ca.push(loc(s.clone(), "--upstream-ca", &s));
    }
    if let Some(a) = &args.audit_log {
        let s = a.display().to_string();
        f.audit_log = Some(loc(s.clone(), "--audit-log", &s));
    }
    if let Some(o) = &args.otlp {
        f.audit_otlp = Some(loc(o.clone(), "--otlp", o));
    }
    Ok(f)
}

/// Load a file that may lie in a writable root: read once, check its
/// content against the trust store, and parse exactly those bytes.
fn load_checked(
    path: &Path,
    layer: Layer,
    required: bool,
    trust: &Trust,
) -> Result<Option<Fragment>, Vec<Diagnostic>> {
    let shown_path = path.display().to_string();
    let bytes = match crate::paths::read_no_follow(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => return Ok(None),
        Err(e) => {
            // Name the cause the user can act on: an absent file is just
            // that; ELOOP is the link we refuse to follow.
            let message = match (e.kind(), e.raw_os_error()) {
                (std::io::ErrorKind::NotFound, _) => "no such file".to_string(),
                (_, Some(libc::ELOOP)) => {
                    "is a symbolic link; a policy file that may lie in a writable root must be a regular file (name the link's target instead)".to_string()
                }
                _ if e.to_string() == "not a regular file" => {
                    "not a regular file (a policy file must be a regular file)".to_string()
                }
                _ => format!("cannot read: {e}"),
            };
            return Err(vec![Diagnostic {
                file: shown_path,
                line: 1,
                column: 1,
                message,
            }]);
        }
    };
    trust.check(path, &bytes);
    let text = String::from_utf8_lossy(&bytes);
    let frag = load_str(&text, &shown_path, layer)?;
    for e in crate::policy::trust::fragment_effect(&frag) {
        trust.add_effect(path, e);
    }
    Ok(Some(frag))
}

/// Every fragment that applies to a run in `workspace`, lowest layer first.
pub fn gather(
    args: &PolicyArgs,
    workspace: &Path,
    trust: &Trust,
    named: Named,
) -> Result<Vec<Fragment>> {
    let mut frags = vec![Fragment::built_in()];
    let mut errors = vec![];
    let mut push = |r: Result<Option<Fragment>, Vec<Diagnostic>>| match r {
        Ok(Some(f)) => frags.push(f),
        Ok(None) => {}
        Err(d) => errors.extend(d),
    };
    if let Some(user) = user_policy_path() {
        push(load_file(&user, Layer::User, false));
    }
    push(load_checked(
        &workspace.join("airlock.toml"),
        Layer::Project,
        false,
        trust,
    ));
    for p in &args.policy {
        match named {
            Named::NeedTrust => push(load_checked(p, Layer::CommandLine, true, trust)),
            Named::AsGiven => push(load_file(p, Layer::CommandLine, true)),
        }
    }
    let (managed, required) = managed_policy_path()?;
    push(load_file(&managed, Layer::Managed, required));
    if !errors.is_empty() {
        bail!("invalid policy:\n{}", format_diagnostics(&errors));
    }
    frags.push(flags_fragment(args)?);
    Ok(frags)
}

/// A merged policy and what went into it.
pub struct Built {
    pub policy: Policy,
    pub workspace: PathBuf,
    /// The workspace was named with `--workspace`.
    pub explicit_workspace: bool,
    /// Project files in a writable root that are new or changed since they
    /// were trusted: `run` and `proxy` refuse while any is listed.
    pub untrusted: Vec<crate::policy::trust::Untrusted>,
    /// Every file below a writable root that was read, with its hash.
    pub read_files: Vec<(PathBuf, String)>,
}

impl Built {
    /// Refuse, as `run` and `proxy` do, when project configuration is untrusted.
    pub fn require_trusted(&self) -> Result<()> {
        if self.untrusted.is_empty() {
            return Ok(());
        }
        bail!(
            "{}",
            crate::policy::trust::refusal(&self.untrusted, &self.workspace)
        )
    }

    /// Warn, as `explain`, `profile` and `presets` do.
    pub fn warn_untrusted(&self) {
        if !self.untrusted.is_empty() {
            eprintln!(
                "airlock: warning: shown with project files applied that `run` would refuse until trusted:\n{}",
                crate::policy::trust::refusal(&self.untrusted, &self.workspace)
            );
        }
    }
}

/// How `--policy` files are taken.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Named {
    /// `run`: one inside a writable root needs trust like the project policy.
    NeedTrust,
    /// `proxy` has no writable roots: the operator's files are taken as given
    /// (the discovered project policy still needs trust).
    AsGiven,
}

/// Gather, merge and resolve presets. `extra_roots` are writable paths the
/// caller adds (`--write`): files below them need trust too.
/// `sandboxed` runs the presets' probes of their tools (the sandbox
/// stage's `probe::Runner`).
pub fn build_policy(
    args: &PolicyArgs,
    extra_roots: &[PathBuf],
    named: Named,
    sandboxed: &dyn Sandboxed,
) -> Result<Built> {
    let (workspace, explicit_workspace) = workspace_dir(args)?;
    let mut roots = vec![workspace.clone()];
    roots.extend(
        extra_roots
            .iter()
            .filter_map(|p| std::fs::canonicalize(p).ok()),
    );
    let trust = Trust::new(roots);
    let frags = gather(args, &workspace, &trust, named)?;
    // Every path a layer makes writable is a root too: a file a preset reads
    // from there could have been written by a sandbox.
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/".into());
    let resolve = |raw: &str| {
        crate::paths::resolve_path(raw, &home, &workspace)
            .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
    };
    trust.extend_roots(
        frags
            .iter()
            .flat_map(|f| f.write.iter())
            .filter_map(|w| resolve(&w.value)),
    );
    let probe = SystemProbe {
        workspace: workspace.clone(),
        project: project_root(&workspace),
        trust: &trust,
        sandboxed,
    };
    let policy = Policy::build(frags, &probe);
    for c in &policy.conflicts {
        tracing::warn!("{c}");
    }
    // The final writable roots, presets' caches included.
    trust.extend_roots(policy.write.iter().filter_map(|w| resolve(&w.value)));
    // A tool configuration's effect: the hosts presets took from it.
    let read = trust.read_files();
    let bare = |h: &str| h.split(':').next().unwrap_or(h).to_ascii_lowercase();
    for r in &policy.presets {
        for (host, from) in &r.hosts {
            for (path, _) in &read {
                if from.starts_with(&path.display().to_string()) {
                    trust.add_effect(path, format!("allows host {host} (preset {})", r.name));
                    // Which of the user's credentials would go there.
                    for c in r.credentials.iter().filter(|c| bare(&c.host) == bare(host)) {
                        trust.add_effect(
                            path,
                            format!(
                                "sends the credential from {} (header {}) to {}",
                                c.from, c.header, c.host
                            ),
                        );
                    }
                }
            }
        }
        // A credential found in the file itself, and where it goes.
        for c in &r.credentials {
            for (path, _) in &read {
                if c.from.starts_with(&path.display().to_string()) {
                    trust.add_effect(
                        path,
                        format!(
                            "sends the credential found in it (header {}) to {} (preset {})",
                            c.header, c.host, r.name
                        ),
                    );
                }
            }
        }
    }
    Ok(Built {
        policy,
        workspace,
        explicit_workspace,
        untrusted: trust.untrusted(),
        read_files: trust.read_files(),
    })
}

/// Request rules and credentials that can never apply: no allow rule
/// covers their host and port. (A rule's host is always inspected: the
/// rule implies it, as a credential does.)
pub fn never_apply(policy: &Policy) -> Vec<String> {
    let mut out = vec![];
    let allowed = |p: &airlock_policy::Pattern| policy.allow.iter().any(|a| a.value.overlaps(p));
    let asks = policy.asks();
    for r in &policy.request_rules {
        let at = &r.origin.origin;
        if !allowed(&r.host) {
            out.push(format!(
                "{at}: the request rule for {:?} can never apply: no allow rule covers that host and port{}",
                r.host.text,
                if asks { " (only an approval would)" } else { "" }
            ));
        }
    }
    for c in &policy.credentials {
        if !allowed(&c.host) {
            // The usual cause: the credential names the host alone (ports
            // 80 and 443) while the allow rule names another port.
            let same_host = policy
                .allow
                .iter()
                .map(|a| a.value.text.as_str())
                .find(|a| {
                    !c.host.text.contains(':')
                        && a.strip_prefix(c.host.text.as_str())
                            .is_some_and(|p| p.starts_with(':'))
                });
            let fix = match same_host {
                Some(a) => format!(
                    "; a host without a port means ports 80 and 443, and the allow rule is {a:?}: write host = {a:?} in the credential"
                ),
                None => String::new(),
            };
            out.push(format!(
                "{}: the credential for {:?} can never be sent: no allow rule covers that host and port{}{fix}",
                c.origin.origin,
                c.host.text,
                if asks { " (only an approval would)" } else { "" }
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_project_is_the_git_top_level_below_home() {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        let home = root.join("home");
        let repo = home.join("src/repo");
        let deep = repo.join("a/b");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::create_dir_all(home.join("plain/x")).unwrap();
        // Not a repository yet: the workspace itself.
        assert_eq!(project_root_in(&deep, Some(&home)), deep);
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::write(repo.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        assert_eq!(project_root_in(&deep, Some(&home)), repo);
        // Through a link: the canonical path.
        std::os::unix::fs::symlink(&repo, root.join("via")).unwrap();
        assert_eq!(project_root_in(&root.join("via/a"), Some(&home)), repo);
        // A worktree's `.git` file.
        let wt = home.join("src/wt");
        std::fs::create_dir_all(&wt).unwrap();
        std::fs::write(wt.join(".git"), "gitdir: /elsewhere\n").unwrap();
        assert_eq!(project_root_in(&wt, Some(&home)), wt);
        // A dotfiles repository in HOME is not every directory's project;
        // HOME itself, named as the workspace, is its own.
        std::fs::create_dir_all(home.join(".git")).unwrap();
        std::fs::write(home.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        let plain = home.join("plain/x");
        assert_eq!(project_root_in(&plain, Some(&home)), plain);
        assert_eq!(project_root_in(&home, Some(&home)), home);
        // An empty `.git` directory is no repository.
        std::fs::create_dir_all(home.join("plain/.git")).unwrap();
        assert_eq!(project_root_in(&plain, Some(&home)), plain);
    }
}
