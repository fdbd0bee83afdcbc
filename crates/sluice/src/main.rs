//! The `sluice` binary. `sluice server` runs the broker: it loads the configuration
//! (defaults, then the `--config` file, then flags), sets up logging, and serves AMQP 0-9-1
//! until SIGINT or SIGTERM. `sluice perf` is the load generator (crate `sluice-perf`).
//! `sluice ctl` is the operator's command line over a node's management API ([`ctl`]).

mod ctl;

use std::future::Future;
use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use sluice_server::config::{self, Config, ConfigError};
use tokio::signal::unix::{signal, SignalKind};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Sluice: an AMQP 0-9-1 message broker that works with RabbitMQ clients.
#[derive(Debug, Parser)]
#[command(name = "sluice", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the broker.
    ///
    /// Settings come from RabbitMQ's defaults, then the `--config` file, then the flags.
    /// Logging goes to stderr at the file's `log.console.level`; RUST_LOG, when set,
    /// overrides it (e.g. RUST_LOG=sluice_server=debug).
    Server(ServerArgs),

    /// Generate load against any AMQP 0-9-1 broker, with RabbitMQ PerfTest's flags.
    ///
    /// As in PerfTest, `-h` is the broker URI; use `--help` for help.
    // Boxed: PerfArgs is several times larger than the other variants.
    Perf(Box<sluice_perf::PerfArgs>),

    /// Manage a running node through its management API, with rabbitmqctl's commands.
    ///
    /// Exit status: 0 done, 64 bad command line, 65 bad input or a missing vhost or
    /// object, 67 missing user, 69 node unreachable or health check failed, 70 refused by
    /// the node, 75 timed out, 77 credentials refused.
    Ctl(ctl::args::CtlArgs),
}

#[derive(Debug, clap::Args)]
struct ServerArgs {
    /// Address to accept AMQP connections on: IP:PORT (127.0.0.1:5672, [::1]:5672) or just
    /// PORT for all IPv4 interfaces [default: 0.0.0.0:5672]
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen)]
    listen: Option<SocketAddr>,

    /// Directory for message and definition storage [default: ./sluice-data]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,

    /// rabbitmq.conf-style file of `key = value` lines (e.g. `listeners.tcp.default = 5672`,
    /// `heartbeat = 60`); flags override its values
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// This node's name in its cluster, NAME@HOST:PORT, HOST:PORT being where the other
    /// nodes reach it; overrides `node_name`
    #[arg(long, value_name = "NAME@HOST:PORT")]
    node_name: Option<sluice_cluster::node_name::NodeName>,
}

fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    config::parse_listener(text).ok_or_else(|| {
        format!("'{text}' is not an address; expected IP:PORT (127.0.0.1:5672) or PORT")
    })
}

fn main() -> ExitCode {
    // A PerfTest command line after `sluice perf` runs as it is: its multi-letter short
    // options are rewritten, and the ones `sluice perf` has no use for are dropped with a
    // warning each.
    let mut arguments: Vec<String> = std::env::args_os()
        .map(|argument| argument.to_string_lossy().into_owned())
        .collect();
    if arguments.get(1).map(String::as_str) == Some("perf") {
        let (kept, warnings) = sluice_perf::perftest_flags::normalize(&arguments[2..]);
        for warning in warnings {
            eprintln!("sluice perf: warning: {warning}");
        }
        arguments.truncate(2);
        arguments.extend(kept);
    }
    let is_ctl = arguments.get(1).map(String::as_str) == Some("ctl");
    let cli = match Cli::try_parse_from(arguments) {
        Ok(cli) => cli,
        Err(err) => {
            // --help and --version are not failures; every other start-up error exits 1,
            // or 64 for `sluice ctl`, rabbitmqctl's status for a bad command line.
            let failed = err.use_stderr();
            let _ = err.print();
            return match (failed, is_ctl) {
                (false, _) => ExitCode::SUCCESS,
                (true, true) => ctl::error::ExitStatus::Usage.into(),
                (true, false) => ExitCode::FAILURE,
            };
        }
    };
    let result = match cli.command {
        Command::Server(args) => server(args),
        Command::Perf(args) => sluice_perf::main(*args).map_err(anyhow::Error::new),
        Command::Ctl(args) => return ctl::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // `{:#}` prints the whole cause chain on one line, e.g.
            // "error: config file ./sluice.conf: line 3: unknown key 'x'".
            eprintln!("sluice: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn server(args: ServerArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        // A read error already names the file; a parse error names only the line.
        Some(path) => Config::from_file(path).map_err(|err| match err {
            ConfigError::Read { .. } => anyhow::Error::new(err),
            _ => anyhow::Error::new(err).context(format!("config file {}", path.display())),
        })?,
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(data_dir) = args.data_dir {
        config.data_dir = data_dir;
    }
    if let Some(node_name) = args.node_name {
        config.cluster.node_name = Some(node_name);
    }

    init_logging(&config)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let shutdown = shutdown_signal().context("installing signal handlers")?;
        tracing::info!(
            listen = %config.listen,
            data_dir = %config.data_dir.display(),
            "starting sluice {}",
            env!("CARGO_PKG_VERSION")
        );
        sluice_server::run(config, shutdown).await?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// Logs human-readable lines to stderr (`log.console`, at `log.console.level`) and to a file
/// (`log.file`, at `log.file.level`). RUST_LOG, when set, replaces both levels. A file that
/// cannot be opened stops the start, naming it.
fn init_logging(config: &Config) -> anyhow::Result<()> {
    let overridden = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => {
            EnvFilter::try_new(&directives)
                .with_context(|| format!("RUST_LOG={directives} is not a valid filter"))?;
            Some(directives)
        }
        _ => None,
    };
    let filter = |level: &str| EnvFilter::new(overridden.as_deref().unwrap_or(level));
    let console = config.log_console.then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            // Colour codes only when a person is watching; not in log files or CI output.
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter(config.log_filter()))
    });
    let file = match &config.log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| {
                    format!("cannot open the log file {} (log.file)", path.display())
                })?;
            Some(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::sync::Mutex::new(file))
                    .with_ansi(false)
                    .with_filter(filter(config.log_file_filter())),
            )
        }
        None => None,
    };
    tracing_subscriber::registry()
        .with(console)
        .with(file)
        .init();
    Ok(())
}

/// Resolves on the first SIGINT or SIGTERM. The handlers are installed before this returns,
/// so a signal that arrives while the server starts is not lost.
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        let name = tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        };
        tracing::info!("received {name}, shutting down");
    })
}
