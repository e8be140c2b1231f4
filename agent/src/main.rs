//! `agent`: setup commands (keygen, attest, register) and the service (run).
//! Keys are read from files or the environment, never from arguments.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use client::ws;
use nostr::prelude::{Event, EventBuilder, FinalizeEvent, Keys, Kind, PublicKey, Tag};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    name = "agent",
    version,
    about = "Managed-agent runtime for the relay's workflow deliveries"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a new secret key file (mode 0600) and print the public key.
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
    /// As the owner, sign the NIP-OA attestation for an agent; prints the tag as JSON.
    Attest {
        /// The owner's secret key file (or OWNER_SECRET_KEY).
        #[arg(long)]
        owner_key_file: Option<PathBuf>,
        /// The agent's public key (hex).
        #[arg(long)]
        agent: String,
        /// Conditions (`kind=N`, `created_at<T`, `created_at>T`, joined by `&`).
        #[arg(long, default_value = "")]
        conditions: String,
    },
    /// Publish the agent's kind 0 carrying the owner's attestation.
    Register {
        /// The agent's secret key file (or AGENT_SECRET_KEY).
        #[arg(long)]
        key_file: Option<PathBuf>,
        /// The attestation tag as printed by `agent attest`.
        #[arg(long)]
        attestation: String,
        /// Display name.
        #[arg(long, default_value = "agent")]
        name: String,
        /// The relay's WebSocket URL.
        #[arg(long)]
        relay: String,
    },
    /// Sign and publish one event (authenticating with NIP-42 first): a small
    /// client for setting things up (channels, members, workflows, messages).
    Event {
        /// Secret key file of the author (or NOSTR_SECRET_KEY).
        #[arg(long)]
        key_file: Option<PathBuf>,
        #[arg(long)]
        relay: String,
        #[arg(long)]
        kind: u16,
        /// A tag as comma-separated values, e.g. `h,ops` or `p,<hex>` (repeatable).
        #[arg(long = "tag")]
        tags: Vec<String>,
        #[arg(long, default_value = "")]
        content: String,
        /// Read the content from a file instead (e.g. a workflow definition).
        #[arg(long)]
        content_file: Option<PathBuf>,
    },
    /// Print stored events matching a filter (JSON lines), authenticated as the key's owner.
    Req {
        #[arg(long)]
        key_file: Option<PathBuf>,
        #[arg(long)]
        relay: String,
        /// A NIP-01 filter as JSON.
        #[arg(long)]
        filter: String,
    },
    /// Run the agent service.
    Run {
        /// TOML configuration (see docs/agent.md); AGENT_* variables override it.
        #[arg(long, env = "AGENT_CONFIG")]
        config: Option<PathBuf>,
    },
}

fn read_key(file: Option<&PathBuf>, env: &str) -> anyhow::Result<Keys> {
    Ok(client::keyfile::load(env, file.map(PathBuf::as_path))?)
}

/// How long one exchange with the relay may take (connect, authenticate,
/// and the answer awaited).
const EXCHANGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Authenticates (NIP-42), publishes `event` and returns the relay's `OK`.
async fn publish_authed(url: &str, keys: &Keys, event: &Event) -> anyhow::Result<(bool, String)> {
    let ws = ws::connect_authed(url, keys, EXCHANGE_TIMEOUT).await?;
    send_event(ws, event).await
}

/// Sends `event`, waits for its `OK`, and closes.
async fn send_event(mut ws: ws::Socket, event: &Event) -> anyhow::Result<(bool, String)> {
    let id = event.id.to_hex();
    let ok = ws::send_and_wait_ok(&mut ws, json!(["EVENT", event]), &id, EXCHANGE_TIMEOUT).await?;
    let _ = ws.close(None).await;
    Ok(ok)
}

/// Most events `agent req` prints.
const MAX_REQ_EVENTS: usize = 10_000;

/// Authenticates and collects stored events for one filter.
async fn query(url: &str, keys: &Keys, filter: Value) -> anyhow::Result<Vec<Value>> {
    let mut ws = ws::connect_authed(url, keys, EXCHANGE_TIMEOUT).await?;
    let events = ws::query(&mut ws, &filter, MAX_REQ_EVENTS, EXCHANGE_TIMEOUT).await?;
    let _ = ws.close(None).await;
    Ok(events)
}

/// Publishes one event without authenticating and returns the relay's OK.
async fn publish(url: &str, event: &Event) -> anyhow::Result<(bool, String)> {
    let (ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true)
        .await
        .context("connecting to the relay")?;
    send_event(ws, event).await
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(
                std::env::var("AGENT_LOG").unwrap_or_else(|_| "info".into()),
            )
            .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        match cli.command {
            Command::Keygen { out } => {
                let keys = client::keyfile::create(&out)?;
                println!("{}", keys.public_key().to_hex());
                println!("{}", nostr::prelude::ToBech32::to_bech32(&keys.public_key())?);
                Ok(())
            }
            Command::Event {
                key_file,
                relay,
                kind,
                tags,
                content,
                content_file,
            } => {
                let keys = read_key(key_file.as_ref(), "NOSTR_SECRET_KEY")?;
                let content = match content_file {
                    Some(p) => {
                        std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?
                    }
                    None => content,
                };
                let tags = tags
                    .iter()
                    .map(|t| Tag::parse(t.split(',').map(str::to_string).collect::<Vec<_>>()))
                    .collect::<Result<Vec<_>, _>>()?;
                let ev = EventBuilder::new(Kind::from_u16(kind), content)
                    .tags(tags)
                    .finalize(&keys)?;
                let (ok, msg) = publish_authed(&relay, &keys, &ev).await?;
                if !ok {
                    bail!("refused: {msg}");
                }
                println!("{}", ev.id.to_hex());
                Ok(())
            }
            Command::Req {
                key_file,
                relay,
                filter,
            } => {
                let keys = read_key(key_file.as_ref(), "NOSTR_SECRET_KEY")?;
                let filter: Value = serde_json::from_str(&filter).context("filter must be JSON")?;
                for ev in query(&relay, &keys, filter).await? {
                    println!("{ev}");
                }
                Ok(())
            }

            Command::Attest {
                owner_key_file,
                agent,
                conditions,
            } => {
                let owner = read_key(owner_key_file.as_ref(), "OWNER_SECRET_KEY")?;
                let agent = PublicKey::from_hex(&agent).context("agent must be a hex public key")?;
                let tag = protocol::nip_oa::sign(&owner, &agent, &conditions)?;
                println!("{}", serde_json::to_string(tag.as_slice())?);
                Ok(())
            }
            Command::Register {
                key_file,
                attestation,
                name,
                relay,
            } => {
                let keys = read_key(key_file.as_ref(), "AGENT_SECRET_KEY")?;
                let parts: Vec<String> =
                    serde_json::from_str(&attestation).context("attestation must be the JSON tag")?;
                let tag = Tag::parse(parts)?;
                let ev = EventBuilder::new(Kind::Metadata, json!({"name": name}).to_string())
                    .tags([tag])
                    .finalize(&keys)?;
                let (ok, msg) = publish(&relay, &ev).await?;
                if !ok {
                    bail!("the relay refused the registration: {msg}");
                }
                println!("registered {} ({})", keys.public_key().to_hex(), ev.id.to_hex());
                Ok(())
            }
            Command::Run { config } => {
                let cfg = agent::config::AgentConfig::load(config.as_deref())
                    .map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
                let keys = agent::config::load_keys(cfg.key_file.as_deref())?;
                let shutdown = tokio_util::sync::CancellationToken::new();
                let s = shutdown.clone();
                tokio::spawn(async move {
                    use tokio::signal::unix::{signal, SignalKind};
                    if let (Ok(mut term), Ok(mut int)) =
                        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
                    {
                        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
                    }
                    s.cancel();
                });
                agent::runtime::run(cfg, keys, shutdown).await
            }
        }
    })
}
