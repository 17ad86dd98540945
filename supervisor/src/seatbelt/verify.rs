//! What the Linux tests cannot prove about the Seatbelt profile: they read
//! the profile with an SBPL interpreter that follows Seatbelt's documented
//! rules, but only a Mac runs the real one. `airlock doctor` prints this
//! list on macOS, and docs/src/macos.md carries the same checks (a test keeps the
//! two in step). Each check is one line to run in a scratch git repository
//! with a `.env` file; "refused" means the command fails with "Operation
//! not permitted", "works" that it succeeds.

/// (what is verified only as text, the check to run on a Mac)
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
pub const VERIFY_ON_A_MAC: &[(&str, &str)] = &[
    (
        "the profile compiles (param regexes, path-regex, the pty extension)",
        "airlock run -- /usr/bin/true   # works",
    ),
    (
        "raw-regex semantics: a deny_read glob matches",
        "mkdir -p config/p && echo s > config/p/credentials.json && airlock run -- cat config/p/credentials.json   # refused with deny_read = [\"config/*/credentials.json\"]",
    ),
    (
        "case variants on a case-insensitive volume",
        "airlock run -- sh -c 'echo x >> .GIT/HOOKS/pre-commit; cat .ENV'   # both refused",
    ),
    (
        "rename into place, rename away, gitdir file",
        "airlock run -- sh -c 'mkdir -p x/hooks && mv x sub/.git; mv .env e; mv .git g; mkdir -p a && echo gitdir: /tmp > a/.git'   # all refused",
    ),
    (
        "ancestors up to / when HOME is writable",
        "airlock run --write ~ -- mv ~/.ssh ~/k   # refused",
    ),
    (
        "mkdir -p through protected ancestors still gets EEXIST, not EPERM",
        "airlock run -- mkdir -p \"$PWD/build/x\"   # works",
    ),
    (
        "git still commits",
        "airlock run -- git commit --allow-empty -m t   # works (git init inside a writable root is refused)",
    ),
    (
        "another terminal's tty",
        "airlock run -- sh -c 'echo hi > /dev/ttys000'   # refused (from a different tab)",
    ),
    (
        "ptys opened inside",
        "airlock run -- script -q /dev/null true   # works",
    ),
    (
        "TIOCSTI on the controlling terminal (the profile cannot filter ioctls by command)",
        "airlock run -- python3 -c 'import fcntl,termios; fcntl.ioctl(0, termios.TIOCSTI, b\"x\")'   # refused, or a known gap if macOS allows it",
    ),
    (
        "keychain denied by default",
        "airlock run -- security find-generic-password -s SOME_ITEM -w   # refused; works with [macos] keychain = true",
    ),
    (
        "DNS denied by default",
        "airlock run -- python3 -c 'import socket; socket.getaddrinfo(\"example.com\", 443)'   # fails; resolves with [macos] dnssd = true",
    ),
    (
        "background processes do not survive the run",
        "airlock run -- sh -c 'nohup sleep 301 >/dev/null 2>&1 & python3 -c \"import os,time; os.fork() or (os.setsid(), time.sleep(302))\" &'; sleep 1; pgrep -f \"sleep.30[12]\"   # prints nothing",
    ),
    (
        "descriptors >= 3 are not inherited",
        "exec 7</etc/hosts; airlock run -- ls /dev/fd   # lists 0 1 2 (and ls's own)",
    ),
    (
        "shared temporary directories, the private TMPDIR",
        "airlock run -- sh -c 'touch \"$TMPDIR/ok\" && touch /private/tmp/x'   # first works, second refused",
    ),
    (
        "unix sockets: own ones work, the host's do not",
        "airlock run -- python3 -c 'from multiprocessing import Manager; Manager().dict()'   # works; airlock run -- nc -U /private/var/run/mDNSResponder   # refused",
    ),
    (
        "hard links, LaunchServices, Apple events",
        "airlock run -- sh -c 'ln .env x; open -a Calculator; osascript -e \"tell app \\\"Terminal\\\" to do script \\\"id\\\"\"'   # all refused",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The book's "verify on a Mac" list (docs/src/macos.md) is this list.
    #[test]
    fn docs_list_every_check() {
        let page =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/macos.md"))
                .expect("docs/src/macos.md");
        let block: String = VERIFY_ON_A_MAC
            .iter()
            .map(|(what, check)| format!("- {what}:\n  `{check}`\n"))
            .collect();
        assert!(
            page.contains(&block),
            "docs/src/macos.md's \"verify on a Mac\" list must read:\n{block}"
        );
    }
}
