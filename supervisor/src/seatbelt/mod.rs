//! The macOS Seatbelt profile (SPEC §4.2), generated from the same plan as
//! the Linux sandbox. A pure function, compiled and tested on every OS;
//! only the spawn (`macos.rs`) is macOS code.
//!
//! No path and no path-derived regex appears in the profile text: each is
//! a `(param "NAME")` passed with `sandbox-exec -D NAME=value`, so a path
//! with quotes, parentheses, backslashes or newlines can neither break nor
//! widen the profile. Regexes are built in `pathre` and passed the same way.
//!
//! Rule order matters: Seatbelt applies the last rule that matches, so the
//! allows come first and every deny after them.

pub mod pathre;
mod verify;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[cfg_attr(not(target_os = "macos"), allow(unused_imports))]
pub use verify::VERIFY_ON_A_MAC;

use crate::plan::{Net, Plan};

/// The profile text and the `-D` parameters it refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub text: String,
    pub params: Vec<(String, String)>,
}

/// Mach services that common developer tools need: user and group lookups
/// through the directory service (getpwuid and friends), notifications,
/// logging, preferences (reads; writes are denied below) and file events.
/// Not the keychain (securityd), not the resolver (dnssd), not
/// LaunchServices (which opens applications outside the sandbox).
const MACH_SERVICES: &[&str] = &[
    "com.apple.system.opendirectoryd.libinfo",
    "com.apple.system.DirectoryService.libinfo_v1",
    "com.apple.system.notification_center",
    "com.apple.system.logger",
    "com.apple.logd",
    "com.apple.cfprefsd.daemon",
    "com.apple.cfprefsd.agent",
    "com.apple.FSEvents",
];

/// Certificate trust for Go, Python and Java TLS through the proxy; only
/// when there is a proxy to talk to.
const TRUST_SERVICES: &[&str] = &[
    "com.apple.trustd",
    "com.apple.trustd.agent",
    "com.apple.ocspd",
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

/// Files under HOME that a host tool runs or obeys later, protected on
/// macOS whatever the policy lists: when HOME itself is writable (an
/// explicit `--workspace ~` or `--write ~`), the protected set grows with
/// it (SPEC §4.5). Login items, preferences (Terminal's start-up command),
/// git's global configuration, ssh's configuration, editor settings and
/// the directories early on PATH.
pub const HOME_PROTECTED: &[&str] = &[
    "Library/LaunchAgents",
    "Library/Preferences",
    "Library/Application Support/Code/User",
    ".gitconfig",
    ".config/git",
    ".ssh",
    ".config/fish",
    ".local/bin",
    "bin",
];

/// The user's keychains, unless `[macos] keychain = true`.
const KEYCHAINS: &str = "Library/Keychains";

/// Operations denied outright, after every allow, in case a future allow
/// (or a default of Seatbelt's) covers them: opening applications and
/// sending Apple events (both run code outside the sandbox), submitting
/// launchd jobs, hard links (a second name for a protected file escapes
/// path rules), preference writes through cfprefsd, and mounts.
const DENIED_OPERATIONS: &[&str] = &[
    "lsopen",
    "appleevent-send",
    "job-creation",
    "file-link",
    "user-preference-write",
    "file-mount",
    "file-unmount",
];

/// A name in the run's TMPDIR that its profile denies reading: with "may
/// create files in TMPDIR", it identifies the run's processes (macos.rs).
pub const RUN_MARKER: &str = ".airlock-run";

/// What `policy profile` shows where a run would name its own directory.
pub const TMPDIR_PLACEHOLDER: &str = "<per-run directory, created at start>";

/// Parameters, numbered per prefix; paths become their text (APFS names
/// are UTF-8, so `display` loses nothing there).
#[derive(Default)]
struct Params {
    list: Vec<(String, String)>,
    next: BTreeMap<&'static str, usize>,
}

impl Params {
    fn name(&mut self, prefix: &'static str) -> String {
        let n = self.next.entry(prefix).or_default();
        *n += 1;
        format!("{prefix}_{}", *n - 1)
    }

    fn named(&mut self, name: String, value: String) -> String {
        let r = format!("(param {})", sbpl_string(&name));
        self.list.push((name, value));
        r
    }

    fn add(&mut self, prefix: &'static str, value: String) -> String {
        let name = self.name(prefix);
        self.named(name, value)
    }

    /// `(subpath P)` (or `(literal P)`), and as `P_CI` the regex that also
    /// matches its case variants.
    fn path(&mut self, prefix: &'static str, path: &Path, sub: bool) -> String {
        let text = path.display().to_string();
        let (filter, re) = if sub {
            ("subpath", pathre::subpath(&text))
        } else {
            ("literal", pathre::literal(&text))
        };
        let name = self.name(prefix);
        let p = self.named(name.clone(), text);
        let r = self.named(format!("{name}_CI"), re);
        format!("  ({filter} {p})\n  (regex {r})\n")
    }

    fn regex(&mut self, prefix: &'static str, re: String) -> String {
        format!("  (regex {})\n", self.add(prefix, re))
    }
}

/// Quote a string as an SBPL string literal (only fixed names go through
/// this: parameter names, services, sysctls).
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

/// Every path whose content must not change, and the ones beneath which
/// nothing may be read: their ancestors are protected against rename.
struct Protected {
    deny_read: Vec<PathBuf>,
    write: Vec<PathBuf>,
}

fn protected(plan: &Plan) -> Protected {
    let m = &plan.macos;
    let home = |rel: &str| m.home.as_ref().map(|h| h.join(rel));
    let mut deny_read = plan.deny_read.clone();
    if !m.keychain {
        deny_read.extend(home(KEYCHAINS));
    }
    let mut write = plan.deny_write.clone();
    write.extend(m.links.iter().cloned());
    write.extend(HOME_PROTECTED.iter().filter_map(|r| home(r)));
    write.sort();
    write.dedup();
    Protected { deny_read, write }
}

/// Every directory above a protected path, up to and including `/`, and
/// above each writable root (whose `.git` and configuration files are
/// protected by regex): renaming or replacing any of them would carry the
/// protected path away from its rule, or put another in its place.
pub fn ancestors(protected: &[PathBuf], roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = protected
        .iter()
        .flat_map(|p| p.ancestors().skip(1))
        .chain(roots.iter().flat_map(|r| r.ancestors()))
        .map(Path::to_path_buf)
        .collect();
    out.sort();
    out.dedup();
    out
}

pub fn profile(plan: &Plan, proxy_port: Option<u16>) -> Profile {
    let m = &plan.macos;
    let mut p = Params::default();
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
    t.push_str(")\n");
    let mach = |t: &mut String, names: &[&str]| {
        t.push_str("(allow mach-lookup\n");
        for n in names {
            let _ = writeln!(t, "  (global-name {})", sbpl_string(n));
        }
        t.push_str(")\n");
    };
    mach(&mut t, MACH_SERVICES);
    if plan.net != Net::None {
        t.push_str(";; certificate trust, for TLS through the proxy\n");
        mach(&mut t, TRUST_SERVICES);
    }
    if m.keychain {
        t.push_str(";; [macos] keychain = true: securityd and the user's keychains\n");
        mach(&mut t, &["com.apple.SecurityServer"]);
    }
    if m.dnssd {
        t.push_str(";; [macos] dnssd = true: the system resolver, outside the proxy\n");
        mach(&mut t, &["com.apple.dnssd.service"]);
        t.push_str("(allow network-outbound (remote unix-socket (path-literal \"/private/var/run/mDNSResponder\")))\n");
    }
    t.push_str("(allow ipc-posix-shm-read-data ipc-posix-shm-write-data ipc-posix-shm-write-create (ipc-posix-name-prefix \"apple.shm.\"))\n");
    t.push_str("(allow ipc-posix-sem)\n");

    t.push_str("\n;; reads\n");
    if plan.read.iter().any(|r| r.as_path() == Path::new("/")) {
        t.push_str("(allow file-read*)\n");
    } else {
        t.push_str("(allow file-read*\n");
        for r in &plan.read {
            let _ = writeln!(t, "  (subpath {})", p.add("READ", r.display().to_string()));
        }
        t.push_str(")\n(allow file-read-metadata)\n");
    }

    t.push_str("\n;; writes: the writable roots and this run's own TMPDIR; not the\n;; shared /private/tmp or /private/var/folders\n(allow file-write*\n");
    for w in &plan.write {
        let _ = writeln!(t, "  (subpath {})", p.add("WRITE", w.display().to_string()));
    }
    let tmpdir = m
        .tmpdir
        .as_ref()
        .map_or(TMPDIR_PLACEHOLDER.to_string(), |d| d.display().to_string());
    let tmp = p.add("TMPDIR", tmpdir.clone());
    let _ = writeln!(t, "  (subpath {tmp})");
    for dev in [
        "/dev/null",
        "/dev/zero",
        "/dev/dtracehelper",
        "/dev/stdout",
        "/dev/stderr",
    ] {
        let _ = writeln!(t, "  (literal {})", sbpl_string(dev));
    }
    t.push_str("  (regex #\"^/dev/fd/[0-9]+$\")\n)\n");
    let _ = writeln!(t, "(allow file-read* (subpath {tmp}))");
    t.push_str("(allow file-ioctl (literal \"/dev/dtracehelper\"))\n");

    t.push_str("\n;; terminals: the controlling one, and ptys opened inside (the kernel\n;; gives those the pty extension); never another terminal's tty, even\n;; where reads are allowed everywhere\n");
    t.push_str("(deny file-read* file-write* file-ioctl (regex #\"^/dev/(tty[^/]+|pty[^/]+|console)$\"))\n");
    t.push_str("(allow pseudo-tty)\n(allow file-read* file-write* file-ioctl (literal \"/dev/tty\") (literal \"/dev/ptmx\"))\n");
    t.push_str("(allow file-read* file-write* file-ioctl\n  (require-all (regex #\"^/dev/ttys[0-9]+$\") (extension \"com.apple.sandbox.pty\")))\n");
    if let Some(tty) = &m.terminal {
        let _ = writeln!(
            t,
            "(allow file-read* file-write* file-ioctl (literal {}))",
            p.add("TTY", tty.display().to_string())
        );
    }

    t.push_str("\n;; unix sockets: only those the run creates in its own TMPDIR\n");
    let sockets = p.add("TMPDIR_SOCKETS", pathre::subpath(&tmpdir));
    let _ = writeln!(
        t,
        "(allow network-bind network-inbound (local unix-socket (path-regex {sockets})))"
    );
    let _ = writeln!(
        t,
        "(allow network-outbound (remote unix-socket (path-regex {sockets})))"
    );

    t.push_str("\n;; network\n");
    match (plan.net, proxy_port) {
        (Net::Proxy, Some(port)) => {
            let _ = writeln!(
                t,
                "(allow network-outbound (remote tcp \"localhost:{port}\"))"
            );
        }
        (Net::Host, _) => t.push_str(
            ";; --network host: IP only, no unix sockets\n(allow network-outbound (remote ip))\n(allow network-inbound network-bind (local ip))\n",
        ),
        _ => t.push_str(";; none\n"),
    }

    // Everything below denies, and comes last so that it wins.
    let prot = protected(plan);
    // A rule without filters would match everything: empty lists emit
    // nothing at all.
    let mut filters = String::new();
    for d in &prot.deny_read {
        filters.push_str(&p.path("DENY_READ", d, true));
    }
    // `.env` files found at start (dotenv.rs), as found and where they lead.
    for d in &plan.deny_read_env {
        filters.push_str(&p.path("DENY_READ", d, true));
        if let Some(real) = crate::resolve::canonical(d).filter(|r| r != d) {
            filters.push_str(&p.path("DENY_READ", &real, true));
        }
    }
    for g in &plan.deny_read_globs {
        filters.push_str(&p.regex("DENY_READ_GLOB", pathre::glob(g)));
    }
    if !filters.is_empty() {
        t.push_str("\n;; deny_read: not read, and not written, renamed or removed either\n;; (a renamed secret would be readable under its new name)\n(deny file-read* file-write*\n");
        t.push_str(&std::mem::take(&mut filters));
        t.push_str(")\n");
    }

    for w in &prot.write {
        filters.push_str(&p.path("PROTECT", w, true));
    }
    for g in &m.deny_write_globs {
        filters.push_str(&p.regex("PROTECT_GLOB", pathre::glob(g)));
    }
    if !filters.is_empty() {
        t.push_str("\n;; the protected set: deny_write, symlinks to protected files, and\n;; host files that run or configure code later (SPEC §4.5)\n(deny file-write*\n");
        t.push_str(&filters);
        t.push_str(")\n");
    }

    if !plan.write.is_empty() {
        t.push_str("\n;; in every writable root, at any depth and in any case: `.git` itself\n;; (no new repository, gitdir file or rename into place), git's\n;; configuration and hooks, and working-tree configuration files\n(deny file-write*\n");
        for w in &plan.write {
            let w = w.display().to_string();
            t.push_str(&p.regex("GIT_ENTRY", pathre::git_entry(&w)));
            t.push_str(&p.regex("GIT_CONTROL", pathre::git_control(&w)));
            t.push_str(&p.regex("TREE_CONTROL", pathre::tree_control(&w)));
        }
        t.push_str(")\n");
    }

    let all: Vec<PathBuf> = prot.deny_read.iter().chain(&prot.write).cloned().collect();
    let ancestors = ancestors(&all, &plan.write);
    if !ancestors.is_empty() {
        t.push_str("\n;; ancestors of protected paths, up to /: no rename, no removal, no\n;; creation in their place\n(deny file-write-unlink file-write-create\n");
        for a in &ancestors {
            t.push_str(&p.path("ANCESTOR", a, false));
        }
        t.push_str(")\n");
    }

    let _ = writeln!(
        t,
        "\n;; identifies this run's processes when it ends (see macos.rs)\n(deny file-read* (literal {}))",
        p.add("RUN_MARKER", format!("{tmpdir}/{RUN_MARKER}"))
    );

    t.push_str("\n;; never, whatever was allowed above\n");
    for op in DENIED_OPERATIONS {
        let _ = writeln!(t, "(deny {op})");
    }
    Profile {
        text: t,
        params: p.list,
    }
}

#[cfg(test)]
mod eval;
#[cfg(test)]
mod tests;
