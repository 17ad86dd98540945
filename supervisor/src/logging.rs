//! airlock's own log (`-v`, `AIRLOCK_LOG`) through `tracing`: set up by
//! `main`, and by the sandbox helper from its plan when it was forked
//! before the supervisor's was set.

/// The log filter: `AIRLOCK_LOG` when it is set and valid, else the level
/// `-v` asks for.
pub fn log_filter(verbose: u8) -> String {
    if let Ok(env) = std::env::var("AIRLOCK_LOG") {
        if tracing_subscriber::EnvFilter::try_new(&env).is_ok() {
            return env;
        }
    }
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    // hickory-server logs every DNS query at info: ours are in the audit
    // log already.
    format!("{level},hickory_server=warn")
}

pub fn init_tracing(verbose: u8) {
    init_tracing_with(&log_filter(verbose));
}

/// Also the helper's, from its plan, when it was forked before ours was set.
pub fn init_tracing_with(filter: &str) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // `level,target=level` lists, ours and most of AIRLOCK_LOG's, parse
    // without EnvFilter's regular expressions, which every `run` compiled
    // twice (supervisor and helper); span and field filters still work.
    let fmt = match filter.parse::<tracing_subscriber::filter::Targets>() {
        Ok(targets) => fmt.with_filter(targets).boxed(),
        Err(_) => fmt
            .with_filter(
                tracing_subscriber::EnvFilter::try_new(filter)
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .boxed(),
    };
    tracing_subscriber::registry().with(fmt).init();
}
