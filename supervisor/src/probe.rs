//! The real machine, as the policy crate's presets see it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use airlock_policy::Probe;

pub struct SystemProbe {
    pub workspace: PathBuf,
}

impl Probe for SystemProbe {
    fn env(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }

    fn env_vars(&self) -> Vec<(String, String)> {
        std::env::vars().collect()
    }

    fn read(&self, path: &Path) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }

    fn list_dir(&self, path: &Path) -> Vec<String> {
        std::fs::read_dir(path)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn output(&self, argv: &[&str]) -> Option<String> {
        let (prog, args) = argv.split_first()?;
        tracing::debug!(?argv, "preset probe runs");
        let out = Command::new(prog)
            .args(args)
            .current_dir(&self.workspace)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn home(&self) -> Option<PathBuf> {
        std::env::var_os("HOME").map(PathBuf::from)
    }

    fn workspace(&self) -> PathBuf {
        self.workspace.clone()
    }
}
