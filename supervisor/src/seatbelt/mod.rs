//! The macOS Seatbelt profile (SPEC §4.2), generated from the same plan as
//! the Linux sandbox. A pure function, compiled and tested on every OS;
//! only the spawn (`macos.rs`) is macOS code.
//!
//! Paths never appear in the profile text: each is a `(param "NAME")`
//! passed with `sandbox-exec -D NAME=value`, so a path with quotes,
//! parentheses or newlines can neither break nor widen the profile. The
//! only path-derived text is the regex of a mid-path glob, escaped here.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::plan::{Net, Plan};

/// The profile text and the `-D` parameters it refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub text: String,
    pub params: Vec<(String, String)>,
}

/// Mach services that common developer tools need: name resolution through
/// the directory service (the proxy does DNS, but getpwuid and friends do
/// not), certificate trust for Go, Python and Java TLS, logging, and
/// preferences.
const MACH_SERVICES: &[&str] = &[
    "com.apple.system.opendirectoryd.libinfo",
    "com.apple.system.DirectoryService.libinfo_v1",
    "com.apple.system.notification_center",
    "com.apple.system.logger",
    "com.apple.logd",
    "com.apple.diagnosticd",
    "com.apple.trustd",
    "com.apple.trustd.agent",
    "com.apple.SecurityServer",
    "com.apple.ocspd",
    "com.apple.cfprefsd.daemon",
    "com.apple.cfprefsd.agent",
    "com.apple.coreservices.launchservicesd",
    "com.apple.lsd.mapdb",
    "com.apple.FSEvents",
    "com.apple.dnssd.service",
];

/// sysctls read by node, python, cargo, go and the JVM (CPU counts, page
/// size, OS version, boot time).
const SYSCTL_PREFIXES: &[&str] = &[
    "hw.",
    "kern.ostype",
    "kern.osrelease",
    "kern.osversion",
    "kern.osproductversion",
    "kern.version",
    "kern.hostname",
    "kern.boottime",
    "kern.maxfilesperproc",
    "kern.argmax",
    "kern.usrstack64",
    "kern.secure_kernel",
    "machdep.cpu.",
    "sysctl.proc_translated",
    "vm.loadavg",
    "security.mac.lockdown_mode_state",
];

struct Params(Vec<(String, String)>);

impl Params {
    fn add(&mut self, prefix: &str, path: &Path) -> String {
        let name = format!(
            "{prefix}_{}",
            self.0.iter().filter(|(k, _)| k.starts_with(prefix)).count()
        );
        self.0.push((name.clone(), path.display().to_string()));
        format!("(param \"{name}\")")
    }
}

/// Quote a string as an SBPL string literal.
pub fn sbpl_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A glob (`*` one segment, `**` many) as an anchored regex, every other
/// character escaped.
pub fn glob_regex(glob: &str) -> String {
    let mut re = String::from("^");
    let mut chars = glob.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' if chars.peek() == Some(&'*') => {
                chars.next();
                re.push_str(".*");
            }
            '*' => re.push_str("[^/]*"),
            c if "\\.+?()[]{}|^$#\"".contains(c) => {
                re.push('\\');
                re.push(c);
            }
            c if c.is_control() => {
                let _ = write!(re, "\\x{:02x}", c as u32);
            }
            c => re.push(c),
        }
    }
    re.push_str("(/.*)?$");
    re
}

/// Directories between a writable root and a protected path: renaming any
/// of them would move the protected path out from under its rule.
fn ancestors_within(protected: &Path, roots: &[PathBuf]) -> Vec<PathBuf> {
    let Some(root) = roots
        .iter()
        .filter(|r| protected.starts_with(r))
        .max_by_key(|r| r.as_os_str().len())
    else {
        return vec![];
    };
    let mut out = vec![];
    let mut p = protected.parent();
    while let Some(dir) = p {
        if dir == root || !dir.starts_with(root) {
            break;
        }
        out.push(dir.to_path_buf());
        p = dir.parent();
    }
    out
}

pub fn profile(plan: &Plan, proxy_port: Option<u16>) -> Profile {
    let globs = &plan.deny_read_globs;
    let mut p = Params(vec![]);
    let mut t = String::new();
    t.push_str("(version 1)\n(deny default)\n\n");
    t.push_str(";; processes: fork and exec; signals and inspection only inside the sandbox\n");
    t.push_str("(allow process-fork)\n(allow process-exec)\n");
    t.push_str(
        "(allow signal (target same-sandbox))\n(allow process-info* (target same-sandbox))\n\n",
    );

    t.push_str(";; system services developer tools need\n(allow sysctl-read\n");
    for s in SYSCTL_PREFIXES {
        let op = if s.ends_with('.') {
            "sysctl-name-prefix"
        } else {
            "sysctl-name"
        };
        let _ = writeln!(t, "  ({op} {})", sbpl_string(s));
    }
    t.push_str(")\n(allow mach-lookup\n");
    for m in MACH_SERVICES {
        let _ = writeln!(t, "  (global-name {})", sbpl_string(m));
    }
    t.push_str(")\n(allow ipc-posix-shm-read-data ipc-posix-shm-write-data ipc-posix-shm-write-create (ipc-posix-name-prefix \"apple.shm.\"))\n");
    t.push_str("(allow ipc-posix-sem)\n(allow pseudo-tty)\n\n");

    t.push_str(";; reads\n");
    if plan.read.iter().any(|r| r.as_path() == Path::new("/")) {
        t.push_str("(allow file-read*)\n");
    } else {
        t.push_str("(allow file-read*\n");
        for r in &plan.read {
            let _ = writeln!(t, "  (subpath {})", p.add("READ", r));
        }
        t.push_str(")\n(allow file-read-metadata)\n");
    }
    if !plan.deny_read.is_empty() || !globs.is_empty() {
        t.push_str("(deny file-read*\n");
        for d in &plan.deny_read {
            let _ = writeln!(t, "  (subpath {})", p.add("DENY_READ", d));
        }
        for g in globs {
            let _ = writeln!(t, "  (regex #{})", sbpl_string(&glob_regex(g)));
        }
        t.push_str(")\n");
    }

    t.push_str("\n;; writes\n(allow file-write*\n");
    for w in &plan.write {
        let _ = writeln!(t, "  (subpath {})", p.add("WRITE", w));
    }
    t.push_str("  (subpath \"/private/tmp\")\n  (subpath \"/private/var/folders\")\n");
    for dev in [
        "/dev/null",
        "/dev/zero",
        "/dev/tty",
        "/dev/dtracehelper",
        "/dev/ptmx",
    ] {
        let _ = writeln!(t, "  (literal {})", sbpl_string(dev));
    }
    t.push_str("  (regex #\"^/dev/ttys[0-9]+$\")\n)\n");
    t.push_str("(allow file-ioctl (literal \"/dev/tty\") (literal \"/dev/ptmx\") (regex #\"^/dev/ttys[0-9]+$\"))\n");
    if !plan.deny_write.is_empty() {
        t.push_str("(deny file-write*\n");
        for d in &plan.deny_write {
            let _ = writeln!(t, "  (subpath {})", p.add("DENY_WRITE", d));
        }
        t.push_str(")\n");
        let mut ancestors: Vec<PathBuf> = plan
            .deny_write
            .iter()
            .flat_map(|d| ancestors_within(d, &plan.write))
            .collect();
        ancestors.sort();
        ancestors.dedup();
        if !ancestors.is_empty() {
            t.push_str(";; a protected path can't be renamed away with its parent\n(deny file-write-unlink\n");
            for a in &ancestors {
                let _ = writeln!(t, "  (literal {})", p.add("PROTECT_PARENT", a));
            }
            t.push_str(")\n");
        }
    }

    t.push_str("\n;; network: the proxy only\n");
    match (plan.net, proxy_port) {
        (Net::Proxy, Some(port)) => {
            let _ = writeln!(
                t,
                "(allow network-outbound (remote tcp \"localhost:{port}\"))"
            );
        }
        (Net::Host, _) => t.push_str("(allow network*)\n"),
        _ => t.push_str(";; none\n"),
    }
    Profile {
        text: t,
        params: p.0,
    }
}

#[cfg(test)]
mod tests;
