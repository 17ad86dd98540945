//! HOME under /tmp (issue #28, item 10): the sandbox's /tmp is its own, so
//! the files airlock makes for it under HOME (the trust bundle of
//! inspection, the presets' credential-free configuration copies) are
//! bound back, read-only, and the variables that name them work. As root
//! and as an ordinary user.

use std::process::Command;

use airlock_tests::who::Who;
use airlock_tests::*;

#[test]
fn airlocks_own_files_under_a_home_in_tmp_are_there_and_read_only() {
    for who in Who::all() {
        // Under the host's /tmp, as in many CI images.
        let f = Fixture::new_in(std::path::Path::new("/tmp/airlock-home-in-tmp"));
        f.write(
            "~/.npmrc",
            "registry=https://registry.test/\n//registry.test/:_authToken=sekrit\n",
        );
        who.prepare(&f);
        let _ = Command::new("chmod")
            .args(["o+rx", "/tmp/airlock-home-in-tmp"])
            .status();
        let script = "head -1 \"$SSL_CERT_FILE\"; grep -c ^registry=https://registry.test/ \"$NPM_CONFIG_USERCONFIG\"; \
                      grep -c sekrit \"$NPM_CONFIG_USERCONFIG\"; \
                      (echo x > \"$SSL_CERT_FILE\") 2>/dev/null || echo read-only";
        let cmd = f.command(&["--inspect", "registry.test", "--preset", "npm"], script);
        let out = run(&mut who.wrap(cmd));
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(
            lines,
            ["-----BEGIN CERTIFICATE-----", "1", "0", "read-only"],
            "{who:?}: {}",
            out.stderr
        );
    }
}
