//! airlock: the supervisor binary.

/// Print a line to stdout; a closed pipe (`airlock ... | head`) is not an
/// error worth a panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod approve;
mod audit_cmd;
mod ca_cmd;
mod cache_cmd;
mod child;
mod cli;
mod clock;
mod doctor;
mod dotenv;
mod dotenv_git;
mod env;
mod explain_cmd;
mod explain_path;
mod hints;
mod inspect_setup;
mod integrity;
mod learn;
#[cfg(target_os = "linux")]
mod linux;
mod logging;
#[cfg(target_os = "macos")]
mod macos;
mod paths;
mod places;
mod plan;
mod policy;
mod policy_cmd;
mod prepare;
mod probe;
mod procfs;
mod project_secrets;
mod proxy_cmd;
mod refusal;
mod report;
mod resolve;
mod review;
mod run_audit;
mod run_cmd;
mod seatbelt;
mod seqpacket;
mod session;
mod text;

use std::process::ExitCode;

use clap::Parser;

use logging::{init_tracing, log_filter};

use cli::{Cli, Command, PolicyCommand, SessionCommand};

/// airlock's own failure before the command started (SPEC §2).
const EXIT_AIRLOCK: u8 = 125;

/// The static build (scripts/build-release.sh) looks users and hosts up only
/// with what libc has built in: /etc/passwd, /etc/group, /etc/hosts and DNS.
/// Another NSS module (systemd, sss, ldap, mdns, db) would be loaded with
/// dlopen, which brings a second libc into a static process: it crashes
/// (`getpwuid` of a uid only systemd knows, for the audit log's user). The
/// dynamically linked build keeps the system's nsswitch.conf.
#[cfg(all(target_os = "linux", target_env = "gnu", target_feature = "crt-static"))]
fn builtin_nss_only() {
    extern "C" {
        // <nss.h>: overrides nsswitch.conf for one database.
        fn __nss_configure_lookup(
            db: *const std::ffi::c_char,
            services: *const std::ffi::c_char,
        ) -> std::ffi::c_int;
    }
    for (db, services) in [
        (c"passwd", c"files"),
        (c"group", c"files"),
        (c"shadow", c"files"),
        (c"gshadow", c"files"),
        (c"initgroups", c"files"),
        (c"hosts", c"files dns"),
        (c"networks", c"files dns"),
        (c"services", c"files"),
        (c"protocols", c"files"),
        (c"rpc", c"files"),
        (c"ethers", c"files"),
        (c"aliases", c"files"),
        (c"netgroup", c"files"),
        (c"publickey", c"files"),
    ] {
        // SAFETY: two NUL-terminated constants; called before any thread
        // or lookup exists.
        unsafe { __nss_configure_lookup(db.as_ptr(), services.as_ptr()) };
    }
}

/// The terminal cannot stop airlock. The kernel stops a whole process
/// group with SIGTTIN or SIGTTOU when a member reads the terminal (or
/// writes it, with `tostop`) from the background, and those signals pass
/// every sandbox (they are the kernel's, not a process's): a command that
/// shares airlock's group, or joins it, could otherwise freeze the
/// supervisor, the helper and init, and with them `--timeout` and the
/// post-run check (red team round 19). Ignored, they leave a background
/// read to fail with EIO instead; the command gets them back (init.rs).
#[cfg(unix)]
fn ignore_terminal_stops() {
    for sig in [libc::SIGTTIN, libc::SIGTTOU] {
        // SAFETY: setting a disposition, before any thread exists.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

fn main() -> ExitCode {
    #[cfg(all(target_os = "linux", target_env = "gnu", target_feature = "crt-static"))]
    builtin_nss_only();
    #[cfg(unix)]
    ignore_terminal_stops();
    // The sandbox helper is this binary re-executed: it must stay
    // single-threaded, so it branches off before anything else starts.
    #[cfg(target_os = "linux")]
    {
        // Lossy: an argument that is not UTF-8 is the command's, never
        // the helper's (clap reports it where it is airlock's).
        let args: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        if args.get(1).map(String::as_str) == Some(linux::HELPER_ARG) {
            let fd = args.get(2).and_then(|a| a.parse().ok());
            let parent = args.get(3).and_then(|a| a.parse().ok());
            match (fd, parent) {
                (Some(fd), Some(parent)) => linux::helper::main(
                    fd,
                    parent,
                    linux::Ahead::from_arg(args.get(4).map(String::as_str)),
                ),
                _ => {
                    eprintln!("airlock: {} is internal", linux::HELPER_ARG);
                    return ExitCode::from(EXIT_AIRLOCK);
                }
            }
        }
    }
    // A command for a running session: nothing to build, nothing to parse
    // beyond its few options.
    if let Some((result, report_file)) =
        session::client::quick(&std::env::args_os().collect::<Vec<_>>())
    {
        return match result {
            Ok(code) => code,
            Err(e) => {
                eprintln!("airlock: {e:#}");
                report::refused(report_file.as_deref(), &format!("{e:#}"));
                ExitCode::from(EXIT_AIRLOCK)
            }
        };
    }
    // `run`'s sandbox helper starts first, its namespaces overlapping the
    // parsing of the arguments and everything after.
    #[cfg(target_os = "linux")]
    let early = linux::Spawned::before_parsing();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            if let Some(hint) = cli::hint_for(
                &e,
                &std::env::args_os()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect::<Vec<_>>(),
            ) {
                eprintln!("\n{hint}");
            }
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    init_tracing(cli.verbose);
    let result = match &cli.command {
        Command::Policy(PolicyCommand::Check {
            files,
            managed,
            json,
        }) => policy_cmd::check(files, *managed, *json),
        Command::Policy(PolicyCommand::Explain {
            policy,
            target,
            path,
            json,
        }) => match (path, target) {
            (Some(path), _) => explain_path::explain_path(policy, path, *json),
            (None, Some(target)) => explain_cmd::explain(policy, target, *json),
            (None, None) => Err(anyhow::anyhow!("name a HOST[:PORT] or --path PATH")),
        },
        Command::Policy(PolicyCommand::Presets { json }) => explain_cmd::presets(*json),
        Command::Policy(PolicyCommand::Trust { policy, file }) => {
            policy_cmd::trust(policy, file.as_deref())
        }
        Command::Policy(PolicyCommand::Profile { policy, target }) => {
            policy_cmd::profile(policy, target)
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            // Into memory first: the generator panics on a write error
            // (a closed pipe), a buffer has none.
            let mut buf = Vec::new();
            clap_complete::generate(*shell, &mut cmd, "airlock", &mut buf);
            use std::io::Write as _;
            let _ = std::io::stdout().lock().write_all(&buf);
            Ok(ExitCode::SUCCESS)
        }
        Command::Manpage => {
            use clap::CommandFactory;
            let mut buf = Vec::new();
            clap_mangen::Man::new(Cli::command())
                .render(&mut buf)
                .map_err(anyhow::Error::from)
                .map(|()| {
                    use std::io::Write as _;
                    let _ = std::io::stdout().lock().write_all(&buf);
                    ExitCode::SUCCESS
                })
        }
        Command::Run(args) => match args.session.clone().or_else(|| {
            std::env::var("AIRLOCK_SESSION")
                .ok()
                .filter(|s| !s.is_empty())
        }) {
            // Review is the session's, set when it started: a command that
            // asks for it runs only in a session that holds one, never
            // writing through (SPEC §4.8).
            Some(name) if args.review => match session::review_of(&name) {
                Ok(Some(_)) => session::client::run(args, &name),
                Ok(None) => Err(anyhow::anyhow!(
                    "--review: the session {name:?} writes through (it was started without --review); start one with `airlock session start --review`, or run the command with `airlock run --review` outside the session{}",
                    if args.session.is_none() { " (unset AIRLOCK_SESSION, which names it)" } else { "" }
                )),
                Err(e) => Err(e),
            },
            Some(name) => session::client::run(args, &name),
            None => {
                #[cfg(target_os = "linux")]
                let run = run_cmd::run(args, early, log_filter(cli.verbose), None);
                #[cfg(not(target_os = "linux"))]
                let run = run_cmd::run(args, (), log_filter(cli.verbose), None);
                run
            }
        },
        Command::Session(SessionCommand::Start(a)) => {
            if std::env::var_os(session::server::SERVE_ENV).is_some() {
                let name = a.name.clone().unwrap_or_default();
                #[cfg(target_os = "linux")]
                let run = run_cmd::run(&a.as_run(), None, log_filter(cli.verbose), Some(&name));
                #[cfg(not(target_os = "linux"))]
                let run = run_cmd::run(&a.as_run(), (), log_filter(cli.verbose), Some(&name));
                run
            } else {
                session::start(a.name.as_deref())
            }
        }
        Command::Session(SessionCommand::End { name, report }) => {
            session::end(name, report.as_deref())
        }
        Command::Session(SessionCommand::List { json }) => session::list(*json),
        Command::Changes { action, json } => review::cmd::run(action.as_ref(), *json),
        Command::Proxy(args) => proxy_cmd::run(args),
        Command::Approve { socket, wait } => match wait
            .as_deref()
            .map(|w| match w {
                "0" => Ok(std::time::Duration::ZERO),
                w => airlock_policy::units::parse_duration(w),
            })
            .transpose()
        {
            Ok(wait) => approve::client::run(socket, wait),
            Err(e) => Err(anyhow::anyhow!("--wait: {e}")),
        },
        Command::Ca { action, out } => ca_cmd::run(*action, out.as_deref()),
        Command::Doctor { json } => doctor::run(*json),
        Command::Cache { action } => cache_cmd::run(action.as_ref()),
        Command::Audit { files, json, urls } => audit_cmd::run(files, *json, *urls),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("airlock: {e:#}");
            if let Command::Run(args) = &cli.command {
                report::refused(args.report.as_deref(), &format!("{e:#}"));
            }
            ExitCode::from(EXIT_AIRLOCK)
        }
    }
}
