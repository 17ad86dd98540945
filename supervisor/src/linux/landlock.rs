//! Landlock (SPEC §4.1 step 5): read on the read roots, read-write on the
//! writable roots, every filesystem right the running kernel's ABI knows,
//! and abstract-socket and signal scoping from ABI 6. Following the
//! kernel's sandboxer example: ask the kernel for its ABI, handle exactly
//! that, and treat anything less than full enforcement as an error.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use landlock::{
    Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    Scope, ABI,
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
pub fn describe(read: &[PathBuf], write: &[PathBuf], abi: i32) -> Vec<String> {
    let abi = abi_for(abi);
    let mut out = vec![format!("handled: {:?}", AccessFs::from_all(abi))];
    out.extend(read.iter().map(|p| format!("read    {}", p.display())));
    out.extend(write.iter().map(|p| format!("write   {}", p.display())));
    if abi >= ABI::V6 {
        out.push("scoped: abstract unix sockets, signals".into());
    }
    out
}

fn rule(path: &Path, access: landlock::BitFlags<AccessFs>) -> Option<PathBeneath<PathFd>> {
    match PathFd::new(path) {
        Ok(fd) => Some(PathBeneath::new(fd, access)),
        Err(e) => {
            tracing::debug!("landlock: skipping {}: {e}", path.display());
            None
        }
    }
}

pub fn restrict(read: &[PathBuf], write: &[PathBuf], allow_degraded: bool) -> Result<()> {
    let kernel = kernel_abi();
    let abi = abi_for(kernel);
    if abi == ABI::Unsupported {
        if allow_degraded {
            tracing::warn!("Landlock is unavailable; running without it (--allow-degraded)");
            return Ok(());
        }
        bail!("this kernel has no Landlock (enable it with lsm=landlock,... on the kernel command line, Linux 5.13+), or pass --allow-degraded");
    }
    let all = AccessFs::from_all(abi);
    let read_access = AccessFs::from_read(abi);
    let mut ruleset = Ruleset::default()
        .handle_access(all)
        .context("Landlock: handling filesystem access")?;
    if abi >= ABI::V6 {
        ruleset = ruleset
            .scope(Scope::from_all(abi))
            .context("Landlock: scoping")?;
    }
    let mut created = ruleset.create().context("Landlock: creating the ruleset")?;
    for p in read {
        if let Some(r) = rule(p, read_access) {
            created = created
                .add_rule(r)
                .with_context(|| format!("Landlock: read rule for {}", p.display()))?;
        }
    }
    let writable = write
        .iter()
        .map(PathBuf::as_path)
        .chain([Path::new("/tmp"), Path::new("/dev")]);
    for p in writable {
        if let Some(r) = rule(p, all) {
            created = created
                .add_rule(r)
                .with_context(|| format!("Landlock: write rule for {}", p.display()))?;
        }
    }
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
