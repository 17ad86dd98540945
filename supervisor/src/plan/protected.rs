//! The protected set (SPEC §4.5): every path inside a writable root whose
//! content a host tool or airlock itself later executes or obeys. It is
//! computed from names, never by walking the workspace, so the post-run
//! check costs O(protected set).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

/// What git reads as configuration or runs as code inside a git directory
/// (the `.git` of a repository, a submodule's `.git/modules/<name>`, or a
/// linked worktree's admin directory). Objects, refs and the index stay
/// writable: `git commit` inside the sandbox must work.
pub const GIT_DIR_SURFACE: &[&str] = &[
    "config",
    "config.worktree",
    "hooks",
    "info",
    "commondir",
    "gitdir",
    "objects/info/alternates",
];

/// What git could take as a git directory, the one rule the post-run
/// check's walk (integrity/nested.rs) and review's scan (review/scan.rs)
/// share: every entry named `.git` (a directory, a `gitdir:` file, a
/// link), and every directory holding an entry named `HEAD`, valid or not
/// (git's own test looks at `objects` and `refs`, or at the common
/// directory that `commondir` names, which the shape alone does not show).
pub const DOT_GIT: &str = ".git";
pub const GIT_DIR_MARK: &str = "HEAD";

/// Whether `rel`, a path inside a git directory, is part of what git reads
/// as configuration or runs as code there ([`GIT_DIR_SURFACE`]), through
/// its submodules' and worktrees' own git directories
/// ([`git_dir_surface`] lists the same paths where they exist).
pub fn in_git_dir_surface(rel: &Path) -> bool {
    let comps: Vec<&std::ffi::OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let mut rest = &comps[..];
    while rest.len() > 2 && (rest[0] == "modules" || rest[0] == "worktrees") {
        rest = &rest[2..];
    }
    let rest: PathBuf = rest.iter().collect();
    GIT_DIR_SURFACE.iter().any(|s| rest.starts_with(s))
}

/// What in a git directory changes what git runs or shows without being
/// configuration: a rebase's or cherry-pick's state (`--continue` runs its
/// `exec` steps), and replace refs (`refs/replace/<commit>` makes `git
/// status` and `git diff` show another commit's tree in place of HEAD's,
/// hiding the sandbox's edits). Judged when a sandbox writes them, and
/// marked in review (red team round 15); not read-only inside, where
/// `git rebase` must work.
pub fn in_git_dir_state(rel: &Path) -> bool {
    ["rebase-merge", "rebase-apply", "sequencer", "refs/replace"]
        .iter()
        .any(|s| rel.starts_with(s))
}

/// A file's bytes as git reads a path from it (`commondir`, a `gitdir:`
/// file): all of it, less trailing newlines and carriage returns. Links
/// are followed only with `follow` (as git does on the host; never in an
/// overlay's upper layer, where a link means something else); never a
/// fifo waited on, never more than a path's worth read.
pub fn git_path_file(file: &Path, follow: bool) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let flags = libc::O_NONBLOCK | if follow { 0 } else { libc::O_NOFOLLOW };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(file)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = vec![];
    f.take(64 << 10).read_to_end(&mut bytes).ok()?;
    while matches!(bytes.last(), Some(b'\n' | b'\r')) {
        bytes.pop();
    }
    (!bytes.is_empty()).then_some(bytes)
}

/// `raw` (a path read from a git file) as a path: absolute, or relative to
/// `base`.
pub fn git_joined(base: &Path, raw: Vec<u8>) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let p = PathBuf::from(std::ffi::OsString::from_vec(raw));
    if p.is_absolute() {
        p
    } else {
        base.join(p)
    }
}

/// Names at the top of every writable root that a host tool obeys.
pub const ROOT_SURFACE: &[&str] = &[
    ".git",
    ".gitmodules",
    ".envrc",
    ".vscode",
    ".idea",
    ".devcontainer",
    ".zed",
    ".husky",
    ".githooks",
    "airlock.toml",
    ".airlock",
];

/// Hook managers' files: the hook git runs on the host reads them and runs
/// what they name (SPEC §4.5). Protected at the top of every writable root,
/// repository or not (the sandbox could `git init` and the user install
/// the hooks later), and judged at the top of every nested repository's
/// work tree (nested.rs).
pub const HOOK_MANAGERS: &[&str] = &[
    ".pre-commit-config.yaml",
    ".pre-commit-config.yml",
    ".pre-commit-hooks.yaml",
    "lefthook.yml",
    "lefthook.yaml",
    "lefthook.toml",
    "lefthook.json",
    "lefthook.jsonc",
    ".lefthook.yml",
    ".lefthook.yaml",
    ".lefthook.toml",
    ".lefthook.json",
    ".lefthook.jsonc",
    "lefthook-local.yml",
    "lefthook-local.yaml",
    "lefthook-local.toml",
    "lefthook-local.json",
    ".lefthook-local.yml",
    ".lefthook-local.yaml",
    ".lefthook-local.toml",
    ".lefthook-local.json",
    ".lefthook",
    ".lefthook-local",
    ".config/lefthook.yml",
    ".config/lefthook.yaml",
    ".overcommit.yml",
    ".git-hooks",
    ".simple-git-hooks.json",
    ".simple-git-hooks.js",
    ".simple-git-hooks.cjs",
    ".simple-git-hooks.mjs",
    "simple-git-hooks.json",
    "simple-git-hooks.js",
    "simple-git-hooks.cjs",
    "simple-git-hooks.mjs",
    ".huskyrc",
    ".huskyrc.json",
    ".huskyrc.js",
    ".huskyrc.yaml",
    ".huskyrc.yml",
    "husky.config.js",
    ".lintstagedrc",
    ".lintstagedrc.json",
    ".lintstagedrc.yaml",
    ".lintstagedrc.yml",
    ".lintstagedrc.js",
    ".lintstagedrc.cjs",
    ".lintstagedrc.mjs",
    "lint-staged.config.js",
    "lint-staged.config.cjs",
    "lint-staged.config.mjs",
    // commitlint, which a `commit-msg` hook runs: its configuration is a
    // module it loads (and so runs) at every commit.
    "commitlint.config.js",
    "commitlint.config.cjs",
    "commitlint.config.mjs",
    "commitlint.config.ts",
    "commitlint.config.cts",
    "commitlint.config.mts",
    ".commitlintrc",
    ".commitlintrc.json",
    ".commitlintrc.yaml",
    ".commitlintrc.yml",
    ".commitlintrc.js",
    ".commitlintrc.cjs",
    ".commitlintrc.mjs",
    ".commitlintrc.ts",
    ".commitlintrc.cts",
    ".commitlintrc.mts",
];

/// A project's package-manager files that make the user's next install or
/// script on the host run code the project names: protected at the top of
/// every writable root (and, like the hook managers', at the top of every
/// nested repository's work tree). The manifests themselves (scripts in
/// `package.json`) are the project's code, which the user runs knowingly.
pub const PACKAGE_MANAGER_CODE: &[&str] = &[
    // npm (and pnpm, yarn 1, bun read it): `script-shell`, `node-options`
    // (`--require`), `onload-script`, `git`, `npm`-path keys run programs.
    ".npmrc",
    // yarn 1: `yarn-path` runs the file it names instead of yarn.
    ".yarnrc",
    // yarn 2+: `yarnPath` runs the named release instead of yarn, and
    // `plugins` are modules yarn loads; both usually live in `.yarn/`.
    ".yarnrc.yml",
    ".yarn/releases",
    ".yarn/plugins",
    // pnpm loads these modules and runs their hooks on every install.
    ".pnpmfile.cjs",
    ".pnpmfile.mjs",
    // bun: `preload` modules run before every `bun run`/`bun test`.
    "bunfig.toml",
];

/// Files that name the program a host tool runs in place of its own, on
/// any use in the project, not only a build the user asks for: rustup's
/// toolchain `path` (every `cargo`/`rustc`, a shell prompt's `rustc
/// --version`, rust-analyzer opening the folder), cargo's `rustc-wrapper`,
/// `rustc` and `runner` keys, a devcontainer's `initializeCommand` (run on
/// the host), mise's `hooks` and `env._.source` (run on `cd`, like
/// direnv's `.envrc`). Red team round 5.
pub const TOOL_REDIRECTS: &[&str] = &[
    "rust-toolchain.toml",
    "rust-toolchain",
    ".cargo/config.toml",
    ".cargo/config",
    ".devcontainer.json",
    ".mise.toml",
    "mise.toml",
    ".mise.local.toml",
    "mise.local.toml",
    ".mise",
    ".config/mise.toml",
    ".config/mise",
    // asdf's and mise's `path:` versions run the binary named for every
    // shimmed command in the directory (a prompt's `node -v` too).
    ".tool-versions",
    // bazelisk downloads from `.bazeliskrc`'s `BAZELISK_BASE_URL`
    // unverified. (Its `tools/bazel`, run in place of bazel, is judged by
    // name wherever it is (`redirects_tool`): protected while absent, a
    // `tools/` directory the sandbox made would be set aside whole.)
    ".bazeliskrc",
];

/// Project settings of coding agents (and the editors they live in) that
/// make the agent, when the user next starts it on the host, run commands:
/// hooks, MCP servers (each a command), status lines, credential helpers,
/// custom commands with shell steps. An agent running inside the sandbox
/// reads them and cannot change them; one it plants is moved away.
pub const AGENT_CONFIGS: &[&str] = &[
    // Claude Code: hooks, `statusLine`, `apiKeyHelper`, MCP servers and
    // permissions in the settings; hook scripts; commands whose `!` lines
    // run in the shell.
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".claude/hooks",
    ".claude/commands",
    ".mcp.json",
    // Cursor: `mcp.json`, `hooks.json`, `environment.json` (install steps).
    ".cursor",
    // Codex CLI: `config.toml` (MCP servers, `notify` command).
    ".codex",
    // Gemini CLI: `settings.json` (MCP servers, hooks, tool commands) and
    // `commands/` with `!{…}` shell steps.
    ".gemini",
    // Kiro (hooks, MCP), Roo Code and Amazon Q (`mcp.json`), Continue (MCP
    // servers), opencode (MCP servers, plugins it loads as modules), aider
    // (`lint-cmd`, `test-cmd`).
    ".kiro",
    ".roo",
    ".amazonq",
    ".continue",
    ".opencode",
    "opencode.json",
    "opencode.jsonc",
    ".aider.conf.yml",
];

/// What a host tool obeys at the top of a project's tree, besides
/// Whether `name` in a directory named `dir` is a file rustup, cargo or
/// mise reads from the directory a command runs in and from every one
/// above it (so a crate's own, deep in a workspace, counts): rustup's
/// toolchain `path`, cargo's `rustc-wrapper`/`runner`, mise's hooks. At
/// the top of a root they are in the protected set too ([`TOOL_REDIRECTS`]); below it the post-run search judges them (integrity/nested.rs) and review marks them (red team round 6).
pub fn redirects_tool(dir: &std::ffi::OsStr, name: &std::ffi::OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let n = name.as_bytes();
    let mise_file =
        |n: &[u8]| (n.starts_with(b"mise.") || n.starts_with(b".mise.")) && n.ends_with(b".toml");
    // Read from the directory a tool runs in (or the nearest package's):
    // a subdirectory's copy wins there as the top's does at the top (red
    // team round 9).
    let nearest_wins = matches!(
        n,
        b".tool-versions"
            | b".bazeliskrc"
            | b".yarnrc"
            | b".yarnrc.yml"
            | b".npmrc"
            | b"bunfig.toml"
            | b".pnpmfile.cjs"
            | b".pnpmfile.mjs"
            | b".bazelrc"
            // REPLs and editors that run what they find where they start
            // (red team round 10): irb and pry, R, GHCi, the OCaml
            // toplevel, vi's `exrc`, Neovim's and lazy.nvim's local files.
            | b".irbrc"
            | b".pryrc"
            | b".Rprofile"
            | b".ghci"
            | b".ocamlinit"
            | b".exrc"
            | b".nvimrc"
            | b".nvim.lua"
            | b".lazy.lua"
            // Red team round 12: pdb's and Perl's debugger start-up
            // files, Vim's own local rc files under `exrc`, IEx's, R's
            // environment file (it can name a profile to run), and the
            // debuggers' local init files.
            | b".pdbrc"
            | b".perldb"
            | b".vimrc"
            | b"_vimrc"
            | b".gvimrc"
            | b"_gvimrc"
            | b"_exrc"
            | b".iex.exs"
            | b".Renviron"
            | b".gdbinit"
            | b".lldbinit"
            // What a trusted `.envrc` sources without direnv asking again
            // (`source_env_if_exists .envrc.local`; red team round 13).
            | b".envrc.local"
            | b".envrc.private"
            // Red team round 15: the third common name.
            | b".envrc.user"
    );
    matches!(n, b"rust-toolchain" | b"rust-toolchain.toml" | b".rtx.toml")
        || nearest_wins
        || mise_file(n)
        || (dir == ".cargo" && matches!(n, b"config" | b"config.toml"))
        || (matches!(dir.as_bytes(), b".mise" | b"mise") && n.ends_with(b".toml"))
        || (dir == ".config" && n.starts_with(b"mise"))
        || (dir == "tools" && n == b"bazel")
        // A Mercurial repository's own configuration (its hooks run on the
        // host's next `hg` there, as a git config's would).
        || (dir == ".hg" && n == b"hgrc")
}

/// Whether `name` is a directory that [`redirects_tool`] judges files in
/// (`.cargo/config.toml`, `.hg/hgrc`, `.config/mise.toml`, …): made as a
/// link to a directory elsewhere, cargo, hg and mise read through it as
/// through the directory, while the files' own path names no such
/// directory. A link by such a name a sandbox makes is judged as the
/// files would be (red team round 14).
pub fn redirect_dir(name: &std::ffi::OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    matches!(
        name.as_bytes(),
        b".cargo" | b".hg" | b".mise" | b"mise" | b".config" | b"tools" | b".yarn" | b"conf.d"
    )
}

/// [`redirects_tool`] by a file's whole path: also mise's `conf.d`
/// (`mise/conf.d/*.toml`, `.mise/conf.d/`, `.config/mise/conf.d/`), whose
/// files mise reads as its config (red team round 15).
pub fn redirects_tool_path(path: &Path) -> bool {
    let name = path.file_name().unwrap_or_default();
    let dir = path.parent().and_then(Path::file_name).unwrap_or_default();
    redirects_tool(dir, name) || mise_conf_d(path)
}

/// Whether `path` is a `.toml` in a mise `conf.d` directory.
fn mise_conf_d(path: &Path) -> bool {
    let dir = path.parent();
    dir.and_then(Path::file_name).is_some_and(|d| d == "conf.d")
        && path.extension().is_some_and(|e| e == "toml")
        && dir
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .is_some_and(|g| g == "mise" || g == ".mise")
}

/// [`redirect_dir`] for a link at `link`: `tools` only when what it leads
/// to holds `bazel` (bazelisk runs `tools/bazel`; a `tools` link is
/// otherwise an ordinary thing to make).
pub fn redirect_link(link: &Path) -> bool {
    match link.file_name() {
        Some(n) if n == "tools" => std::fs::symlink_metadata(link.join("bazel")).is_ok(),
        // mise's `conf.d`, made a link (red team round 15).
        Some(n) if n == "conf.d" => link
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|g| g == "mise" || g == ".mise"),
        Some(n) => redirect_dir(n),
        None => false,
    }
}

/// [`ROOT_SURFACE`]: hook managers', package managers' and agents' files.
/// At the top of every writable root, and of every nested repository's
/// work tree (nested.rs); review marks them at any depth (review/scan.rs).
pub fn project_surface() -> impl Iterator<Item = &'static &'static str> {
    HOOK_MANAGERS
        .iter()
        .chain(PACKAGE_MANAGER_CODE)
        .chain(TOOL_REDIRECTS)
        .chain(AGENT_CONFIGS)
}

/// Below HOME: start-up files, tool configuration that names programs to
/// run, and airlock's own files. They matter when HOME, or one of these,
/// lies inside a writable root.
pub const HOME_SURFACE: &[&str] = &[
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".zlogout",
    ".inputrc",
    ".pam_environment",
    ".xprofile",
    ".xsessionrc",
    ".gitconfig",
    ".npmrc",
    ".pypirc",
    ".cargo/config.toml",
    ".cargo/config",
    ".cargo/bin",
    ".local/bin",
    "bin",
    ".ssh",
    ".vimrc",
    ".emacs",
    ".emacs.d",
    ".config/git",
    ".config/fish",
    ".config/nvim",
    ".config/autostart",
    ".config/systemd",
    ".config/environment.d",
    ".config/Code/User",
    ".config/direnv",
    ".config/airlock",
    ".local/share/airlock",
    ".config/pip",
    ".config/uv",
    ".bashrc.d",
    ".zshrc.d",
    ".oh-my-zsh",
    ".tmux.conf",
    ".config/tmux",
    ".config/starship.toml",
    ".config/mise",
    ".config/nix",
    ".config/containers",
    ".docker",
    ".vscode",
    ".vscode-server",
    ".cursor",
    ".local/lib",
    ".local/share/applications",
    ".local/share/systemd",
    ".gnupg",
    ".netrc",
    ".git-credentials",
    ".gitignore_global",
    ".condarc",
    ".Rprofile",
    ".irbrc",
    ".pythonrc",
    ".npm-global",
    ".yarnrc",
    ".yarnrc.yml",
    ".config/pnpm",
    ".huskyrc",
    "Library/LaunchAgents",
    // Logins whose tools run a program they name (red team round 10):
    // kubectl's `exec` plugins, the AWS CLI's `credential_process`,
    // docker's `credsStore`/`credHelpers`, gh's `!` aliases, gpg-agent's
    // `pinentry-program`, terraform's `dev_overrides`, Gradle's JVM
    // arguments, Maven's settings.
    ".kube/config",
    ".aws/config",
    ".aws/credentials",
    ".docker/config.json",
    ".config/gh/config.yml",
    ".gnupg/gpg-agent.conf",
    ".terraformrc",
    ".gradle/gradle.properties",
    ".m2/settings.xml",
];

/// When `/` itself is writable (only with an explicit `--workspace /` or
/// `--write /`), the system's own start-up and configuration.
pub const SYSTEM_SURFACE: &[&str] = &[
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/boot",
    "/opt",
    "/root",
    "/var/spool",
    "/var/lib",
];

/// One protected path and why it is protected.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Protected {
    /// The writable root it lies in: what the post-run check walks from.
    pub root: PathBuf,
    /// The path below `root` (never empty, never `..`).
    pub rel: PathBuf,
    /// Part of git's surface: a new file here is sanitised, not only moved.
    pub git: bool,
    /// Recorded with its contents (a git directory or a system directory
    /// is recorded as one node: only replacing it counts).
    pub deep: bool,
    /// A `deny_read` path: its content is never recorded.
    pub hidden: bool,
}

impl Protected {
    pub fn path(&self) -> PathBuf {
        self.root.join(&self.rel)
    }
}

/// The writable root that holds `p`, the innermost one when they nest.
pub fn root_of<'a>(p: &Path, roots: &'a [PathBuf]) -> Option<&'a PathBuf> {
    roots
        .iter()
        .filter(|r| crate::paths::below(p, r))
        .max_by_key(|r| r.components().count())
}

/// The git directory a `.git` entry names: itself when it is a directory,
/// the `gitdir:` target when it is a file (worktrees, submodules).
fn git_dir_of(dot_git: &Path) -> Option<PathBuf> {
    let meta = std::fs::symlink_metadata(dot_git).ok()?;
    if meta.is_dir() {
        return Some(dot_git.to_path_buf());
    }
    if !meta.is_file() || meta.len() > 4096 {
        return None;
    }
    let text = std::fs::read_to_string(dot_git).ok()?;
    let target = text.lines().next()?.strip_prefix("gitdir:")?.trim();
    let base = dot_git.parent()?;
    std::fs::canonicalize(base.join(target)).ok()
}

/// The repositories whose work tree holds `root`: the root's own (its
/// `.git`), then each ancestor's, nearest first, as (top of the work
/// tree, git directory). Every one counts, not only the nearest: git in an
/// outer repository reads its own configuration, whatever lies between.
fn enclosing_repositories(root: &Path) -> Vec<(PathBuf, PathBuf)> {
    root.ancestors()
        .filter_map(|top| git_dir_of(&top.join(DOT_GIT)).map(|gd| (top.to_path_buf(), gd)))
        .collect()
}

/// The surface of one git directory, with its submodules and worktrees
/// (which have git directories of their own), to a bounded depth.
pub fn git_dir_surface(git_dir: &Path, depth: u32, out: &mut Vec<PathBuf>) {
    for name in GIT_DIR_SURFACE {
        out.push(git_dir.join(name));
    }
    if depth == 0 {
        return;
    }
    for sub in ["modules", "worktrees"] {
        let Ok(rd) = std::fs::read_dir(git_dir.join(sub)) else {
            continue;
        };
        for e in rd.flatten().take(256) {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                git_dir_surface(&e.path(), depth - 1, out);
            }
        }
    }
}

/// Files and directories a repository's effective configuration brings in:
/// `core.hooksPath` (husky, `.githooks`) and every `include.path` /
/// `includeIf.*.path` target, as git itself reads them (all scopes). A
/// sandbox that rewrites one of them changes what the user's git runs.
/// `top` is the top of the work tree (or any directory, where there is no
/// repository): git is asked from there, and resolves a relative hooks
/// path from there, as git does in a non-bare repository; the paths it
/// shows as origins are relative to it too.
fn git_config_targets(top: &Path, home: &Path) -> Vec<PathBuf> {
    let mut git = std::process::Command::new("git");
    git.args(["config", "--show-origin", "-z", "--get-regexp"])
        .arg(r"^(core\.hookspath|include\.path|includeif\..+\.path)$")
        .current_dir(top)
        .env("GIT_TERMINAL_PROMPT", "0");
    let Some(out_bytes) = crate::child::output_within(&mut git, std::time::Duration::from_secs(2))
    else {
        tracing::warn!("git config in {} did not answer in time", top.display());
        return vec![];
    };
    let text = String::from_utf8_lossy(&out_bytes);
    let items: Vec<&str> = text.split('\0').collect();
    let mut out = vec![];
    for pair in items.chunks(2) {
        let [origin, kv] = pair else { continue };
        let Some((key, value)) = kv.split_once('\n') else {
            continue;
        };
        let origin = origin.strip_prefix("file:").map(PathBuf::from);
        let expand = |v: &str| -> PathBuf {
            match v.strip_prefix("~/") {
                Some(rest) => home.join(rest),
                None => PathBuf::from(v),
            }
        };
        let target = expand(value);
        let abs = if target.is_absolute() {
            target
        } else if key.eq_ignore_ascii_case("core.hookspath") {
            top.join(target)
        } else {
            // An include is relative to the file that names it.
            match origin {
                Some(o) => top
                    .join(o)
                    .parent()
                    .map_or(target.clone(), |d| d.join(&target)),
                None => continue,
            }
        };
        // Folded even when absent (red team round 12: an include of a
        // file not made yet stayed `<top>/.git/../x`, which the check could
        // not set aside).
        out.push(crate::paths::as_far_as_exists(&abs));
    }
    out
}

/// Whether any file git reads as configuration in the repository whose
/// git directory is `git_dir` names an include or a hooks path: the
/// user's and the system's, the repository's own (`config`,
/// `config.worktree`, and the common directory's of a linked worktree),
/// or configuration given in the environment. When none does, `git
/// config` can list no target, so it is not run.
pub fn repo_config_mentions_targets(git_dir: &Path, home: Option<&Path>) -> bool {
    if ["GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT", "GIT_CONFIG"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        return true;
    }
    let mut files = vec![git_dir.join("config"), git_dir.join("config.worktree")];
    if let Ok(common) = std::fs::read_to_string(git_dir.join("commondir")) {
        let common = git_dir.join(common.trim_end_matches(['\n', '\r']));
        files.push(common.join("config"));
    }
    user_git_config_mentions_targets(home) || files.iter().any(|f| mentions_targets(f))
}

fn mentions_targets(file: &Path) -> bool {
    std::fs::read(file).is_ok_and(|text| {
        let lower = text.to_ascii_lowercase();
        [&b"include"[..], b"hookspath"]
            .iter()
            .any(|w| lower.windows(w.len()).any(|x| x == *w))
    })
}

/// Whether the user's or the system's git configuration names an include
/// or a hooks path (one read of each file; most name neither).
pub fn user_git_config_mentions_targets(home: Option<&Path>) -> bool {
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| home.map(|h| h.join(".config")));
    let mut files = vec![PathBuf::from("/etc/gitconfig")];
    files.extend(home.map(|h| h.join(".gitconfig")));
    files.extend(xdg.map(|x| x.join("git/config")));
    files.extend(std::env::var_os("GIT_CONFIG_GLOBAL").map(PathBuf::from));
    files.extend(std::env::var_os("GIT_CONFIG_SYSTEM").map(PathBuf::from));
    files.iter().any(|f| mentions_targets(f))
}

pub struct Inputs<'a> {
    /// Canonical writable roots.
    pub roots: &'a [PathBuf],
    pub home: &'a Path,
    /// `deny_write` from the policy, resolved.
    pub deny_write: &'a [PathBuf],
    /// `deny_read`, resolved: one the sandbox creates in a writable root
    /// (to link it, or to read what the user later puts there) is moved away.
    pub deny_read: &'a [PathBuf],
    /// Extra absolute paths airlock obeys (its managed policy, trust store, CA).
    pub airlock_files: &'a [PathBuf],
}

/// Every protected path that lies inside a writable root.
pub fn compute(i: &Inputs) -> Vec<Protected> {
    let mut candidates: Vec<(PathBuf, bool)> = vec![];
    let deny_read = crate::paths::Prefixes::new(i.deny_read);
    let hidden = |p: &Path| deny_read.covers(p);
    for root in i.roots {
        for name in ROOT_SURFACE.iter().chain(project_surface()) {
            candidates.push((root.join(name), *name == ".git"));
        }
        let dot_git = root.join(".git");
        // The root's own repository, and every repository that encloses
        // it (a workspace that is a subdirectory of a monorepo): the
        // configuration of each may name hooks or includes inside the root
        // (`core.hooksPath = app/githooks` in W, the workspace W/app), and
        // the user's next git command there runs or obeys them. What lies
        // outside the roots is dropped below; an enclosing repository's
        // `.git` outside the root is not writable anyway.
        let repos = enclosing_repositories(root);
        let mut asked = false;
        for (top, gd) in &repos {
            // Asked of git only when a file it reads here mentions an
            // include or a hooks path: most name neither, and running
            // git was most of what a run in a repository cost.
            if repo_config_mentions_targets(gd, Some(i.home)) {
                asked = true;
                candidates.extend(
                    git_config_targets(top, i.home)
                        .into_iter()
                        .map(|p| (p, true)),
                );
            }
            let mut s = vec![];
            git_dir_surface(gd, 3, &mut s);
            candidates.extend(s.into_iter().map(|p| (p, true)));
        }
        if !repos.iter().any(|(top, _)| top == root) {
            // No repository at the root yet: its surface is protected while
            // absent, so a `git init` inside cannot plant hooks unseen.
            let mut s = vec![];
            git_dir_surface(&dot_git, 0, &mut s);
            candidates.extend(s.into_iter().map(|p| (p, true)));
            // The user's and the system's includes and hooks path reach
            // every repository below (an `includeIf "gitdir:…"` naming
            // a file in this root, red team round 21): asked of git only
            // when their files mention them (and not again where an
            // enclosing repository's answer already held them).
            if !asked && user_git_config_mentions_targets(Some(i.home)) {
                candidates.extend(
                    git_config_targets(root, i.home)
                        .into_iter()
                        .map(|p| (p, true)),
                );
            }
        }
        if root.as_path() == Path::new("/") {
            candidates.extend(SYSTEM_SURFACE.iter().map(|p| (PathBuf::from(p), false)));
        }
    }
    let config_home = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    for rel in HOME_SURFACE {
        candidates.push((i.home.join(rel), false));
    }
    // Everything `~/.config` holds in the set, where XDG_CONFIG_HOME puts
    // it instead.
    if let Some(c) = &config_home {
        for sub in HOME_SURFACE
            .iter()
            .filter_map(|r| r.strip_prefix(".config/"))
        {
            candidates.push((c.join(sub), false));
        }
    }
    candidates.extend(i.deny_write.iter().map(|p| (p.clone(), false)));
    candidates.extend(i.deny_read.iter().map(|p| (p.clone(), false)));
    candidates.extend(i.airlock_files.iter().map(|p| (p.clone(), false)));
    candidates.extend(through_links(&candidates, i.roots));

    let mut out: Vec<Protected> = candidates
        .into_iter()
        .filter_map(|(p, git)| {
            let root = root_of(&p, i.roots)?;
            let rel = p.strip_prefix(root).ok()?.to_path_buf();
            let deep = rel.file_name() != Some(std::ffi::OsStr::new(".git"))
                && !(root.as_path() == Path::new("/")
                    && SYSTEM_SURFACE.iter().any(|s| p == Path::new(s)));
            Some(Protected {
                root: root.clone(),
                rel,
                git,
                deep,
                hidden: hidden(&p),
            })
        })
        .collect();
    out.sort();
    out.dedup_by(|a, b| a.root == b.root && a.rel == b.rel);
    out
}

/// For a candidate reached through links (`~/.config` a link into a
/// dotfiles checkout, `~/.gitconfig` one to a file there, `dotfiles`
/// itself a link): every link on its way inside a writable root, so that
/// one re-pointed during the run is a change, and where the links lead,
/// when a writable root holds it, so that a file written through them is
/// too. A file met where a directory should be is taken as such a link
/// (the path is blocked). (A link the run puts on the way of an absent
/// candidate turns it from absent to blocked: a creation, `snapshot.rs`.)
fn through_links(candidates: &[(PathBuf, bool)], roots: &[PathBuf]) -> Vec<(PathBuf, bool)> {
    let mut out = vec![];
    // What each path inside a root is: a link's target, a blocker, or plain.
    let mut seen: HashMap<PathBuf, Step> = HashMap::new();
    for (p, git) in candidates {
        let (links, end) = links_on_the_way(p, roots, &mut seen);
        if links.is_empty() {
            continue;
        }
        out.extend(links.into_iter().map(|l| (l, *git)));
        if let Some(end) = end.filter(|e| e != p && root_of(e, roots).is_some()) {
            out.push((end, *git));
        }
    }
    out
}

#[derive(Clone)]
enum Step {
    Plain,
    Link(PathBuf),
    Blocker,
}

/// The links (and blockers) met resolving `p` below its writable root, and
/// the path it resolves to (`None` past a blocker, or after 40 links).
fn links_on_the_way(
    p: &Path,
    roots: &[PathBuf],
    seen: &mut HashMap<PathBuf, Step>,
) -> (Vec<PathBuf>, Option<PathBuf>) {
    let mut links = vec![];
    let mut path = p.to_path_buf();
    'resolve: for _ in 0..40 {
        let Some(root) = root_of(&path, roots).cloned() else {
            return (links, Some(path));
        };
        let Ok(rest) = path.strip_prefix(&root).map(Path::to_path_buf) else {
            return (links, Some(path));
        };
        let comps: Vec<Component> = rest.components().collect();
        let mut at = root.clone();
        for (i, c) in comps.iter().enumerate() {
            match c {
                Component::Normal(n) => at.push(n),
                Component::ParentDir => {
                    // `at` holds no link: lexical is what the kernel does.
                    at.pop();
                    continue;
                }
                _ => continue,
            }
            let step = seen
                .entry(at.clone())
                .or_insert_with(|| match std::fs::symlink_metadata(&at) {
                    Ok(m) if m.file_type().is_symlink() => std::fs::read_link(&at)
                        .map(Step::Link)
                        .unwrap_or(Step::Blocker),
                    Ok(m) if !m.is_dir() && i + 1 < comps.len() => Step::Blocker,
                    _ => Step::Plain,
                })
                .clone();
            match step {
                Step::Plain => {}
                Step::Blocker => {
                    links.push(at);
                    return (links, None);
                }
                Step::Link(target) => {
                    links.push(at.clone());
                    let mut next = at.parent().unwrap_or(Path::new("/")).join(target);
                    for c in &comps[i + 1..] {
                        next.push(c.as_os_str());
                    }
                    // Folded by name: an approximation only where a `..`
                    // follows a link, which the next turn resolves.
                    path = crate::paths::lexical(&next);
                    continue 'resolve;
                }
            }
        }
        return (links, Some(at));
    }
    (links, None)
}

/// Directories that must not be renamed or replaced while the sandbox runs:
/// every ancestor of a protected (or hidden) path whose parent the sandbox
/// can write. Renaming a parent would carry a mount-based protection away
/// with it (SPEC §4.5); an ancestor that is a mount point cannot be renamed.
pub fn ancestors_to_pin(targets: &[PathBuf], roots: &[PathBuf]) -> Vec<PathBuf> {
    let writable = |p: &Path| roots.iter().any(|r| crate::paths::under(p, r));
    let mut out = vec![];
    // Targets share most of their ancestors (HOME, the workspace): a
    // directory seen once had its own ancestors looked at then.
    let mut seen = std::collections::HashSet::new();
    for t in targets {
        let mut a = t.parent();
        while let Some(dir) = a {
            if !seen.insert(dir) {
                break;
            }
            let Some(parent) = dir.parent() else { break };
            // A directory, not a link to one.
            if writable(parent) && std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
                out.push(dir.to_path_buf());
            }
            a = Some(parent);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A `deny_read` file in a writable root with another hard link: an earlier
/// run could have made the link (while the name was absent) to read what the
/// user later writes there. Refused until the extra link is gone.
pub fn check_deny_read_links(deny_read: &[PathBuf], roots: &[PathBuf]) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    for p in deny_read {
        if root_of(p, roots).is_none() {
            continue;
        }
        // The files in a hidden directory too (a `~/.kube/config` with a
        // backup's second name elsewhere in HOME: red team round 11), to a
        // bound: past it, a second name deep in a large cache is a residual.
        let mut files = vec![];
        let mut budget = 1000usize;
        let mut stack = vec![(p.clone(), 0usize)];
        while let Some((at, depth)) = stack.pop() {
            let Ok(m) = std::fs::symlink_metadata(&at) else {
                continue;
            };
            if m.is_file() {
                files.push((at, m.nlink()));
            } else if m.is_dir() && depth < 3 {
                for e in std::fs::read_dir(&at).into_iter().flatten().flatten() {
                    if budget == 0 {
                        break;
                    }
                    budget -= 1;
                    stack.push((e.path(), depth + 1));
                }
            }
        }
        if let Some((f, n)) = files.into_iter().find(|(_, n)| *n > 1) {
            return Err(format!(
                "{} is hidden from the sandbox (deny_read) but has {n} hard links; a sandboxed run could have made one to read it. \
                 Find them with `find <workspace> -samefile {}` and remove the extra links",
                f.display(),
                f.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protected_paths_lie_in_writable_roots_only() {
        let home = PathBuf::from("/home/u");
        let roots = vec![PathBuf::from("/home/u/proj")];
        let set = compute(&Inputs {
            roots: &roots,
            home: &home,
            deny_write: &[PathBuf::from("/home/u/proj/.git/hooks")],
            deny_read: &[],
            airlock_files: &[PathBuf::from("/home/u/.config/airlock/policy.toml")],
        });
        let paths: Vec<PathBuf> = set.iter().map(Protected::path).collect();
        assert!(paths.contains(&PathBuf::from("/home/u/proj/.git/config")));
        assert!(paths.contains(&PathBuf::from("/home/u/proj/.git/hooks")));
        assert!(paths.contains(&PathBuf::from("/home/u/proj/airlock.toml")));
        assert!(paths.contains(&PathBuf::from("/home/u/proj/.airlock")));
        // HOME is not writable here: its files are not the post-run check's.
        assert!(!paths.iter().any(|p| p.starts_with("/home/u/.bashrc")));
        assert!(set.iter().all(|p| p.root == roots[0]));
    }

    #[test]
    fn home_as_a_root_grows_the_set() {
        let home = PathBuf::from("/home/u");
        let roots = vec![home.clone()];
        let set = compute(&Inputs {
            roots: &roots,
            home: &home,
            deny_write: &[],
            deny_read: &[],
            airlock_files: &[],
        });
        let paths: Vec<PathBuf> = set.iter().map(Protected::path).collect();
        for p in [
            ".bashrc",
            ".gitconfig",
            ".config/airlock",
            ".local/bin",
            ".ssh",
        ] {
            assert!(paths.contains(&home.join(p)), "{p}");
        }
    }

    #[test]
    fn root_of_picks_the_innermost_root() {
        let roots = vec![PathBuf::from("/a"), PathBuf::from("/a/b")];
        assert_eq!(
            root_of(Path::new("/a/b/c"), &roots),
            Some(&PathBuf::from("/a/b"))
        );
        assert_eq!(
            root_of(Path::new("/a/b"), &roots),
            Some(&PathBuf::from("/a"))
        );
        assert_eq!(root_of(Path::new("/x"), &roots), None);
    }
}
