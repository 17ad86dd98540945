//! Hook managers' configuration is part of the protected set (SPEC §4.5):
//! `git commit` on the host runs whatever `.pre-commit-config.yaml`,
//! lefthook's, overcommit's or lint-staged's file names, just as it runs a
//! `.husky` hook. The sandbox cannot change the user's file, and a file it
//! creates is moved to the quarantine. Root and an ordinary user, both tiers.

use std::path::{Path, PathBuf};

use airlock_tests::repos::{git_available, host};
use airlock_tests::tiers::{command, show, TIERS};
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-hookmgr"))
}

const USER_CONFIG: &str = "repos:\n- repo: local\n  hooks: []\n";

/// Files the sandbox tries to create; none exists before.
const CREATED: &[&str] = &[
    "lefthook.yml",
    ".lefthook.yaml",
    ".overcommit.yml",
    ".lintstagedrc.json",
    ".simple-git-hooks.json",
    ".config/lefthook.yml",
];

#[test]
fn hook_manager_files_cannot_be_changed_or_planted() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for tier in TIERS {
        for who in Who::all() {
            let as_user = who == Who::Nobody;
            let f = Fixture::new_in(&base());
            f.write(".pre-commit-config.yaml", USER_CONFIG);
            who.prepare(&f);
            let out = host(&f, who, &f.ws, "git", &["init", "-q", "."]);
            assert_eq!(out.code, 0, "{}", show(&out));
            let evil = "repos:\\n- repo: local\\n  hooks:\\n  - id: x\\n    entry: touch /tmp/PWNED\\n    language: system\\n";
            let mut script = format!(
                "printf '{evil}' > .pre-commit-config.yaml 2>/dev/null; \
                 mv .pre-commit-config.yaml moved.yaml 2>/dev/null; \
                 rm -f .pre-commit-config.yaml 2>/dev/null; mkdir -p .config; "
            );
            for c in CREATED {
                script.push_str(&format!("printf '{evil}' > {c}; "));
            }
            script.push_str("echo allowed > notes.txt && echo done");
            let ctx = format!("{tier:?} {who:?}");
            let out = run(&mut command(
                &f,
                tier,
                as_user,
                &["--network", "none"],
                &script,
            ));
            assert!(out.stdout.contains("done"), "{ctx}: {}", show(&out));
            // The user's file is theirs, unchanged, where it was.
            assert_eq!(
                std::fs::read_to_string(f.ws.join(".pre-commit-config.yaml")).ok(),
                Some(USER_CONFIG.to_string()),
                "{ctx}: {}",
                show(&out)
            );
            // What the sandbox planted is not where a hook would read it.
            for c in CREATED {
                assert!(
                    !f.ws.join(c).exists(),
                    "{ctx}: {c} was left in place: {}",
                    show(&out)
                );
            }
            assert!(
                out.stderr.contains("quarantine"),
                "{ctx}: nothing reported: {}",
                show(&out)
            );
            // The rest of the workspace is as writable as before.
            assert_eq!(
                std::fs::read_to_string(f.ws.join("notes.txt")).ok(),
                Some("allowed\n".to_string()),
                "{ctx}"
            );
        }
    }
}

/// The same files at the top of a nested repository's work tree: what the
/// sandbox plants there is moved to the quarantine; the user's own file,
/// untouched, stays.
#[test]
fn hook_manager_files_planted_in_a_nested_repository_are_quarantined() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("lib/lefthook.yml", "pre-commit:\n  commands: {}\n");
        who.prepare(&f);
        let lib = f.ws.join("lib");
        let out = host(&f, who, &lib, "git", &["init", "-q", "."]);
        assert_eq!(out.code, 0, "{}", show(&out));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let out = run(&mut command(
            &f,
            airlock_tests::tiers::Tier::Full,
            who == Who::Nobody,
            &["--network", "none"],
            "printf 'repos: []\\n' > lib/.pre-commit-config.yaml; mkdir -p lib/.lefthook/pre-commit; \
             printf 'touch /tmp/x\\n' > lib/.lefthook/pre-commit/run.sh; cat lib/lefthook.yml >/dev/null; \
             mkdir -p lib/.claude && echo '{}' > lib/.claude/settings.json && echo '{}' > lib/.mcp.json && \
             echo x > lib/commitlint.config.js; \
             mkdir -p lib/.vscode lib/.idea lib/.devcontainer lib/.zed lib/.husky && \
             echo '{\"tasks\":[]}' > lib/.vscode/tasks.json && echo x > lib/.idea/workspace.xml && \
             echo '{}' > lib/.devcontainer/devcontainer.json && echo '[]' > lib/.zed/tasks.json && \
             echo 'touch /tmp/x' > lib/.husky/pre-commit && echo 'echo hi' > lib/.envrc && \
             echo '[submodule]' > lib/.gitmodules; echo done",
        ));
        assert!(out.stdout.contains("done"), "{who:?}: {}", show(&out));
        for planted in [
            ".pre-commit-config.yaml",
            ".lefthook/pre-commit/run.sh",
            ".claude/settings.json",
            ".mcp.json",
            "commitlint.config.js",
            // Red team round 14: editors' folders, husky's, `.envrc`.
            ".vscode/tasks.json",
            ".idea/workspace.xml",
            ".devcontainer/devcontainer.json",
            ".zed/tasks.json",
            ".husky/pre-commit",
            ".envrc",
            ".gitmodules",
        ] {
            assert!(
                !lib.join(planted).exists(),
                "{who:?}: lib/{planted} was left in place: {}",
                show(&out)
            );
        }
        assert_eq!(
            std::fs::read_to_string(lib.join("lefthook.yml"))
                .ok()
                .as_deref(),
            Some("pre-commit:\n  commands: {}\n"),
            "{who:?}: {}",
            show(&out)
        );
    }
}

/// What else a host tool runs or obeys from a project (SPEC §4.5):
/// commitlint's configuration (a `commit-msg` hook loads it), package
/// managers' code hooks (`.npmrc`'s `script-shell`, `.yarnrc.yml`'s
/// `yarnPath`, pnpm's `.pnpmfile.cjs`) and coding agents' settings (hooks,
/// MCP servers). The user's own files stay theirs and readable; what the
/// sandbox plants is moved to the quarantine; the rest of `.claude/`
/// (not commands, hooks or settings) stays writable. Also what names the
/// program a host tool runs on any use (rustup's `rust-toolchain`,
/// cargo's config, a devcontainer, mise).
#[test]
fn package_manager_and_agent_files_cannot_be_changed_or_planted() {
    const USERS: &[(&str, &str)] = &[
        (".npmrc", "fund=false\n"),
        (".claude/settings.json", "{\"permissions\":{}}\n"),
        (".yarnrc.yml", "nodeLinker: node-modules\n"),
        ("rust-toolchain.toml", "[toolchain]\nchannel = \"stable\"\n"),
    ];
    const PLANTED: &[&str] = &[
        "commitlint.config.js",
        ".commitlintrc.json",
        ".claude/settings.local.json",
        ".claude/hooks/stop.sh",
        ".claude/commands/x.md",
        ".mcp.json",
        ".cursor/mcp.json",
        ".codex/config.toml",
        ".gemini/settings.json",
        ".pnpmfile.cjs",
        ".yarn/plugins/evil.cjs",
        ".yarn/releases/yarn-evil.cjs",
        ".yarnrc",
        "bunfig.toml",
        "opencode.json",
        // Red team round 5: files that name the program a host tool runs.
        "rust-toolchain",
        ".cargo/config.toml",
        ".devcontainer.json",
        "mise.toml",
        ".config/mise.toml",
        // ... at any depth: rustup, cargo and mise read them from every
        // directory above the one a command runs in (red team round 6).
        "crates/app/rust-toolchain.toml",
        "crates/lib/.cargo/config.toml",
        "pkg/deep/mise.local.toml",
        // Red team round 9: what asdf, mise, bazelisk and the package
        // managers read from the directory they run in.
        ".tool-versions",
        "tools/bazel",
        ".bazeliskrc",
        "packages/web/.tool-versions",
        "packages/web/.npmrc",
        "packages/web/.yarnrc.yml",
        "packages/web/bunfig.toml",
        "packages/web/.pnpmfile.cjs",
        "packages/web/.bazeliskrc",
        // Red team round 10: REPLs and editors that run what they find
        // where they start.
        ".irbrc",
        "packages/web/.Rprofile",
        "packages/web/.nvim.lua",
        "packages/web/.bazelrc",
        // Red team round 12: debuggers', Vim's, IEx's and R's local
        // start-up files, and a Mercurial repository's config.
        ".pdbrc",
        "packages/web/.perldb",
        "packages/web/.vimrc",
        "_vimrc",
        "packages/web/.iex.exs",
        "packages/web/.Renviron",
        "packages/web/.gdbinit",
        "vendor/lib/.hg/hgrc",
        // Round 13: what a trusted .envrc sources unasked.
        ".envrc.local",
        "packages/web/.envrc.private",
    ];
    for tier in TIERS {
        for who in Who::all() {
            let ctx = format!("{tier:?} {who:?}");
            let f = Fixture::new_in(&base());
            for (rel, text) in USERS {
                f.write(rel, text);
            }
            who.prepare(&f);
            let mut script = String::new();
            for (rel, _) in USERS {
                script.push_str(&format!(
                    "cat {rel}; echo 'script-shell=/tmp/evil' > {rel} 2>/dev/null; rm -f {rel} 2>/dev/null; "
                ));
            }
            for rel in PLANTED {
                let dir = Path::new(rel).parent().unwrap().display().to_string();
                if !dir.is_empty() {
                    script.push_str(&format!("mkdir -p {dir}; "));
                }
                script.push_str(&format!("echo 'touch /tmp/PWNED' > {rel}; "));
            }
            script.push_str(
                "mkdir -p .claude/agents && echo allowed > .claude/agents/a.md && echo done",
            );
            let out = run(&mut command(
                &f,
                tier,
                who == Who::Nobody,
                &["--network", "none"],
                &script,
            ));
            assert!(out.stdout.contains("done"), "{ctx}: {}", show(&out));
            for (rel, text) in USERS {
                assert!(
                    out.stdout.contains(text),
                    "{ctx}: {rel} unreadable: {}",
                    show(&out)
                );
                assert_eq!(
                    std::fs::read_to_string(f.ws.join(rel)).ok().as_deref(),
                    Some(*text),
                    "{ctx}: {rel}: {}",
                    show(&out)
                );
            }
            for rel in PLANTED {
                assert!(
                    !f.ws.join(rel).exists(),
                    "{ctx}: {rel} was left in place: {}",
                    show(&out)
                );
            }
            assert!(out.stderr.contains("quarantine"), "{ctx}: {}", show(&out));
            assert_eq!(
                std::fs::read_to_string(f.ws.join(".claude/agents/a.md"))
                    .ok()
                    .as_deref(),
                Some("allowed\n"),
                "{ctx}: {}",
                show(&out)
            );
        }
    }
}

/// In `--review`, the same files are marked protected in the diff and
/// applied only when named, at the top and in a nested project.
#[test]
fn review_marks_package_manager_and_agent_files_at_any_depth() {
    for who in Who::all() {
        let ctx = format!("{who:?}");
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let out = run(&mut who.wrap(f.command(
            &["--network", "none", "--review"],
            "mkdir -p .claude pkg/.claude && echo '{}' > .claude/settings.json && \
             echo '{}' > pkg/.claude/settings.local.json && echo '{}' > pkg/.mcp.json && \
             echo 'module.exports={}' > pkg/commitlint.config.js && echo x > pkg/.pnpmfile.cjs && \
             echo ok > pkg/plain.txt && echo done",
        )));
        assert!(out.stdout.contains("done"), "{ctx}: {}", show(&out));
        let at = out.stderr.find("held for review as ").expect("held");
        let id = &out.stderr[at + 19..at + 27];
        let bin = airlock_bin();
        let diff = host(
            &f,
            who,
            &f.ws,
            bin.to_str().unwrap(),
            &["changes", "diff", id, "--stat"],
        );
        for rel in [
            ".claude/settings.json",
            "pkg/.claude/settings.local.json",
            "pkg/.mcp.json",
            "pkg/commitlint.config.js",
            "pkg/.pnpmfile.cjs",
        ] {
            let line = diff
                .stdout
                .lines()
                .skip(1)
                .find(|l| l.split_whitespace().any(|w| w == rel))
                .unwrap_or_else(|| panic!("{ctx}: {rel} not shown: {}", show(&diff)));
            assert!(line.contains("[protected"), "{ctx}: {line}");
        }
        let applied = host(
            &f,
            who,
            &f.ws,
            bin.to_str().unwrap(),
            &["changes", "apply", id],
        );
        assert_eq!(applied.code, 0, "{ctx}: {}", show(&applied));
        assert!(f.ws.join("pkg/plain.txt").exists(), "{ctx}");
        assert!(!f.ws.join("pkg/.mcp.json").exists(), "{ctx}");
        assert!(!f.ws.join(".claude/settings.json").exists(), "{ctx}");
    }
}

/// A link made where a directory of tool-redirecting files would be
/// (`deep/.cargo -> ../st/cargo` holding `config.toml`, `.hg -> st/hg`
/// holding `hgrc`, `deep/.config -> ../st/cfg` holding `mise.toml`):
/// cargo, hg and mise read through it, though the files' own paths name
/// no such directory. The link is set aside; an ordinary link stays, and
/// review marks the links protected (red team round 14).
#[test]
fn links_made_in_place_of_tool_directories_are_set_aside() {
    const PLANT: &str = "mkdir -p st/cargo st/hg st/cfg deep/x && \
        printf '[build]\\nrustc-wrapper = \"/tmp/w\"\\n' > st/cargo/config.toml && \
        printf '[hooks]\\npre-commit = touch /tmp/PWNED\\n' > st/hg/hgrc && \
        printf '[hooks]\\nenter = \"touch /tmp/PWNED\"\\n' > st/cfg/mise.toml && \
        ln -s ../st/cargo deep/.cargo && ln -s ../../st/cargo deep/x/.cargo && \
        ln -s st/hg .hg && ln -s ../st/cfg deep/.config && ln -s ../st deep/docs && \
        mkdir -p deep/y/.mise/conf.d deep/z/mise && printf '[hooks]\\n' > deep/y/.mise/conf.d/10.toml && \
        ln -s ../../st/cfg deep/z/mise/conf.d && echo done";
    for tier in TIERS {
        for who in Who::all() {
            let ctx = format!("{tier:?} {who:?}");
            let f = Fixture::new_in(&base());
            who.prepare(&f);
            let out = run(&mut command(
                &f,
                tier,
                who == Who::Nobody,
                &["--network", "none"],
                PLANT,
            ));
            assert!(out.stdout.contains("done"), "{ctx}: {}", show(&out));
            for rel in [
                "deep/.cargo",
                "deep/x/.cargo",
                ".hg",
                "deep/.config",
                // mise's conf.d (red team round 15).
                "deep/y/.mise/conf.d/10.toml",
                "deep/z/mise/conf.d",
            ] {
                assert!(
                    std::fs::symlink_metadata(f.ws.join(rel)).is_err(),
                    "{ctx}: {rel} was left in place: {}",
                    show(&out)
                );
            }
            assert!(
                std::fs::symlink_metadata(f.ws.join("deep/docs")).is_ok(),
                "{ctx}: an ordinary link was set aside: {}",
                show(&out)
            );
        }
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let out = run(&mut who.wrap(f.command(&["--network", "none", "--review"], PLANT)));
        assert!(out.stdout.contains("done"), "{who:?}: {}", show(&out));
        let at = out.stderr.find("held for review as ").expect("held");
        let id = &out.stderr[at + 19..at + 27];
        let bin = airlock_bin();
        let diff = host(
            &f,
            who,
            &f.ws,
            bin.to_str().unwrap(),
            &["changes", "diff", id, "--stat"],
        );
        for rel in ["deep/.cargo", ".hg", "deep/.config"] {
            let line = diff
                .stdout
                .lines()
                .skip(1)
                .find(|l| l.split_whitespace().any(|w| w == rel))
                .unwrap_or_else(|| panic!("{who:?}: {rel} not shown: {}", show(&diff)));
            assert!(line.contains("[protected"), "{who:?}: {line}");
        }
    }
}

/// A dotenv file a sandbox makes where the user's `.envrc` (there or
/// above) may load it (`dotenv_if_exists .env.local`) is set aside:
/// direnv exports it into the user's shell without asking again. Where
/// no `.envrc` is, it stays (red team round 14).
#[test]
fn dotenv_files_a_trusted_envrc_loads_are_not_planted() {
    const PLANT: &str = "mkdir -p svc && echo 'PROMPT_COMMAND=\"touch /tmp/PWNED\"' > .env && \
        echo 'PATH=/tmp/evil:$PATH' > .env.local && echo 'X=1' > svc/.env && \
        echo 'A=1' > .env.example && echo done";
    for who in Who::all() {
        for with_envrc in [true, false] {
            let ctx = format!("{who:?} envrc={with_envrc}");
            let f = Fixture::new_in(&base());
            if with_envrc {
                f.write(
                    ".envrc",
                    "dotenv_if_exists .env\ndotenv_if_exists .env.local\n",
                );
            }
            who.prepare(&f);
            std::thread::sleep(std::time::Duration::from_millis(20));
            let out = run(&mut command(
                &f,
                airlock_tests::tiers::Tier::Full,
                who == Who::Nobody,
                &["--network", "none"],
                PLANT,
            ));
            assert!(out.stdout.contains("done"), "{ctx}: {}", show(&out));
            for rel in [".env", ".env.local", "svc/.env"] {
                assert_eq!(
                    f.ws.join(rel).exists(),
                    !with_envrc,
                    "{ctx}: {rel}: {}",
                    show(&out)
                );
            }
            // A template is nobody's secret, loaded by no default.
            assert!(f.ws.join(".env.example").exists(), "{ctx}");
        }
    }
}

/// A submodule's checkout (its `.git` a `gitdir:` file) is a repository's
/// top too: husky's hook and an editor's tasks planted there are set
/// aside, as in a plain nested repository (red team round 15: the host's
/// `git commit` in the submodule ran the planted hook).
#[test]
fn files_planted_at_a_submodules_top_are_set_aside() {
    if !git_available() {
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let src = f.home.join("src-repo");
        let g = |dir: &Path, args: &[&str]| {
            let out = host(&f, who, dir, "git", args);
            assert_eq!(out.code, 0, "{who:?}: git {args:?}: {}", show(&out));
        };
        std::fs::create_dir_all(&src).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        let id = ["-c", "user.email=t@t", "-c", "user.name=t"];
        g(&src, &["init", "-q", "."]);
        g(
            &src,
            &[&id[..], &["commit", "-q", "--allow-empty", "-m", "s"]].concat(),
        );
        g(&f.ws, &["init", "-q", "."]);
        let url = src.to_str().unwrap();
        g(
            &f.ws,
            &[
                &id[..],
                &[
                    "-c",
                    "protocol.file.allow=always",
                    "submodule",
                    "add",
                    "-q",
                    url,
                    "libs/foo",
                ],
            ]
            .concat(),
        );
        let foo = f.ws.join("libs/foo");
        g(&foo, &["config", "core.hooksPath", ".husky/_"]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let out = run(&mut command(
            &f,
            airlock_tests::tiers::Tier::Full,
            who == Who::Nobody,
            &["--network", "none"],
            "mkdir -p libs/foo/.husky/_ libs/foo/.vscode && \
             printf 'touch /tmp/PWNED\\n' > libs/foo/.husky/pre-commit && \
             echo '{}' > libs/foo/.vscode/tasks.json && echo 'echo hi' > libs/foo/.envrc && echo done",
        ));
        assert!(out.stdout.contains("done"), "{who:?}: {}", show(&out));
        for rel in [".husky/pre-commit", ".vscode/tasks.json", ".envrc"] {
            assert!(
                !foo.join(rel).exists(),
                "{who:?}: libs/foo/{rel} was left in place: {}",
                show(&out)
            );
        }
    }
}

/// What a sandbox writes in a repository's git directory beyond its
/// configuration that makes git run or hide something: a rebase whose
/// next step is `exec`, and a replace ref that makes `git status` show
/// another tree in HEAD's place (hiding the sandbox's edit). Set aside in
/// a run, marked protected in review (red team round 15).
#[test]
fn a_planted_rebase_or_replace_ref_is_set_aside() {
    if !git_available() {
        return;
    }
    const PLANT: &str = "set -e; echo 'EVIL' > src.txt; git add src.txt; \
        T=$(git write-tree); C=$(git -c user.email=t@t -c user.name=t commit-tree $T -m init); \
        git update-ref refs/replace/$(git rev-parse HEAD) $C; git pack-refs --all; \
        mkdir -p .git/rebase-merge; printf 'exec touch /tmp/PWNED\\n' > .git/rebase-merge/git-rebase-todo; \
        git update-index --assume-unchanged src.txt; echo done";
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("src.txt", "good\n");
        who.prepare(&f);
        let g = |args: &[&str]| host(&f, who, &f.ws, "git", args);
        assert_eq!(g(&["init", "-q", "."]).code, 0);
        assert_eq!(g(&["add", "src.txt"]).code, 0);
        let c = g(&[
            "-c",
            "user.email=t@t",
            "-c",
            "user.name=t",
            "commit",
            "-qm",
            "init",
        ]);
        assert_eq!(c.code, 0, "{}", show(&c));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let out = run(&mut command(
            &f,
            airlock_tests::tiers::Tier::Full,
            who == Who::Nobody,
            &["--network", "none"],
            PLANT,
        ));
        assert!(out.stdout.contains("done"), "{who:?}: {}", show(&out));
        assert!(
            !f.ws.join(".git/rebase-merge/git-rebase-todo").exists(),
            "{who:?}: {}",
            show(&out)
        );
        let st = g(&["status", "--short"]);
        assert!(
            st.stdout.contains("src.txt"),
            "{who:?}: the edit is hidden: {}",
            show(&out)
        );
        // Index marks that hide a change are told (red team round 16).
        assert!(
            out.stderr.contains("skip-worktree or assume-unchanged")
                && out.stderr.contains("src.txt"),
            "{who:?}: {}",
            show(&out)
        );
        // Review marks both.
        let f = Fixture::new_in(&base());
        f.write("src.txt", "good\n");
        who.prepare(&f);
        let g = |args: &[&str]| host(&f, who, &f.ws, "git", args);
        assert_eq!(g(&["init", "-q", "."]).code, 0);
        assert_eq!(g(&["add", "src.txt"]).code, 0);
        assert_eq!(
            g(&[
                "-c",
                "user.email=t@t",
                "-c",
                "user.name=t",
                "commit",
                "-qm",
                "init"
            ])
            .code,
            0
        );
        let out = run(&mut who.wrap(f.command(&["--network", "none", "--review"], PLANT)));
        assert!(out.stdout.contains("done"), "{who:?}: {}", show(&out));
        let at = out.stderr.find("held for review as ").expect("held");
        let id = &out.stderr[at + 19..at + 27];
        let bin = airlock_bin();
        let diff = host(
            &f,
            who,
            &f.ws,
            bin.to_str().unwrap(),
            &["changes", "diff", id, "--stat"],
        );
        for l in diff.stdout.lines().skip(1) {
            if l.contains("refs/replace/") || l.contains("git-rebase-todo") {
                assert!(l.contains("[protected"), "{who:?}: {l}");
            }
        }
        assert!(
            diff.stdout.contains("refs/replace/"),
            "{who:?}: {}",
            show(&diff)
        );
    }
}
