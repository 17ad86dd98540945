//! `airlock doctor`: what this machine supports and which tier `run` will
//! use, found by probing, not by trusting sysctls alone.

use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;

#[derive(Serialize)]
pub struct Findings {
    pub kernel: String,
    pub landlock_abi: i32,
    pub seccomp: bool,
    pub user_namespaces: bool,
    /// Why user namespaces are unavailable, when they are.
    pub user_namespaces_error: Option<String>,
    pub apparmor_restricts_userns: bool,
    pub wsl: Option<u8>,
    pub approvals: String,
    /// Transparent capture and the sandbox's DNS (SPEC §5.5): "yes
    /// (probed)", or why not.
    pub capture: String,
    pub tier: String,
    pub fix: Option<String>,
    /// macOS: what the Seatbelt profile promises that only a run on a Mac
    /// can confirm, with the check to run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub verify_on_a_mac: Vec<String>,
    /// Each `[limits]` entry and how this machine enforces it (SPEC §4.6).
    pub limits: Vec<String>,
    /// What the degraded tier does not cover (SPEC §4.4).
    pub degraded_residual_risk: String,
    /// Where presets' caches go for the current directory's project.
    pub caches: String,
}

/// The cache directory a run from here gets (SPEC §3.4): per project.
fn caches() -> String {
    let Ok((workspace, _)) = crate::policy::workspace_dir(&Default::default()) else {
        return "unknown: the current directory cannot be read".into();
    };
    let Some(base) = crate::integrity::quarantine::airlock_cache() else {
        return "none: neither XDG_CACHE_HOME nor HOME is set".into();
    };
    let project = crate::policy::project_root(&workspace);
    let dir = base
        .join("projects")
        .join(airlock_policy::preset::project_key(&project));
    format!(
        "{} for project {} (each project has its own; `airlock cache list`)",
        crate::text::shown(&dir),
        crate::text::shown(&project)
    )
}

/// The degraded tier's known gaps, for `doctor` and the run's warning.
pub const DEGRADED_RESIDUAL_RISK: &str = concat!(
    "Landlock allows TCP connect by port, not by address: the command can reach any listener ",
    "on the proxy's port at any address (another loopback address, or a remote host); ",
    "without a mount namespace, host unix sockets are kept out only by refusing socket(AF_UNIX) ",
    "and every socketpair but unix stream and seqpacket ones (no connect() notification there), ",
    "and /tmp, /dev/shm and other terminals are withheld (TMPDIR is private), not replaced; ",
    "TMPDIR is capped by [limits] tmp only where airlock may mount (root with CAP_SYS_ADMIN), ",
    "elsewhere its size is not capped and setting tmp is an error; ",
    "the pids limit counts on top of the user's other processes"
);

#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// `Some(1)` or `Some(2)` under WSL.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub fn wsl_version() -> Option<u8> {
    let release = read("/proc/sys/kernel/osrelease")?.to_lowercase();
    if !release.contains("microsoft") {
        return None;
    }
    // WSL2 kernels are "...-microsoft-standard-WSL2"; WSL1 reports the Windows build.
    Some(
        if release.contains("wsl2") || release.contains("standard") {
            2
        } else {
            1
        },
    )
}

#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub fn is_wsl1() -> bool {
    wsl_version() == Some(1)
}

/// Try for real: a child that creates the namespaces `run` needs.
#[cfg(target_os = "linux")]
pub fn probe_userns() -> Result<(), String> {
    use nix::sched::{unshare, CloneFlags};
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};
    // SAFETY: doctor is single-threaded here; the child only unshares and exits.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let flags = CloneFlags::CLONE_NEWUSER
                | CloneFlags::CLONE_NEWNS
                | CloneFlags::CLONE_NEWPID
                | CloneFlags::CLONE_NEWNET
                | CloneFlags::CLONE_NEWIPC;
            let code = match unshare(flags) {
                Ok(()) => 0,
                Err(e) => e as i32,
            };
            // SAFETY: leave the forked child at once.
            unsafe { libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, 0)) => Ok(()),
            Ok(WaitStatus::Exited(_, errno)) => {
                Err(crate::linux::explain_unshare(nix::errno::Errno::from_raw(errno)).to_string())
            }
            other => Err(format!("probe ended unexpectedly: {other:?}")),
        },
        Err(e) => Err(format!("cannot fork the probe: {e}")),
    }
}

#[cfg(target_os = "linux")]
pub fn findings() -> Findings {
    let landlock_abi = crate::linux::landlock::kernel_abi();
    let user_namespaces = probe_userns();
    let wsl = wsl_version();
    let seccomp = read("/proc/self/status").is_some_and(|s| s.contains("Seccomp:"));
    let (tier, fix) = if wsl == Some(1) {
        (
            "none".to_string(),
            Some("WSL1 is not supported: convert the distribution to WSL2".to_string()),
        )
    } else if let Err(e) = &user_namespaces {
        (
            "none".to_string(),
            Some(format!("{e} (the degraded tier is not built yet)")),
        )
    } else if landlock_abi < 1 {
        (
            "none".to_string(),
            Some("enable Landlock (lsm=landlock,... on the kernel command line), or run with --allow-degraded".to_string()),
        )
    } else if !seccomp {
        (
            "none".to_string(),
            Some("this kernel lacks seccomp".to_string()),
        )
    } else {
        ("linux-namespaces (full)".to_string(), None)
    };
    let capture = match &user_namespaces {
        Err(_) => "no: needs user namespaces".into(),
        Ok(()) => match crate::linux::capture::probe() {
            Ok(()) => {
                "yes (probed): programs that ignore the proxy variables go through the policy too"
                    .into()
            }
            Err(e) => format!("no: {e}; `run` keeps the explicit proxy only"),
        },
    };
    let approvals = match crate::places::managed_policy_path() {
        Err(e) => format!("unknown: {e:#}"),
        Ok((managed, required)) => match crate::policy::load_file(
            &managed,
            airlock_policy::Layer::Managed,
            required,
        ) {
        Ok(Some(m))
            if m.unknown
                .as_ref()
                .is_some_and(|u| u.value == airlock_policy::Unknown::Deny) =>
        {
            format!("off: {} sets network.unknown = \"deny\"", managed.display())
        }
        Ok(Some(m)) if m.user_allow.as_ref().is_some_and(|u| !u.value) => {
            format!(
                "on, but only the managed allow list counts ({} sets user_allow = false)",
                managed.display()
            )
        }
        Err(_) => format!("unknown: {} cannot be read or does not parse, and `run` refuses", managed.display()),
        _ => "on: unknown hosts are escalated (--ask tty when stdin is a terminal, else deny; --ask socket:PATH for IDEs)".to_string(),
    }};
    Findings {
        kernel: read("/proc/sys/kernel/osrelease").unwrap_or_default(),
        landlock_abi,
        seccomp,
        user_namespaces: user_namespaces.is_ok(),
        user_namespaces_error: user_namespaces.err(),
        apparmor_restricts_userns: read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
            .as_deref()
            == Some("1"),
        wsl,
        approvals,
        capture,
        tier,
        fix,
        verify_on_a_mac: vec![],
        limits: crate::linux::limits::describe(),
        degraded_residual_risk: DEGRADED_RESIDUAL_RISK.to_string(),
        caches: caches(),
    }
}

#[cfg(target_os = "macos")]
pub fn findings() -> Findings {
    let release = {
        // SAFETY: uname fills the struct it is given.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        if unsafe { libc::uname(&mut u) } == 0 {
            // SAFETY: uname NUL-terminates its fields.
            unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        } else {
            String::new()
        }
    };
    let ready = std::path::Path::new(crate::macos::SANDBOX_EXEC).exists();
    Findings {
        kernel: format!("Darwin {release}"),
        landlock_abi: 0,
        seccomp: false,
        user_namespaces: false,
        user_namespaces_error: Some("not Linux".into()),
        apparmor_restricts_userns: false,
        wsl: None,
        approvals: "on".into(),
        capture: "no: transparent capture is Linux only".into(),
        tier: if ready {
            "macos-seatbelt (its profile is verified as text on Linux only: see below)".into()
        } else {
            "none".into()
        },
        fix: (!ready).then(|| format!("{} is missing", crate::macos::SANDBOX_EXEC)),
        verify_on_a_mac: crate::seatbelt::VERIFY_ON_A_MAC
            .iter()
            .map(|(what, check)| format!("{what}: {check}"))
            .collect(),
        limits: vec![
            "[limits] are not enforced on macOS yet: a configured limit is warned about".into(),
        ],
        degraded_residual_risk: DEGRADED_RESIDUAL_RISK.to_string(),
        caches: caches(),
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub fn findings() -> Findings {
    Findings {
        kernel: std::env::consts::OS.to_string(),
        landlock_abi: 0,
        seccomp: false,
        user_namespaces: false,
        user_namespaces_error: Some("not Linux".into()),
        apparmor_restricts_userns: false,
        wsl: None,
        approvals: "on".into(),
        capture: "no".into(),
        tier: "none".into(),
        fix: Some("airlock run is not built for this platform yet".into()),
        verify_on_a_mac: vec![],
        limits: vec![],
        degraded_residual_risk: DEGRADED_RESIDUAL_RISK.to_string(),
        caches: caches(),
    }
}

pub fn run(json: bool) -> Result<ExitCode> {
    let f = findings();
    if json {
        say!("{}", serde_json::to_string_pretty(&f)?);
    } else {
        say!("kernel:            {}", f.kernel);
        say!(
            "landlock ABI:      {}",
            if f.landlock_abi > 0 {
                f.landlock_abi.to_string()
            } else {
                "unavailable".into()
            }
        );
        say!(
            "seccomp:           {}",
            if f.seccomp { "yes" } else { "no" }
        );
        match &f.user_namespaces_error {
            None => say!("user namespaces:   yes (probed)"),
            Some(e) => say!("user namespaces:   no: {e}"),
        }
        say!(
            "apparmor userns restriction: {}",
            if f.apparmor_restricts_userns {
                "on"
            } else {
                "off"
            }
        );
        say!(
            "wsl:               {}",
            f.wsl.map_or("no".to_string(), |v| format!("WSL{v}"))
        );
        say!("approvals:         {}", f.approvals);
        say!("capture:           {}", f.capture);
        say!("tier for `run`:    {}", f.tier);
        if let Some(fix) = &f.fix {
            say!("fix:               {fix}");
        }
        if !f.verify_on_a_mac.is_empty() {
            say!("not yet confirmed on a real Mac (the profile is tested as text; run these once and report):");
            for v in &f.verify_on_a_mac {
                say!("  - {v}");
            }
        }
        for l in &f.limits {
            say!("limit:             {l}");
        }
        say!("degraded tier risk: {}", f.degraded_residual_risk);
        say!("preset caches:     {}", f.caches);
    }
    // What `run` would refuse on is an error here too, after the findings:
    // an environment that names a replacement managed policy is not a
    // setting doctor may report as fine.
    crate::places::managed_policy_path()?;
    Ok(ExitCode::SUCCESS)
}
