//! `relayctl`: the owner's and operator's command line for a running
//! relay. It signs every call itself (NIP-98 over HTTP, NIP-42 over
//! WebSocket) with a key read from a file or the environment, never from
//! an argument that `ps` would show.

mod bulk;
mod client;
mod mentions;
mod show;

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use clap::{Parser, Subcommand};
use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind, Tag, ToBech32};
use serde_json::{json, Value};

use client::Relay;
use protocol::api::{
    DeliveryDetail, DeliveryView, Me, RunStarted, RunView, RunsPage, SecretStored, WebhookSecret,
};
use protocol::dashboard::{WorkflowDetail, WorkflowSummary};
use protocol::nip86::{EventEntry, PubkeyEntry, RunChanged, WorkflowChanged};
use serde::de::IgnoredAny;
use serde::Serialize;
use show::{fields, or_dash, table, when};

#[derive(Parser)]
#[command(
    name = "relayctl",
    version,
    about = "Manage workflows, runs, deliveries and bans of a running relay"
)]
struct Cli {
    /// The relay (one community's host): `http(s)://host:port` or `ws(s)://host:port`.
    #[arg(
        long,
        env = "RELAYCTL_URL",
        global = true,
        default_value = "http://127.0.0.1:7777"
    )]
    relay: String,
    /// File holding the signing key (hex or nsec). The environment
    /// variable RELAYCTL_KEY, when set, holds the key itself instead.
    #[arg(long, env = "RELAYCTL_KEY_FILE", global = true)]
    key_file: Option<PathBuf>,
    /// Print the relay's JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a new secret key to a file (mode 0600) and print its public key.
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
    /// Who the relay sees: the key's pubkey, its channels, its owner if an agent.
    Whoami,
    /// Workflow definitions and their settings.
    Workflow {
        #[command(subcommand)]
        command: WorkflowCommand,
    },
    /// Workflow runs.
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// Managed-agent deliveries.
    Deliveries {
        #[command(subcommand)]
        command: DeliveriesCommand,
    },
    /// Ban a pubkey or an event (community admins).
    Ban {
        #[command(subcommand)]
        command: BanCommand,
    },
    /// Allow a pubkey (lifts its ban; community admins).
    Allow {
        pubkey: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// The community's banned pubkeys, allowed pubkeys and banned events.
    Bans,
    /// Set the community's NIP-11 name or description (community admins).
    Info {
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        description: Option<String>,
    },
    /// The management methods this key may call.
    Methods,
    /// Where managed agents take mentions (their owners and admins).
    Mentions {
        #[command(subcommand)]
        command: mentions::MentionsCommand,
    },
}

#[derive(Subcommand)]
enum WorkflowCommand {
    /// Check a definition file (JSON or YAML) with the relay's own rules.
    Check {
        file: PathBuf,
        #[arg(long, default_value = "check")]
        channel: String,
        /// Workflow id (default: the file name without its extension).
        #[arg(long)]
        id: Option<String>,
    },
    /// Check, then publish a definition (kind 30620) to a channel.
    Publish {
        file: PathBuf,
        #[arg(long)]
        channel: String,
        #[arg(long)]
        id: Option<String>,
    },
    /// Make (or rotate) the webhook secret; it is shown once.
    WebhookSecret { id: String },
    /// Set (or rotate) a named secret; the value is read from standard input.
    Secret { id: String, name: String },
    /// Start a manual run; `--input` is a JSON object.
    Run {
        id: String,
        #[arg(long, default_value = "{}")]
        input: String,
    },
    /// Pause: no new runs; open work waits.
    Pause { id: String },
    /// Resume a paused workflow.
    Resume { id: String },
    /// The workflows this key owns (every one for a community admin).
    List,
    /// One workflow: its state and its definition.
    Show { id: String },
}

#[derive(Subcommand)]
enum RunsCommand {
    /// A workflow's runs, newest first.
    List {
        workflow: String,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// One run with its steps.
    Show { id: String },
    /// Cancel runs (one or more ids) and their open deliveries.
    Cancel {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Rerun failed or cancelled runs from the step each ended at: ids, or
    /// `--workflow` with a filter (shown first; rerun with `--yes`).
    Rerun(bulk::RunSelection),
}

#[derive(Subcommand)]
enum DeliveriesCommand {
    /// Deliveries, newest first (an owner sees its own workflows').
    List {
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        workflow: Option<String>,
        /// Only those created at least this many seconds ago.
        #[arg(long)]
        older_than: Option<u64>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One delivery with its attempts.
    Show { id: String },
    /// Make failed, expired or cancelled deliveries pending again: the ids
    /// given, or those a filter selects (listed; changed with --yes).
    Retry(bulk::Selection),
    /// Cancel pending or claimed deliveries: ids, or a filter as for retry.
    Cancel(bulk::Selection),
}

#[derive(Subcommand)]
enum BanCommand {
    Pubkey {
        pubkey: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    Event {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
}

fn main() {
    // Output piped into a reader that stops early (`relayctl … | head`)
    // ends relayctl quietly, as it does any Unix tool, instead of
    // panicking on the write: the default action of SIGPIPE, which Rust's
    // runtime sets to ignore.
    #[cfg(unix)]
    // SAFETY: called first, before any thread exists; restores a default.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    if let Err(e) = runtime.block_on(run(cli)) {
        eprintln!("relayctl: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let out = Out { json: cli.json };
    match cli.command {
        Command::Keygen { out: path } => return keygen(&path),
        Command::Workflow {
            command: WorkflowCommand::Check { file, channel, id },
        } => {
            let (id, _) = checked(&Keys::generate(), &file, &channel, id.as_deref())?;
            println!("{}: workflow {id} is valid", file.display());
            return Ok(());
        }
        _ => {}
    }
    let keys = load_keys(cli.key_file.as_deref())?;
    let relay = Relay::new(&cli.relay, keys.clone())?;
    match cli.command {
        Command::Keygen { .. } => unreachable!("handled above"),
        Command::Whoami => {
            let me: Me = relay.call("GET", "/me", None).await?;
            out.fields(
                &me,
                &[
                    ("pubkey", me.pubkey.clone()),
                    ("community", me.community.clone()),
                    ("agent_owner", or_dash(me.agent_owner.as_deref())),
                    ("channels", me.channels.join(" ")),
                ],
            )
        }
        Command::Workflow { command } => workflow(&relay, &keys, out, command).await?,
        Command::Runs { command } => runs(&relay, out, command).await?,
        Command::Deliveries { command } => deliveries(&relay, out, command).await?,
        Command::Ban { command } => {
            let (method, value, reason) = match command {
                BanCommand::Pubkey { pubkey, reason } => ("banpubkey", hex_pubkey(&pubkey)?, reason),
                BanCommand::Event { id, reason } => ("banevent", id, reason),
            };
            relay.rpc::<IgnoredAny>(method, json!([value, reason])).await?;
            out.done(&format!("{method} {value}: done"));
        }
        Command::Allow { pubkey, reason } => {
            let value = hex_pubkey(&pubkey)?;
            relay
                .rpc::<IgnoredAny>("allowpubkey", json!([value, reason]))
                .await?;
            out.done(&format!("allowpubkey {value}: done"));
        }
        Command::Bans => bans(&relay, out).await?,
        Command::Info { name, description } => {
            if name.is_none() && description.is_none() {
                bail!("say --name, --description or both");
            }
            if let Some(n) = name {
                relay.rpc::<IgnoredAny>("changerelayname", json!([n])).await?;
            }
            if let Some(d) = description {
                relay
                    .rpc::<IgnoredAny>("changerelaydescription", json!([d]))
                    .await?;
            }
            out.done("changed");
        }
        Command::Methods => {
            let methods: Vec<String> = relay.rpc("supportedmethods", json!([])).await?;
            out.list(&methods, |m| println!("{m}"));
        }
        Command::Mentions { command } => mentions::run(&relay, out, command).await?,
    }
    Ok(())
}

/// How results are printed.
#[derive(Clone, Copy)]
struct Out {
    json: bool,
}

impl Out {
    /// `answer` as JSON, or its `rows` as `name  value` lines.
    fn fields(self, answer: &impl Serialize, rows: &[(&str, String)]) {
        if self.json {
            self.json(answer);
        } else {
            fields(rows);
        }
    }

    /// The answer as the relay gave it (read into its type, written back).
    fn json(self, answer: &impl Serialize) {
        match serde_json::to_string(answer) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("relayctl: writing the answer as JSON: {e}"),
        }
    }

    fn done(self, text: &str) {
        if self.json {
            println!("{}", json!({"ok": true}));
        } else {
            println!("{text}");
        }
    }

    fn list<T: Serialize>(self, items: &[T], each: impl Fn(&T)) {
        if self.json {
            self.json(&items);
        } else {
            items.iter().for_each(each);
        }
    }
}

/// The key from RELAYCTL_KEY, else from the key file.
fn load_keys(file: Option<&Path>) -> anyhow::Result<Keys> {
    ::client::keyfile::load("RELAYCTL_KEY", file).map_err(|e| match e {
        ::client::keyfile::KeyError::Missing(_) => anyhow!(
            "no key: give --key-file FILE (or RELAYCTL_KEY_FILE), or set RELAYCTL_KEY; \
             `relayctl keygen --out FILE` makes one"
        ),
        other => other.into(),
    })
}

fn keygen(path: &Path) -> anyhow::Result<()> {
    let keys = ::client::keyfile::create(path)?;
    println!("{}", keys.public_key().to_hex());
    eprintln!("npub: {}", keys.public_key().to_bech32()?);
    Ok(())
}

fn hex_pubkey(s: &str) -> anyhow::Result<String> {
    nostr::prelude::PublicKey::parse(s)
        .map(|p| p.to_hex())
        .map_err(|e| anyhow!("{s:?} is not a pubkey (hex or npub): {e}"))
}

/// Reads a definition file (JSON, or YAML by its extension or when it is
/// not JSON) as the JSON content of a definition.
fn definition_json(file: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let yaml = matches!(file.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"));
    if !yaml {
        if let Ok(v) = serde_json::from_str(&text) {
            return Ok(v);
        }
    }
    yaml_serde::from_str(&text).with_context(|| format!("{} is neither JSON nor YAML", file.display()))
}

/// The signed definition event of `file`, checked by the rules the relay
/// applies at publish; errors read as the relay's own.
fn checked(
    keys: &Keys,
    file: &Path,
    channel: &str,
    id: Option<&str>,
) -> anyhow::Result<(String, nostr::prelude::Event)> {
    let id = match id {
        Some(i) => i.to_string(),
        None => file
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| anyhow!("give --id: the file name is not a workflow id"))?
            .to_string(),
    };
    let content = definition_json(file)?;
    let event = EventBuilder::new(
        Kind::from_u16(protocol::workflow::DEFINITION_KIND),
        content.to_string(),
    )
    .tags([Tag::identifier(id.as_str()), Tag::custom("h", [channel])])
    .finalize(keys)?;
    protocol::workflow::validate(&event).map_err(|e| anyhow!("{}: invalid: {e}", file.display()))?;
    Ok((id, event))
}

async fn workflow(relay: &Relay, keys: &Keys, out: Out, command: WorkflowCommand) -> anyhow::Result<()> {
    match command {
        WorkflowCommand::Check { .. } => unreachable!("needs no relay"),
        WorkflowCommand::Publish { file, channel, id } => {
            let (id, event) = checked(keys, &file, &channel, id.as_deref())?;
            relay.publish(&event).await?;
            out.done(&format!(
                "published workflow {id} in channel {channel} (event {})",
                event.id.to_hex()
            ));
        }
        WorkflowCommand::WebhookSecret { id } => {
            let v: WebhookSecret = relay
                .call(
                    "POST",
                    &format!("/workflows/{id}/webhook-secret"),
                    Some(&json!({})),
                )
                .await?;
            if out.json {
                out.json(&v);
            } else {
                println!("{}", v.secret);
                eprintln!("shown once: callers send it as `Authorization: Bearer <secret>` to /hooks/{id}");
            }
        }
        WorkflowCommand::Secret { id, name } => {
            let mut value = String::new();
            std::io::stdin()
                .read_to_string(&mut value)
                .context("reading the secret from standard input")?;
            let value = value.strip_suffix('\n').unwrap_or(&value);
            if value.is_empty() {
                bail!("standard input was empty: pipe the secret's value in");
            }
            let path = format!("/workflows/{id}/secrets/{name}");
            relay
                .call::<SecretStored>("PUT", &path, Some(&json!({"value": value})))
                .await?;
            out.done(&format!("secret {name} of workflow {id} set"));
        }
        WorkflowCommand::Run { id, input } => {
            let input: Value = serde_json::from_str(&input).context("--input must be a JSON object")?;
            let v: RunStarted = relay
                .call("POST", &format!("/workflows/{id}/runs"), Some(&input))
                .await?;
            out.fields(&v, &[("run_id", v.run_id.clone())]);
        }
        WorkflowCommand::Pause { id } => {
            relay.rpc::<WorkflowChanged>("pauseworkflow", json!([id])).await?;
            out.done(&format!("workflow {id} paused"));
        }
        WorkflowCommand::Resume { id } => {
            relay
                .rpc::<WorkflowChanged>("resumeworkflow", json!([id]))
                .await?;
            out.done(&format!("workflow {id} resumed"));
        }
        WorkflowCommand::List => {
            let list: Vec<WorkflowSummary> = relay.call("GET", "/workflows", None).await?;
            if out.json {
                out.json(&json!({ "workflows": list }));
                return Ok(());
            }
            let now = show::now();
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|w| {
                    vec![
                        w.id.clone(),
                        w.name.clone(),
                        w.channel.clone(),
                        w.trigger.clone(),
                        workflow_state(w).to_string(),
                        w.runs.to_string(),
                        match &w.last_run_status {
                            Some(status) => format!("{status} {}", when(w.last_run_at, now)),
                            None => "-".to_string(),
                        },
                    ]
                })
                .collect();
            table(
                &[
                    "WORKFLOW", "NAME", "CHANNEL", "TRIGGER", "STATE", "RUNS", "LAST RUN",
                ],
                &rows,
            );
        }
        WorkflowCommand::Show { id } => {
            let path = format!("/workflows/{}", url_segment(&id));
            let w: WorkflowDetail = relay.call("GET", &path, None).await?;
            if out.json {
                out.json(&w);
                return Ok(());
            }
            let s = &w.summary;
            fields(&[
                ("id", s.id.clone()),
                ("name", s.name.clone()),
                ("channel", s.channel.clone()),
                ("owner", s.owner.clone()),
                ("trigger", s.trigger.clone()),
                ("state", workflow_state(s).to_string()),
                ("runs", s.runs.to_string()),
                ("last_runs", show::run_stats(&w.stats)),
                ("updated_at", when(Some(s.updated_at), show::now())),
                ("definition_event_id", w.definition_event_id.clone()),
            ]);
            println!();
            println!("{}", serde_json::to_string_pretty(&w.definition)?);
        }
    }
    Ok(())
}

/// A workflow's state in one word.
fn workflow_state(w: &WorkflowSummary) -> &'static str {
    if !w.enabled {
        "disabled"
    } else if w.paused {
        "paused"
    } else {
        "enabled"
    }
}

/// A workflow id as one URL path segment (ids are `[a-z0-9_-]`; anything
/// else is escaped so that it cannot name another path).
fn url_segment(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn runs(relay: &Relay, out: Out, command: RunsCommand) -> anyhow::Result<()> {
    let now = show::now();
    match command {
        RunsCommand::List { workflow, limit } => {
            let page: RunsPage = relay
                .call("GET", &format!("/workflows/{workflow}/runs?limit={limit}"), None)
                .await?;
            if out.json {
                out.json(&page);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = page
                .runs
                .iter()
                .map(|r| {
                    vec![
                        r.id.clone(),
                        r.status.as_str().to_string(),
                        step_column(r),
                        r.cause.kind.as_str().to_string(),
                        when(Some(r.created_at), now),
                        or_dash(r.error.as_ref().map(|e| e.code.as_str())),
                    ]
                })
                .collect();
            table(&["RUN", "STATUS", "STEP", "CAUSE", "CREATED", "ERROR"], &rows);
        }
        RunsCommand::Show { id } => {
            let run: RunView = relay.call("GET", &format!("/runs/{id}"), None).await?;
            if out.json {
                out.json(&run);
                return Ok(());
            }
            fields(&[
                ("id", run.id.clone()),
                ("workflow_id", run.workflow_id.clone()),
                ("status", run.status.as_str().to_string()),
                ("cause", format!("{} {}", run.cause.kind.as_str(), run.cause.id)),
                ("rerun_by", or_dash(run.rerun_by.as_deref())),
                ("trace_id", or_dash(run.trace_id.as_deref())),
                ("created_at", when(Some(run.created_at), now)),
                ("updated_at", when(Some(run.updated_at), now)),
                ("wake_at", when(run.wake_at, now)),
            ]);
            if let Some(e) = &run.error {
                println!("error       {}: {}", e.code, e.message);
            }
            for a in run.steps.iter().filter_map(|s| s.approval.as_ref()) {
                print_approval(a, now);
            }
            let rows: Vec<Vec<String>> = run
                .steps
                .iter()
                .map(|s| {
                    vec![
                        s.id.clone(),
                        s.action.clone(),
                        match &s.kept_from {
                            Some(run) => format!("{} (kept from {run})", s.status.as_str()),
                            None => s.status.as_str().to_string(),
                        },
                        when(s.started_at, now),
                        when(s.finished_at, now),
                        or_dash(s.error.as_ref().map(|e| e.code.as_str())),
                    ]
                })
                .collect();
            println!();
            table(
                &["STEP", "ACTION", "STATUS", "STARTED", "FINISHED", "ERROR"],
                &rows,
            );
            show::step_details(&run.steps);
        }
        RunsCommand::Cancel { ids } if ids.len() == 1 => {
            relay.rpc::<RunChanged>("cancelrun", json!([ids[0]])).await?;
            out.done(&format!("run {} cancelled", ids[0]));
        }
        RunsCommand::Cancel { ids } => bulk::runs(relay, out, ids).await?,
        RunsCommand::Rerun(sel) => bulk::reruns(relay, out, sel).await?,
    }
    Ok(())
}

async fn deliveries(relay: &Relay, out: Out, command: DeliveriesCommand) -> anyhow::Result<()> {
    let now = show::now();
    match command {
        DeliveriesCommand::List {
            status,
            workflow,
            older_than,
            limit,
        } => {
            let q = protocol::nip86::DeliveryQuery {
                status: status
                    .map(|s| {
                        protocol::api::DeliveryStatus::parse(&s).ok_or_else(|| {
                            anyhow!(
                                "--status: one of pending, claimed, delivered, failed, expired, cancelled"
                            )
                        })
                    })
                    .transpose()?,
                workflow,
                older_than_secs: older_than,
                limit: Some(limit),
                ..Default::default()
            };
            let list: Vec<DeliveryView> = relay.rpc("listdeliveries", json!([q])).await?;
            if out.json {
                out.json(&json!({ "deliveries": list }));
                return Ok(());
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|d| {
                    vec![
                        d.id.clone(),
                        d.status.as_str().to_string(),
                        format!("{}/{}", d.attempt, d.max_attempts),
                        format!("{}/{}", d.workflow_id, d.step_id),
                        d.target_pubkey.chars().take(12).collect(),
                        when(Some(d.updated_at), now),
                        or_dash(d.failure_code.as_deref()),
                    ]
                })
                .collect();
            table(
                &[
                    "DELIVERY",
                    "STATUS",
                    "ATTEMPT",
                    "WORKFLOW/STEP",
                    "AGENT",
                    "UPDATED",
                    "FAILURE",
                ],
                &rows,
            );
        }
        DeliveriesCommand::Show { id } => {
            let detail: DeliveryDetail = relay.call("GET", &format!("/deliveries/{id}"), None).await?;
            if out.json {
                out.json(&detail);
                return Ok(());
            }
            let d = &detail.delivery;
            fields(&[
                ("id", d.id.clone()),
                ("status", d.status.as_str().to_string()),
                ("workflow_id", d.workflow_id.clone()),
                ("run_id", d.run_id.clone()),
                ("step_id", d.step_id.clone()),
                ("channel", d.channel.clone()),
                ("target_pubkey", d.target_pubkey.clone()),
                ("attempt", d.attempt.to_string()),
                ("max_attempts", d.max_attempts.to_string()),
                ("failure_code", or_dash(d.failure_code.as_deref())),
                ("failure_message", or_dash(d.failure_message.as_deref())),
                ("created_at", when(Some(d.created_at), now)),
                ("updated_at", when(Some(d.updated_at), now)),
                ("expires_at", when(Some(d.expires_at), now)),
                ("message_event_id", d.message_event_id.clone()),
                ("reply_event_id", or_dash(d.reply_event_id.as_deref())),
            ]);
            if let Some(id) = &d.reply_event_id {
                match relay.event(id).await? {
                    Some(reply) => println!("reply       {}", reply.content),
                    None => println!("reply       (not readable by this key)"),
                }
            }
            let rows: Vec<Vec<String>> = detail
                .attempts
                .iter()
                .map(|a| {
                    vec![
                        a.attempt.to_string(),
                        when(Some(a.claimed_at), now),
                        when(a.finished_at, now),
                        or_dash(a.outcome.as_deref()),
                        or_dash(a.failure_code.as_deref()),
                        or_dash(a.failure_message.as_deref()),
                    ]
                })
                .collect();
            println!();
            table(
                &["ATTEMPT", "CLAIMED", "FINISHED", "OUTCOME", "CODE", "MESSAGE"],
                &rows,
            );
        }
        DeliveriesCommand::Retry(sel) => bulk::deliveries(relay, out, sel, true).await?,
        DeliveriesCommand::Cancel(sel) => bulk::deliveries(relay, out, sel, false).await?,
    }
    Ok(())
}

/// Where a run is, as the STEP column says it: the step it is at (1-based)
/// of how many, with its id; `n/n` once it completed.
fn step_column(r: &RunView) -> String {
    let total = r.steps.len();
    let at = usize::try_from(r.current_step).unwrap_or(total);
    match r.steps.get(at) {
        Some(step) => format!("{}/{total} {}", at + 1, step.id),
        None => format!("{total}/{total}"),
    }
}

/// An approval waiting for its decision: what to react to, and who may.
fn print_approval(a: &protocol::api::ApprovalView, now: i64) {
    println!(
        "approval    waits for a reaction (+ or 👍 approves, - or 👎 denies) to event {}, times out {}",
        a.request_event_id,
        when(Some(a.deadline), now)
    );
    println!("            text: {}", a.text);
    println!("            approvers: {}", a.approvers.join(", "));
}

async fn bans(relay: &Relay, out: Out) -> anyhow::Result<()> {
    let banned: Vec<PubkeyEntry> = relay.rpc("listbannedpubkeys", json!([])).await?;
    let allowed: Vec<PubkeyEntry> = relay.rpc("listallowedpubkeys", json!([])).await?;
    let events: Vec<EventEntry> = relay.rpc("listbannedevents", json!([])).await?;
    if out.json {
        out.json(&json!({"banned_pubkeys": banned, "allowed_pubkeys": allowed, "banned_events": events}));
        return Ok(());
    }
    let mut rows = Vec::new();
    for (list, entries) in [("banned", &banned), ("allowed", &allowed)] {
        for e in entries {
            rows.push(vec![list.to_string(), e.pubkey.clone(), e.reason.clone()]);
        }
    }
    for e in &events {
        rows.push(vec!["banned event".to_string(), e.id.clone(), e.reason.clone()]);
    }
    table(&["LIST", "PUBKEY OR EVENT", "REASON"], &rows);
    Ok(())
}
