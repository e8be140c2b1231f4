//! `agent`: setup commands (keygen, attest, register) and the service (run).
//! Keys are read from files or the environment, never from arguments.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use futures_util::{SinkExt, StreamExt};
use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind, PublicKey, Tag};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

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
    /// Run the agent service.
    Run {
        /// TOML configuration (see docs/agent.md); AGENT_* variables override it.
        #[arg(long, env = "AGENT_CONFIG")]
        config: Option<PathBuf>,
    },
}

fn read_key(file: Option<&PathBuf>, env: &str) -> anyhow::Result<Keys> {
    let text = match std::env::var(env) {
        Ok(k) if !k.trim().is_empty() => k,
        _ => {
            let path = file.with_context(|| format!("give a key file or set {env}"))?;
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
        }
    };
    Ok(Keys::parse(text.trim())?)
}

/// Publishes one event and returns the relay's OK.
async fn publish(url: &str, event: &nostr::prelude::Event) -> anyhow::Result<(bool, String)> {
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .context("connecting to the relay")?;
    ws.send(Message::Text(json!(["EVENT", event]).to_string().into()))
        .await?;
    let id = event.id.to_hex();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .context("no answer from the relay")?;
        let Some(Ok(Message::Text(t))) = msg else {
            bail!("connection closed before the answer")
        };
        let v: Value = serde_json::from_str(t.as_str())?;
        if v[0] == "OK" && v[1] == id.as_str() {
            let _ = ws.close(None).await;
            return Ok((v[2] == true, v[3].as_str().unwrap_or_default().to_string()));
        }
    }
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
                let keys = Keys::generate();
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode_0600()
                    .open(&out)
                    .with_context(|| format!("creating {} (it must not exist)", out.display()))?;
                writeln!(f, "{}", keys.secret_key().to_secret_hex())?;
                println!("{}", keys.public_key().to_hex());
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

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}
