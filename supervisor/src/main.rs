//! airlock: the supervisor binary.

/// Print a line to stdout; a closed pipe (`airlock ... | head`) is not an
/// error worth a panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod cli;
mod policy_cmd;
mod probe;
mod proxy_cmd;
mod sources;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command, PolicyCommand};

/// airlock's own failure before the command started (SPEC §2).
const EXIT_AIRLOCK: u8 = 125;

fn init_tracing(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn not_yet(what: &str) -> ExitCode {
    eprintln!("airlock: `{what}` is not implemented yet in this build; nothing was run.");
    ExitCode::from(EXIT_AIRLOCK)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let result = match &cli.command {
        Command::Policy(PolicyCommand::Check { files }) => policy_cmd::check(files),
        Command::Policy(PolicyCommand::Explain { policy, target }) => {
            policy_cmd::explain(policy, target)
        }
        Command::Policy(PolicyCommand::Presets) => policy_cmd::presets(),
        Command::Policy(PolicyCommand::Profile { .. }) => return not_yet("airlock policy profile"),
        Command::Run(_) => return not_yet("airlock run"),
        Command::Proxy(args) => proxy_cmd::run(args),
        Command::Approve { .. } => return not_yet("airlock approve"),
        Command::Ca { .. } => return not_yet("airlock ca"),
        Command::Doctor { .. } => return not_yet("airlock doctor"),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("airlock: {e:#}");
            ExitCode::from(EXIT_AIRLOCK)
        }
    }
}
