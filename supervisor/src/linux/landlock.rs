//! Landlock (SPEC §4.1 step 5): read on the read roots, read-write on the
//! writable roots, every filesystem right the running kernel's ABI knows,
//! and abstract-socket and signal scoping from ABI 6. Following the
//! kernel's sandboxer example: ask the kernel for its ABI, handle exactly
//! that, and treat anything less than full enforcement as an error.
//!
//! The read grant is split around `deny_read` paths outside the writable
//! roots (`read_splits`, `carve`), present or absent, so that `deny_read`
//! holds for what the host creates or replaces during the run (SPEC §4.5).

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use landlock::{
    Access, AccessFs, AccessNet, BitFlags, Compatible, NetPort, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

/// The Landlock ABI the kernel offers: 0 when it has none (not built in, or
/// not enabled at boot: add `landlock` to the `lsm=` boot parameter).
pub fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query takes no ruleset attributes.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        0
    } else {
        v as i32
    }
}

/// The newest ABI both the kernel and this build know.
fn abi_for(v: i32) -> ABI {
    match v {
        ..=0 => ABI::Unsupported,
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        _ => ABI::V6,
    }
}

/// What the ruleset will be, for `airlock policy profile`.
pub fn describe(
    read: &[PathBuf],
    write: &[PathBuf],
    deny_read: &[PathBuf],
    abi: i32,
) -> Vec<String> {
    let abi = abi_for(abi);
    let names: Vec<String> = AccessFs::from_all(abi)
        .iter()
        .map(|a| format!("{a:?}"))
        .collect();
    let mut out = vec![format!("handled: {}", names.join(", "))];
    out.extend(read.iter().map(|p| format!("read    {}", p.display())));
    out.extend(write.iter().map(|p| format!("write   {}", p.display())));
    let (_, split) = carve(read, &read_splits(deny_read, write));
    if !split.is_empty() {
        out.push("split for deny_read (entries granted one by one; one made during the run is unreadable):".into());
    }
    out.extend(split.iter().map(|p| format!("split   {}", p.display())));
    if abi >= ABI::V6 {
        out.push("scoped: abstract unix sockets, signals".into());
    }
    out
}

/// Inodes that must never carry a read or write rule: every `denied`
/// path that exists, and every directory split around one (`listable`: a
/// grant there would cover what it holds).
fn guarded(denied: &[PathBuf], listable: &[PathBuf]) -> HashSet<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    denied
        .iter()
        .chain(listable)
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect()
}

/// A rule on `path` itself. The carve decided it from a listing: a link
/// swapped in since (by another sandbox that can write there, say) would
/// move the grant to wherever it leads, so links are not followed and the
/// inode opened is checked against `guarded`. The rights are cut to a
/// file's when it is not a directory (told by the handle: a second lookup
/// by path could land elsewhere).
fn rule(
    path: &Path,
    dir_access: BitFlags<AccessFs>,
    abi: ABI,
    guarded: &HashSet<(u64, u64)>,
) -> Option<PathBeneath<OwnedFd>> {
    use nix::fcntl::{open, OFlag};
    let fd = match open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::debug!("landlock: skipping {}: {e}", path.display());
            return None;
        }
    };
    let st = nix::sys::stat::fstat(&fd).ok()?;
    let kind = st.st_mode & libc::S_IFMT;
    if kind == libc::S_IFLNK {
        tracing::warn!("landlock: {} became a link; not granted", path.display());
        return None;
    }
    #[allow(clippy::unnecessary_cast)]
    if guarded.contains(&(st.st_dev as u64, st.st_ino as u64)) {
        tracing::warn!(
            "landlock: {} is now a denied path or holds one; not granted",
            path.display()
        );
        return None;
    }
    let access = match kind == libc::S_IFDIR {
        true => dir_access,
        false => dir_access & AccessFs::from_file(abi),
    };
    (!access.is_empty()).then(|| PathBeneath::new(fd, access))
}

/// The full tier's ruleset, filled by two processes: created by the
/// helper before it forks PID 1 (both then hold it), the rules for the
/// host's paths added by the helper while PID 1 mounts, the rules for what
/// PID 1 mounts fresh (/tmp, /dev, /proc, /run) added by PID 1 after its
/// mounts, which then restricts itself with it. `deny_read` is also carved
/// out of the read roots here (see [`read_splits`]): the mounts of step 3
/// hide only what exists when the sandbox starts, and a mount goes away
/// with the name it covers when the host replaces or removes it.
pub struct Shared {
    created: RulesetCreated,
    abi: ABI,
    kernel: i32,
    allow_degraded: bool,
}

/// What is left to PID 1: the paths at or under the file systems it
/// mounts fresh, which only its view has, to carve there.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Later {
    /// Read roots (as carved so far) under those file systems.
    read: Vec<PathBuf>,
    /// The deny_read paths that split them (as resolved in the host).
    denied: Vec<PathBuf>,
    /// Writable roots under them.
    write: Vec<PathBuf>,
}

/// Create the ruleset (`None`: no Landlock, accepted with `--allow-degraded`).
pub fn create(allow_degraded: bool) -> Result<Option<Shared>> {
    let kernel = kernel_abi();
    let abi = abi_for(kernel);
    if abi == ABI::Unsupported {
        if allow_degraded {
            tracing::warn!("Landlock is unavailable; running without it (--allow-degraded)");
            return Ok(None);
        }
        bail!("this kernel has no Landlock (enable it with lsm=landlock,... on the kernel command line, Linux 5.13+), or pass --allow-degraded");
    }
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .context("Landlock: handling filesystem access")?;
    if abi >= ABI::V6 {
        ruleset = ruleset
            .scope(Scope::from_all(abi))
            .context("Landlock: scoping")?;
    }
    let created = ruleset.create().context("Landlock: creating the ruleset")?;
    Ok(Some(Shared {
        created,
        abi,
        kernel,
        allow_degraded,
    }))
}

/// Add a rule for each of `paths` with `dir_access` ([`rule`]).
fn add(
    created: RulesetCreated,
    paths: &[PathBuf],
    dir_access: BitFlags<AccessFs>,
    abi: ABI,
    guarded: &HashSet<(u64, u64)>,
    what: &str,
) -> Result<RulesetCreated> {
    let mut created = created;
    for p in paths {
        if let Some(r) = rule(p, dir_access, abi, guarded) {
            created = created
                .add_rule(r)
                .with_context(|| format!("Landlock: {what} rule for {}", p.display()))?;
        }
    }
    Ok(created)
}

/// A carve's read rules, and the listing rules of the directories it split
/// (which the guard would refuse: they are exactly what it guards).
fn add_carved(
    created: RulesetCreated,
    read: &[PathBuf],
    listable: &[PathBuf],
    abi: ABI,
    guard: &HashSet<(u64, u64)>,
) -> Result<RulesetCreated> {
    let created = add(created, read, AccessFs::from_read(abi), abi, guard, "read")?;
    let none = HashSet::new();
    add(
        created,
        listable,
        AccessFs::ReadDir.into(),
        abi,
        &none,
        "listing",
    )
}

impl Shared {
    /// In the helper, in the host's view: the rules for every path not at
    /// or under `fresh`; returns the others, for PID 1. A rule binds the
    /// inode it names from now on: the deny_read watch must be in place,
    /// and what was resolved before it forgotten (`resolve::forget`).
    pub fn add_host_rules(
        &mut self,
        read: &[PathBuf],
        write: &[PathBuf],
        deny_read: &[PathBuf],
        deny_read_names: &[PathBuf],
        fresh: &[PathBuf],
        covers: &[PathBuf],
    ) -> Result<Later> {
        let started = std::time::Instant::now();
        let abi = self.abi;
        // What the deny_read names lead to now, with the watch in place:
        // a link the host re-pointed since the plan was made is split
        // around too (the watch catches it from here on).
        let now: Vec<PathBuf> = deny_read_names.iter().map(|n| resolved(n)).collect();
        let denied = read_splits(&[deny_read, &now].concat(), write);
        let (read, listable, later_read) = carve_until(read, &denied, fresh);
        let (later_write, write): (Vec<PathBuf>, Vec<PathBuf>) = write
            .iter()
            .cloned()
            .partition(|p| fresh.iter().any(|f| crate::paths::under(p, f)));
        // Rules are built for this kernel's ABI: none may be cut down.
        let mut created = self.created.try_clone().context("Landlock: the ruleset")?;
        if !self.allow_degraded {
            created = created.set_compatibility(landlock::CompatLevel::HardRequirement);
        }
        // Resolved just above, after the watch went in: a path found absent
        // then is not looked up again (the watch stops the run if the host
        // makes it now). Most of the built-in list is absent on a machine.
        let present: Vec<PathBuf> = denied
            .iter()
            .filter(|d| !crate::resolve::known_absent(d))
            .cloned()
            .collect();
        let guard = guarded(&present, &listable);
        let created = add_carved(created, &read, &listable, abi, &guard)?;
        let created = add(
            created,
            &write,
            AccessFs::from_all(abi),
            abi,
            &guard,
            "write",
        )?;
        // The empty files that cover hidden ones (readwatch.rs) are read
        // where they are mounted, inside a split directory (a hidden file
        // in HOME): else the read fails before it opens, and is not seen.
        add(
            created,
            covers,
            AccessFs::from_read(abi),
            abi,
            &HashSet::new(),
            "cover",
        )?;
        tracing::debug!(
            read = read.len(),
            listable = listable.len(),
            write = write.len(),
            took = ?started.elapsed(),
            "Landlock rules for the host's paths added"
        );
        Ok(Later {
            read: later_read,
            denied,
            write: later_write,
        })
    }

    /// In PID 1, after its mounts: the rules for what it mounted fresh,
    /// the private /tmp and /dev writable, then restrict itself.
    pub fn restrict(self, later: &Later) -> Result<()> {
        let Shared {
            created,
            abi,
            kernel,
            allow_degraded,
        } = self;
        let all = AccessFs::from_all(abi);
        let (read, listable) = carve(&later.read, &later.denied);
        let guard = guarded(&later.denied, &listable);
        let created = add_carved(created, &read, &listable, abi, &guard)?;
        let created = add(created, &later.write, all, abi, &guard, "write")?;
        // Our own fresh file systems: nothing of the host's is in them.
        let own = [PathBuf::from("/tmp"), PathBuf::from("/dev")];
        let created = add(created, &own, all, abi, &HashSet::new(), "write")?;
        let status = created
            .restrict_self()
            .context("Landlock: restricting the sandbox")?;
        match status.ruleset {
            RulesetStatus::FullyEnforced => Ok(()),
            other if allow_degraded => {
                tracing::warn!("Landlock ruleset {other:?} (kernel ABI {kernel}); continuing with --allow-degraded");
                Ok(())
            }
            other => bail!("Landlock ruleset {other:?} on kernel ABI {kernel}; refusing (pass --allow-degraded to accept)"),
        }
    }
}

/// The `deny_read` paths that split the read roots: each one outside the
/// writable roots, whether it exists now or not. An absent one splits at
/// its nearest existing ancestor, so that what the host creates there
/// during the run (`~/.aws/credentials`, written while the command sleeps)
/// is under no rule and stays unreadable; so does a present one, which the
/// host could replace by rename (the mount over it then goes with the old
/// name). The cost: whatever the host creates during the run next to such
/// a path, in a directory that was split, is unreadable inside until the
/// next run (a new file in HOME, say). Rules follow inodes, not names: an
/// entry granted here that the host moves or links to a `deny_read` name,
/// or a symlink it puts on the way, would be readable, so the helper
/// watches those names and stops the sandbox (denywatch.rs). A symlink the host makes elsewhere to a denied path does not
/// reach it: Landlock checks the ancestors of the file opened. Inside a writable root the grant
/// cannot be split without making the root unwritable; there the mounts
/// hide what exists and the post-run check covers the rest (SPEC §4.5).
pub fn read_splits(deny_read: &[PathBuf], write: &[PathBuf]) -> Vec<PathBuf> {
    deny_read
        .iter()
        .filter(|d| !write.iter().any(|w| crate::paths::under(d, w)))
        .map(|d| resolved(d))
        .collect()
}

/// `p` with its longest existing prefix resolved (symlinks followed), so an
/// absent name below a linked directory (`~/.aws` -> `dotfiles/aws`) splits
/// the directory the link leads to.
pub fn resolved(p: &Path) -> PathBuf {
    let mut rest = vec![];
    let mut cur = p;
    loop {
        if let Some(real) = crate::resolve::canonical(cur) {
            return rest.iter().rev().fold(real, |acc, c| acc.join(c));
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                cur = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
}

/// The paths that cover `roots` except `denied` and everything under it:
/// Landlock only adds access, so a denied path inside a granted root is
/// expressed by granting its siblings instead, down to the denied path
/// (an absent one: down to its nearest existing ancestor, where its name
/// is simply not granted). Symlinks are resolved, and one that leads into
/// a denied path is dropped. Also returns the directories that were split,
/// on the way down. Callers choose which denied paths split: every one
/// given does, present or absent.
pub fn carve(roots: &[PathBuf], denied: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (out, split, _) = carve_until(roots, denied, &[]);
    (out, split)
}

/// [`carve`], but a path at or under one of `stop` is neither granted nor
/// looked into: it is returned third, for a process whose view of it
/// differs (PID 1, after mounting a file system there) to carve.
pub fn carve_until(
    roots: &[PathBuf],
    denied: &[PathBuf],
    stop: &[PathBuf],
) -> (Vec<PathBuf>, Vec<PathBuf>, Vec<PathBuf>) {
    let mut c = Carving {
        denied: crate::paths::Prefixes::new(denied),
        stop: crate::paths::Prefixes::new(stop),
        out: vec![],
        split: HashSet::new(),
        stopped: vec![],
    };
    for root in roots {
        c.one(root, 0);
    }
    let mut split: Vec<PathBuf> = c.split.into_iter().collect();
    for v in [&mut c.out, &mut split, &mut c.stopped] {
        v.sort();
        v.dedup();
    }
    (c.out, split, c.stopped)
}

struct Carving<'a> {
    denied: crate::paths::Prefixes<'a>,
    stop: crate::paths::Prefixes<'a>,
    out: Vec<PathBuf>,
    split: HashSet<PathBuf>,
    stopped: Vec<PathBuf>,
}

/// Of `denied`, those that exist now.
pub fn existing(denied: &[PathBuf]) -> Vec<PathBuf> {
    denied
        .iter()
        .filter(|d| d.symlink_metadata().is_ok())
        .cloned()
        .collect()
}

impl Carving<'_> {
    fn one(&mut self, path: &Path, depth: usize) {
        let Some(real) = crate::resolve::canonical(path) else {
            return;
        };
        let is_dir = real.is_dir();
        self.real(real, is_dir, depth);
    }

    /// Granted whole, or left to the process that sees it as it will be.
    fn grant(&mut self, real: PathBuf) {
        if self.stop.covers(&real) {
            self.stopped.push(real);
        } else {
            self.out.push(real);
        }
    }

    /// `one` for a path already resolved: an entry of a resolved directory
    /// that is not a symlink (most of a split HOME) costs no further lookups.
    fn real(&mut self, real: PathBuf, is_dir: bool, depth: usize) {
        if self.denied.covers(&real) {
            return;
        }
        let inside = self.denied.holds(&real);
        if !inside || !is_dir || self.stop.covers(&real) {
            self.grant(real);
            return;
        }
        // A link back up the tree (`~/x -> ~`) is split once, not again; past
        // the depth bound nothing is granted (fail closed).
        if depth > 32 || !self.split.insert(real.clone()) {
            return;
        }
        let entries = match std::fs::read_dir(&real) {
            Ok(entries) => entries,
            // Fail closed: nothing below a directory we cannot list is granted.
            Err(e) => {
                tracing::debug!("landlock: cannot split {}: {e}", real.display());
                return;
            }
        };
        // An entry that is not a link and not on the way to a denied path
        // is granted whole.
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if !t.is_symlink() => {
                    if self.denied.leads(&real, &e.file_name()) {
                        self.real(e.path(), t.is_dir(), depth + 1);
                    } else {
                        self.grant(e.path());
                    }
                }
                _ => self.one(&e.path(), depth + 1),
            }
        }
    }
}

/// The degraded tier's Landlock (SPEC §4.4): the filesystem as in the
/// full tier but with denied paths carved out (no mounts to hide them),
/// and TCP connect allowed to the proxy port only. Needs ABI 4.
/// `listable` are directories split by carving: they may be listed (so
/// `ls ~` works), which also lets names, never contents, of the hidden
/// entries below them be listed.
pub fn restrict_degraded(
    read: &[PathBuf],
    listable: &[PathBuf],
    denied: &[PathBuf],
    write: &[PathBuf],
    proxy_port: Option<u16>,
) -> Result<()> {
    let kernel = kernel_abi();
    let abi = abi_for(kernel);
    if abi < ABI::V4 {
        bail!(
            "the degraded tier needs Landlock ABI 4 (Linux 6.7) to confine TCP, and this kernel has {kernel}; \
             enable user namespaces instead (see `airlock doctor`)"
        );
    }
    let all = AccessFs::from_all(abi);
    let mut created = Ruleset::default()
        .handle_access(all)
        .context("Landlock: handling filesystem access")?
        .handle_access(AccessNet::from_all(abi))
        .context("Landlock: handling network access")?;
    if abi >= ABI::V6 {
        created = created
            .scope(Scope::from_all(abi))
            .context("Landlock: scoping")?;
    }
    let created = created.create().context("Landlock: creating the ruleset")?;
    let guard = guarded(denied, listable);
    let created = add_carved(created, read, listable, abi, &guard)?;
    let mut created = add(created, write, all, abi, &guard, "write")?;
    if let Some(port) = proxy_port {
        created = created
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .context("Landlock: the proxy port rule")?;
    }
    let status = created
        .restrict_self()
        .context("Landlock: restricting the sandbox")?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        bail!("Landlock ruleset {:?} on kernel ABI {kernel}; the degraded tier needs it fully enforced", status.ruleset);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carving_grants_siblings_not_the_denied_path() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        for d in ["a/secret", "a/ok", "b"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("a/file"), "x").unwrap();
        std::os::unix::fs::symlink(root.join("a/secret"), root.join("link-to-secret")).unwrap();
        let (got, split) = carve(std::slice::from_ref(&root), &[root.join("a/secret")]);
        assert_eq!(split, vec![root.clone(), root.join("a")]);
        assert!(
            got.contains(&root.join("a/ok"))
                && got.contains(&root.join("a/file"))
                && got.contains(&root.join("b"))
        );
        assert!(
            !got.iter().any(|p| p.starts_with(root.join("a/secret"))),
            "{got:?}"
        );
        assert!(!got.contains(&root), "{got:?}");
        assert_eq!(
            carve(std::slice::from_ref(&root), &[]).0,
            vec![root.clone()]
        );
        // Filtered to what exists, an absent denied path does not split the
        // root (the degraded tier's workspace stays writable).
        assert_eq!(
            carve(
                std::slice::from_ref(&root),
                &existing(&[root.join("b/.envrc")])
            )
            .0,
            vec![root.clone()]
        );
    }

    #[test]
    fn an_absent_denied_path_splits_down_to_its_nearest_existing_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        for d in [
            "home/u/.config/other",
            "home/u/proj",
            "home/u/dotfiles/aws",
            "srv",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("home/u/notes"), "x").unwrap();
        std::os::unix::fs::symlink(root.join("home/u/dotfiles/aws"), root.join("home/u/.aws"))
            .unwrap();
        // A link back up the tree must not make the walk explode.
        std::os::unix::fs::symlink(root.join("home"), root.join("home/u/up")).unwrap();
        std::os::unix::fs::symlink(root.join("home"), root.join("home/u/up2")).unwrap();
        let deny = [
            root.join("home/u/.aws/credentials"),
            root.join("home/u/.config/gh/hosts.yml"),
            root.join("srv/secrets/key"),
        ];
        let splits = read_splits(&deny, &[root.join("home/u/proj")]);
        assert!(
            splits.contains(&root.join("home/u/dotfiles/aws/credentials")),
            "{splits:?}"
        );
        let (got, split) = carve(std::slice::from_ref(&root), &splits);
        for granted in ["home/u/notes", "home/u/proj", "home/u/.config/other"] {
            assert!(got.contains(&root.join(granted)), "{granted}: {got:?}");
        }
        for never in [
            "srv",
            "home/u/.config",
            "home/u/dotfiles/aws",
            "home/u",
            "home",
            "",
        ] {
            assert!(!got.contains(&root.join(never)), "{never}: {got:?}");
        }
        assert!(
            split.contains(&root.join("srv")) && split.contains(&root.join("home/u/dotfiles/aws"))
        );
        assert!(split.len() < 16, "{split:?}");
        // A deny_read path inside a writable root does not split.
        assert!(read_splits(
            &[root.join("home/u/proj/.env")],
            &[root.join("home/u/proj")]
        )
        .is_empty());
    }
}
