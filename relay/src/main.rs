//! `relay` command line: serve (the default), and community management.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use relay::config::{Config, Overrides};

/// jemalloc for Rust's allocations and, unprefixed, for SQLite's (its
/// page cache, statement journals): glibc's malloc was 11.5 % of the
/// relay's CPU under the delivery bench and 5.8 % under ingest, jemalloc's
/// 4.7 % and 2.0 %, at the same memory per idle connection
/// (docs/performance.md, "What limits each figure now").
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "relay",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("RELAY_COMMIT"), ")"),
    about = "Nostr relay with durable agent delivery"
)]
struct Cli {
    /// TOML configuration file.
    #[arg(long, env = "RELAY_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Listen address, `host:port` (IPv6 as `[::1]:7777`); repeat it, or
    /// separate addresses with commas, for several (overrides `listen`).
    #[arg(long, global = true, value_parser = checked_listen)]
    listen: Vec<String>,
    /// Database URL, `sqlite://path` or `postgres://…` (overrides `database_url`).
    #[arg(long, global = true)]
    database_url: Option<String>,
    /// Log filter (overrides `log`).
    #[arg(long, global = true)]
    log: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve clients (the default when no command is given).
    Serve,
    /// Manage communities (tenants).
    Community {
        #[command(subcommand)]
        command: CommunityCommand,
    },
    /// Inspect managed-agent deliveries (JSON lines).
    Deliveries {
        /// Community id.
        #[arg(long, default_value = "default")]
        community: String,
        #[command(subcommand)]
        command: DeliveriesCommand,
    },
    /// Inspect workflow runs (JSON lines).
    Runs {
        /// Community id.
        #[arg(long, default_value = "default")]
        community: String,
        #[command(subcommand)]
        command: RunsCommand,
    },
}

#[derive(Subcommand)]
enum DeliveriesCommand {
    /// Deliveries, newest first.
    List {
        /// Only this status (pending, claimed, delivered, failed, expired, cancelled).
        #[arg(long, value_parser = delivery_status)]
        status: Option<protocol::api::DeliveryStatus>,
        /// Only this target (hex pubkey).
        #[arg(long)]
        target: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One delivery with its recorded operations.
    Show { id: String },
}

#[derive(Subcommand)]
enum RunsCommand {
    /// Runs, newest first.
    List {
        /// Only this workflow.
        #[arg(long)]
        workflow: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One run with its trace and trigger context.
    Show { id: String },
}

#[derive(Subcommand)]
enum CommunityCommand {
    /// Create a community with a fresh signing key.
    Add {
        /// Community id, `[a-z0-9_-]{1,64}`.
        #[arg(long)]
        id: String,
        /// Host bound to the community (repeat for several). A host without a
        /// port matches any port.
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// Public relay URL (`ws://…` or `wss://…`).
        #[arg(long)]
        url: String,
    },
    /// List communities: id, public key, relay URL, hosts, where the key
    /// is kept (`database` or `file`), tab separated.
    List,
    /// Move the signing keys kept in the database into key files under
    /// `keys_dir` (`<keys_dir>/<id>.key`, mode 0600), leaving only their
    /// public keys in the database. Safe to run again.
    KeysOut {
        /// Only this community (default: all).
        #[arg(long)]
        id: Option<String>,
    },
}

/// `--status` as the contract names it.
fn delivery_status(s: &str) -> Result<protocol::api::DeliveryStatus, String> {
    protocol::api::DeliveryStatus::parse(s).ok_or_else(|| {
        let names: Vec<&str> = protocol::api::DeliveryStatus::ALL
            .iter()
            .map(|s| s.as_str())
            .collect();
        format!("a status is one of {}", names.join(", "))
    })
}

/// `--listen` checked as it is parsed (so clap reports a bad address).
fn checked_listen(s: &str) -> Result<String, String> {
    relay::config::parse_listen_list(s).map(|_| s.to_string())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let overrides = Overrides {
        listen: {
            let all: Vec<SocketAddr> = cli
                .listen
                .iter()
                .flat_map(|l| relay::config::parse_listen_list(l).unwrap_or_default())
                .collect();
            (!all.is_empty()).then_some(relay::config::Listen(all))
        },
        database_url: cli.database_url,
        log: cli.log,
    };
    let cfg =
        Config::load(cli.config.as_deref(), &overrides).map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
    init_logs(&cfg)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        match cli.command.unwrap_or(Command::Serve) {
            Command::Serve => relay::server::serve(cfg).await,
            Command::Community { command } => community(cfg, command).await,
            Command::Deliveries { community, command } => deliveries(cfg, &community, command).await,
            Command::Runs { community, command } => runs(cfg, &community, command).await,
        }
    })
}

/// Logs to stderr with the configured filter and format. A filter that
/// does not parse is an error (it used to fall back to `info` silently).
fn init_logs(cfg: &Config) -> anyhow::Result<()> {
    let spec = cfg.log_filter();
    let filter = tracing_subscriber::EnvFilter::builder()
        .parse(&spec)
        .map_err(|e| anyhow::anyhow!("log filter {spec:?} does not parse: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cfg.log_format {
        relay::config::LogFormat::Json => builder.json().flatten_event(true).init(),
        relay::config::LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    Ok(())
}

/// Opens the store a command other than `serve` reads: it must exist (only
/// `serve` creates one), and the command says on stderr which it is.
async fn open_existing(cfg: &Config) -> anyhow::Result<std::sync::Arc<relay::store::Store>> {
    let shown = relay::persistence::hosts::redacted(&cfg.database_url);
    let store = relay::store::open(cfg, relay::store::OpenMode::Existing)
        .await
        .with_context(|| format!("opening the database {shown}"))?;
    eprintln!("relay: database {shown}");
    Ok(store)
}

async fn community(cfg: Config, command: CommunityCommand) -> anyhow::Result<()> {
    let store = open_existing(&cfg).await?;
    let result = match command {
        CommunityCommand::Add { id, hosts, url } => {
            let mut record = relay::community::new_record(&id, &url, &hosts).map_err(anyhow::Error::msg)?;
            if let Some(dir) = &cfg.keys_dir {
                relay::keys::move_out(&mut record, dir)?;
            }
            store.add_community(&record).await?;
            print_community(&record)
        }
        CommunityCommand::List => {
            for c in store.list_communities().await? {
                print_community(&c)?;
            }
            Ok(())
        }
        CommunityCommand::KeysOut { id } => keys_out(&cfg, store.as_ref(), id.as_deref()).await,
    };
    store.close().await;
    result
}

fn print_community(c: &relay::store::CommunityRecord) -> anyhow::Result<()> {
    let kept = if relay::keys::is_external(c) {
        "file"
    } else {
        "database"
    };
    println!(
        "{}\t{}\t{}\t{}\t{kept}",
        c.id,
        relay::keys::public_key_hex(c)?,
        c.relay_url,
        c.hosts.join(",")
    );
    Ok(())
}

/// `relay community keys-out`: each key to its file first (synced), then
/// the database's copy replaced by the marker; a crash in between leaves
/// the key in both places, and running it again finishes the move.
async fn keys_out(cfg: &Config, store: &relay::store::Store, only: Option<&str>) -> anyhow::Result<()> {
    let Some(dir) = &cfg.keys_dir else {
        anyhow::bail!(
            "keys_dir is not configured: set it (RELAY_KEYS_DIR or keys_dir in the config file) first"
        );
    };
    let mut found = false;
    for mut c in store.list_communities().await? {
        if only.is_some_and(|id| id != c.id) {
            continue;
        }
        found = true;
        if relay::keys::is_external(&c) {
            relay::keys::load(&c, Some(dir))?;
        } else {
            relay::keys::move_out(&mut c, dir)?;
            store.set_community_key(&c.id, &c.secret_key_hex).await?;
        }
        print_community(&c)?;
    }
    if !found {
        anyhow::bail!("no community {}", only.unwrap_or("at all"));
    }
    Ok(())
}

async fn deliveries(cfg: Config, community: &str, command: DeliveriesCommand) -> anyhow::Result<()> {
    let store = open_existing(&cfg).await?;
    let result = async {
        match command {
            DeliveriesCommand::List {
                status,
                target,
                limit,
            } => {
                let target = target
                    .map(|t| nostr::prelude::PublicKey::from_hex(&t))
                    .transpose()?;
                let filter = relay::delivery::rows::ListFilter {
                    target,
                    status,
                    ..Default::default()
                };
                for d in store.list_deliveries(community, &filter, limit).await? {
                    println!("{}", serde_json::to_string(&d.list_view())?);
                }
                Ok(())
            }
            DeliveriesCommand::Show { id } => {
                match store.show_delivery(community, &id, None).await {
                    Ok(detail) => println!("{}", serde_json::to_string(&detail)?),
                    Err(relay::refusal::CallError::Refused(_)) => {
                        anyhow::bail!("no delivery {id} in community {community}")
                    }
                    Err(relay::refusal::CallError::Store(e)) => return Err(e.into()),
                }
                Ok(())
            }
        }
    }
    .await;
    store.close().await;
    result
}

async fn runs(cfg: Config, community: &str, command: RunsCommand) -> anyhow::Result<()> {
    let store = open_existing(&cfg).await?;
    let result = async {
        match command {
            RunsCommand::List { workflow, limit } => {
                let page = store
                    .list_runs(community, workflow.as_deref(), None, None, limit)
                    .await?;
                for r in &page.runs {
                    println!("{}", serde_json::to_string(r)?);
                }
                Ok(())
            }
            RunsCommand::Show { id } => {
                let run = store
                    .show_run(community, &id, None)
                    .await
                    .map_err(|e| anyhow::anyhow!("run {id} in community {community}: {e}"))?;
                println!("{}", serde_json::to_string(&run)?);
                Ok(())
            }
        }
    }
    .await;
    store.close().await;
    result
}
