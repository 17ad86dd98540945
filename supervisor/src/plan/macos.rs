//! What the Seatbelt profile needs beyond the shared plan: the opt-in
//! grants, the paths as written before symlinks were followed, deny_write
//! globs, and the two things only known when the run starts (its private
//! temporary directory and its controlling terminal).

use std::path::{Path, PathBuf};

use airlock_policy::{Located, Policy};
use serde::{Deserialize, Serialize};

use crate::paths::{absolute_glob, resolve_path};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MacosPlan {
    /// The user's home: the keychain and the host files that are protected
    /// whatever the policy says (`~/Library/LaunchAgents`, ...).
    pub home: Option<PathBuf>,
    /// `[macos] keychain = true`: securityd and `~/Library/Keychains`.
    pub keychain: bool,
    /// `[macos] dnssd = true`: the system resolver, which the proxy never sees.
    pub dnssd: bool,
    /// The switches that are on, with the file and line that turned them on.
    pub switches: Vec<String>,
    /// deny_read and deny_write paths as written, where a symlink made the
    /// resolved path differ: the link is protected as well as its target.
    pub links: Vec<PathBuf>,
    /// deny_write globs (absolute), compiled to regexes like deny_read's.
    pub deny_write_globs: Vec<String>,
    /// This run's private temporary directory (`TMPDIR`); set at start.
    pub tmpdir: Option<PathBuf>,
    /// The controlling terminal, the only existing tty the run may open;
    /// set at start.
    pub terminal: Option<PathBuf>,
}

impl MacosPlan {
    pub fn from_policy(policy: &Policy, home: &Path, workspace: &Path) -> MacosPlan {
        let mut switches = vec![];
        let mut on = |name: &str, v: &Option<Located<bool>>| -> bool {
            match v {
                Some(l) if l.value => {
                    switches.push(format!("[macos] {name} = true ({})", l.origin));
                    true
                }
                _ => false,
            }
        };
        let keychain = on("keychain", &policy.macos_keychain);
        let dnssd = on("dnssd", &policy.macos_dnssd);
        let mut links = vec![];
        let mut deny_write_globs = vec![];
        for (list, is_write) in [(&policy.deny_read, false), (&policy.deny_write, true)] {
            for e in list {
                match resolve_path(&e.value, home, workspace) {
                    // `plan::build` keeps the resolved target; keep the
                    // link (or the path through a linked ancestor) here.
                    Some(p) if std::fs::canonicalize(&p).is_ok_and(|real| real != p) => {
                        links.push(p)
                    }
                    Some(_) => {}
                    None if is_write => {
                        deny_write_globs.push(absolute_glob(&e.value, home, workspace))
                    }
                    None => {}
                }
            }
        }
        links.sort();
        links.dedup();
        MacosPlan {
            home: Some(home.to_path_buf()),
            keychain,
            dnssd,
            switches,
            links,
            deny_write_globs,
            tmpdir: None,
            terminal: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use airlock_policy::{load_str, Fragment, Layer, Policy};

    use super::*;

    #[test]
    fn links_globs_and_switches_come_from_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(dir.path()).unwrap();
        let ws = home.join("project");
        std::fs::create_dir_all(home.join("dotfiles")).unwrap();
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(home.join("dotfiles/zshrc"), "").unwrap();
        std::os::unix::fs::symlink(home.join("dotfiles/zshrc"), home.join(".zshrc")).unwrap();
        let text = "[filesystem]\ndeny_write = [\"~/.zshrc\", \"**/*.command\", \".git/hooks\"]\n[macos]\ndnssd = true\nkeychain = false\n";
        let file = load_str(text, "p.toml", Layer::Project).unwrap();
        let policy = Policy::build(
            vec![Fragment::empty(Layer::BuiltIn, "none"), file],
            &airlock_policy::preset::Offline,
        );
        let m = MacosPlan::from_policy(&policy, &home, &ws);
        assert_eq!(m.links, vec![home.join(".zshrc")]);
        assert_eq!(
            m.deny_write_globs,
            vec![format!("{}/**/*.command", ws.display())]
        );
        assert!(m.dnssd && !m.keychain);
        assert_eq!(m.switches.len(), 1);
        assert!(m.switches[0].contains("dnssd") && m.switches[0].contains("p.toml:4"));
    }
}
