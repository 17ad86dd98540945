//! The command line of SPEC §2.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "airlock",
    version,
    about = "Run commands in an OS sandbox whose only way out is a policy-enforcing proxy",
    after_help = "Policy files, lowest precedence first: built-in defaults; the user's \
$XDG_CONFIG_HOME/airlock/policy.toml (~/.config/airlock/policy.toml); the project's \
airlock.toml at the workspace root; --policy files; command-line flags; the managed \
/etc/airlock/managed.toml, which nothing below can loosen ($AIRLOCK_MANAGED_POLICY may name \
a managed file only where /etc/airlock/managed.toml is absent)."
)]
pub struct Cli {
    /// More logging (-v shows every decision, -vv the details).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a command inside the sandbox.
    Run(RunArgs),
    /// Run the proxy alone, for other sandboxes, containers and CI runners.
    Proxy(ProxyArgs),
    /// Answer approval requests from another terminal.
    Approve {
        #[arg(long)]
        socket: PathBuf,
        /// How long to wait for the socket to appear (e.g. 30s; "0" fails at
        /// once). Default: wait until it does. The approver serves until the
        /// socket's run or session ends, every command of a session included.
        #[arg(long, value_name = "DURATION")]
        wait: Option<String>,
    },
    /// Validate, explain and inspect policy.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Manage the local CA used for TLS inspection.
    Ca {
        #[arg(value_enum)]
        action: CaAction,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// What this machine supports and which sandbox tier `run` will use.
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Summarise audit logs: per run, per command, per host.
    Audit {
        /// Audit logs (rotated or concatenated; read in the order given).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
        /// List each run's inspected requests per URL (method, count,
        /// statuses, bytes); the JSON always holds them.
        #[arg(long)]
        urls: bool,
    },
    /// One sandbox for an agent's whole task: many commands, one approval.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Changesets held for review (`run --review`): list, diff, apply, discard.
    Changes {
        #[command(subcommand)]
        action: Option<ChangesCommand>,
        /// Print the list as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The caches presets point tools at: one directory per project
    /// (default: list them).
    Cache {
        #[command(subcommand)]
        action: Option<CacheCommand>,
    },
    /// Print shell completions (e.g. `airlock completions bash > /etc/bash_completion.d/airlock`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page in roff (`airlock manpage > airlock.1`).
    #[command(hide = true)]
    Manpage,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum CaAction {
    Init,
    Path,
    Show,
    Export,
}

/// Options that shape the policy, shared by `run`, `proxy` and `policy explain`.
#[derive(Args, Debug, Clone, Default)]
pub struct PolicyArgs {
    /// Policy file (repeatable, later wins).
    #[arg(short = 'p', long = "policy", value_name = "FILE")]
    pub policy: Vec<PathBuf>,
    /// Add a preset (repeatable).
    #[arg(long, value_name = "NAME")]
    pub preset: Vec<String>,
    /// Allow a host pattern for this run (repeatable).
    #[arg(long, value_name = "HOST[:PORT]")]
    pub allow: Vec<String>,
    /// Deny a host pattern for this run (repeatable).
    #[arg(long, value_name = "HOST[:PORT]")]
    pub deny: Vec<String>,
    /// TLS-inspect this host pattern ("*" for all) (repeatable).
    #[arg(long, value_name = "HOST")]
    pub inspect: Vec<String>,
    /// Static DNS answer (repeatable).
    #[arg(long, value_name = "HOST=IP")]
    pub resolve: Vec<String>,
    /// Let allowed hosts resolve into this range (repeatable).
    #[arg(long = "allow-private", value_name = "CIDR")]
    pub allow_private: Vec<String>,
    /// Extra roots (PEM) trusted when verifying inspected upstreams.
    #[arg(long = "upstream-ca", value_name = "FILE")]
    pub upstream_ca: Vec<PathBuf>,
    /// How unknown hosts are escalated: tty | deny | socket:<PATH>.
    #[arg(long, value_name = "MODE")]
    pub ask: Option<String>,
    /// Append JSON Lines audit events to this file.
    #[arg(long = "audit-log", value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
    /// Export audit events as OpenTelemetry logs to this OTLP/HTTP endpoint
    /// (e.g. http://127.0.0.1:4318).
    #[arg(long, value_name = "ENDPOINT")]
    pub otlp: Option<String>,
    /// Open every upstream connection through this parent HTTP proxy
    /// (http://[user:password@]host:port), as corporate networks require.
    /// Decisions and address checks stay airlock's: the parent is asked
    /// for the checked address.
    #[arg(long = "upstream-proxy", value_name = "URL")]
    pub upstream_proxy: Option<String>,
    /// Ask this DNS server (IP:PORT) instead of the system's resolvers.
    #[arg(long = "dns-server", value_name = "IP:PORT")]
    pub dns_server: Option<std::net::SocketAddr>,
    /// The workspace root (default: the nearest ancestor holding
    /// airlock.toml or .git, else the current directory). The command
    /// still starts in the current directory.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Extra writable path (repeatable).
    #[arg(long, value_name = "PATH")]
    pub write: Vec<PathBuf>,
    /// Make a host path readable, read-only, where it is not already (the
    /// host's /tmp is private inside) (repeatable).
    #[arg(long, value_name = "PATH")]
    pub read: Vec<PathBuf>,
    /// A port a server in the sandbox listens on (127.0.0.1:PORT inside),
    /// reachable at 127.0.0.1:PORT on the host (repeatable), as Docker's -p.
    #[arg(long, value_name = "PORT")]
    pub publish: Vec<u16>,
    /// The workspace is read-only too.
    #[arg(long = "read-only")]
    pub read_only: bool,
    /// proxy (default) | none | host.
    #[arg(long, value_name = "MODE")]
    pub network: Option<String>,
    /// Write the JSON exit report here.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Kill the whole sandbox after this long (e.g. 90s, 10m).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Run with the weaker fallback when namespaces are unavailable.
    #[arg(long = "allow-degraded")]
    pub allow_degraded: bool,
    /// Allow and record unknown hosts, then write a proposed policy to FILE
    /// (SPEC §5.6). The run is open to any public host: review the file.
    #[arg(long, value_name = "FILE")]
    pub learn: Option<PathBuf>,
    /// Pass this variable (or glob, e.g. 'MY_*') into the sandbox
    /// (repeatable). Secret-looking names pass only when named exactly.
    #[arg(long = "pass-env", value_name = "NAME")]
    pub pass_env: Vec<String>,
    /// Run inside that session's sandbox (`airlock session start`); also
    /// $AIRLOCK_SESSION. Nothing is built per command.
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    /// Hold the run's file changes for review instead of writing them
    /// through (SPEC §4.8): see `airlock changes`.
    #[arg(long)]
    pub review: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub enum ChangesCommand {
    /// The changesets held for review.
    List {
        #[arg(long)]
        json: bool,
    },
    /// What the changeset would do to the host.
    Diff {
        #[arg(value_name = "ID")]
        id: String,
        /// One line per path, no content.
        #[arg(long)]
        stat: bool,
        #[arg(long)]
        json: bool,
    },
    /// Write the changeset through (only PATHs, when given). Protected
    /// paths are applied only when named.
    Apply {
        #[arg(value_name = "ID")]
        id: String,
        #[arg(value_name = "PATH")]
        paths: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Drop the changeset; the host tree was never touched.
    Discard {
        #[arg(value_name = "ID")]
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum CacheCommand {
    /// Each project's caches, their size and the project they belong to.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove the caches of the current directory's project (or of
    /// --project DIR's); a run using them at the time loses them too.
    Clear {
        /// The project whose caches to remove (a directory in it).
        #[arg(long, value_name = "DIR", conflicts_with_all = ["all", "legacy"])]
        project: Option<PathBuf>,
        /// Every project's caches, and the shared ones of older versions.
        #[arg(long)]
        all: bool,
        /// Only the caches older versions shared between all projects.
        #[arg(long, conflicts_with = "all")]
        legacy: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum SessionCommand {
    /// Build one sandbox for a whole task and serve it until `session end`;
    /// prints {"name","socket","pid"} as JSON once it serves.
    Start(Box<SessionStartArgs>),
    /// End a session: every process stopped, the whole post-run check, the report.
    End {
        #[arg(value_name = "NAME")]
        name: String,
        /// Write the session's JSON report here.
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
    },
    /// The running sessions of this user.
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
pub struct SessionStartArgs {
    /// The session's name (default: one is made up and printed).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Extra writable path (repeatable).
    #[arg(long, value_name = "PATH")]
    pub write: Vec<PathBuf>,
    /// Make a host path readable, read-only, where it is not already
    /// (repeatable).
    #[arg(long, value_name = "PATH")]
    pub read: Vec<PathBuf>,
    /// The workspace is read-only too.
    #[arg(long = "read-only")]
    pub read_only: bool,
    /// proxy (default) | none.
    #[arg(long, value_name = "MODE")]
    pub network: Option<String>,
    /// Pass this variable (or glob) into the sandbox's commands (repeatable).
    #[arg(long = "pass-env", value_name = "NAME")]
    pub pass_env: Vec<String>,
    /// Hold every command's file changes in one changeset for review,
    /// released by `airlock changes apply` once the session has ended
    /// (SPEC §4.8).
    #[arg(long)]
    pub review: bool,
}

impl SessionStartArgs {
    /// The one-shot run's arguments, with no command: a session is built
    /// by the same pipeline.
    pub fn as_run(&self) -> RunArgs {
        RunArgs {
            policy: self.policy.clone(),
            write: self.write.clone(),
            read: self.read.clone(),
            publish: vec![],
            read_only: self.read_only,
            network: self.network.clone(),
            report: None,
            timeout: None,
            allow_degraded: false,
            learn: None,
            pass_env: self.pass_env.clone(),
            session: None,
            review: self.review,
            command: vec![],
        }
    }
}

#[derive(Args, Debug)]
pub struct ProxyArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3128")]
    pub listen: String,
    /// Serve Prometheus metrics on this address (GET /metrics).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Allow listening on a non-loopback address (clients are then anyone
    /// who can reach it; the policy still applies to every connection).
    #[arg(long = "allow-remote-clients")]
    pub allow_remote_clients: bool,
}

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Validate policy files; exit 1 with file:line:column errors.
    Check {
        /// Check the files as managed policies (the administrator's layer,
        /// which may set what other layers cannot, like network.user_allow).
        #[arg(long)]
        managed: bool,
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// Print one JSON document: ok, files, errors, warnings.
        #[arg(long)]
        json: bool,
    },
    /// Print the decision for a target, the rule and the file that decided it;
    /// with --path, whether the sandbox may read or write a path and why.
    Explain {
        #[command(flatten)]
        policy: PolicyArgs,
        /// A host with no port is explained for ports 443 and 80.
        #[arg(value_name = "HOST[:PORT]", required_unless_present = "path")]
        target: Option<String>,
        /// Explain a path instead: readable, writable, and the rule that decides.
        #[arg(long, value_name = "PATH", conflicts_with = "target")]
        path: Option<PathBuf>,
        /// Print JSON (for a host: an array, one object per port explained).
        #[arg(long)]
        json: bool,
    },
    /// List the presets and what each resolves to on this machine.
    Presets {
        /// Print a JSON array, one object per preset.
        #[arg(long)]
        json: bool,
    },
    /// Trust the project policy and project tool configuration as they are
    /// now (SPEC §3.5); with FILE, that file only.
    Trust {
        #[command(flatten)]
        policy: PolicyArgs,
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
    },
    /// Print the concrete boundary the policy compiles to.
    Profile {
        #[command(flatten)]
        policy: PolicyArgs,
        #[arg(long, value_name = "linux|macos")]
        target: String,
    },
}

/// A hint for the mistakes new users make with the command line: `airlock
/// run cmd` without `--` (the command must follow it, so its own flags are
/// never taken for airlock's).
pub fn hint_for(e: &clap::Error, args: &[String]) -> Option<String> {
    use clap::error::ErrorKind;
    let run = args.get(1).is_some_and(|a| a == "run");
    let dashes = args.iter().any(|a| a == "--");
    if run
        && !dashes
        && matches!(
            e.kind(),
            ErrorKind::UnknownArgument | ErrorKind::MissingRequiredArgument
        )
    {
        return Some(
            "hint: the command goes after `--`, so that its own flags are never taken for airlock's:\n  airlock run [OPTIONS] -- <command> [args...]"
                .into(),
        );
    }
    None
}
