//! Crash campaign: real relay and agent processes, SIGKILLed at chosen
//! points (test-only fault hooks, armed by environment) and at random times,
//! then a checker that reads the database and the agent's side-effect log.
//!
//! cargo run -p tests --bin chaos -- --trials 1000 --backend sqlite
//! cargo run -p tests --bin chaos -- --trials 1000 --backend postgres --pg-faults
//! cargo run -p tests --bin chaos -- --trials 200 --backend postgres --pg-failover
//!
//! Prints one summary line and exits non-zero when anything was lost,
//! duplicated or stuck; when an acknowledged message cannot be read back
//! over REQ or started no run; when a delivery marked delivered has no
//! side effect; when a kill point was never reached; or when more of a
//! point's work failed visibly than `--max-failure-share` (each point's
//! failures are printed with their codes).
//!
//! `--sabotage` breaks the work on purpose, to show the checker fails the
//! campaign: `handler-fails`, `unreachable-point`, `delete-messages`,
//! `no-runs`, `forget-side-effects`.

use std::collections::HashMap;

/// Failure codes a kill makes by contract, not counted against
/// `--max-failure-share`: a webhook call cut by a kill fails its run
/// `interrupted` (it is never sent twice without `retry`), and a handler
/// stopped after recording a write fails its delivery
/// `interrupted_after_write` (a retry would write twice). On a loaded 2-core
/// machine they made 3 of 7 failures at RelayAfterWebhookSend, 7 of 12
/// units there in all.
const BY_DESIGN: [&str; 2] = ["interrupted", "interrupted_after_write"];

/// The failure codes a kill at `point` makes by contract: [`BY_DESIGN`]'s,
/// and where the holder of a recorded write is gone, the lapse of its
/// lease (`lease_expired`: the work may have happened, so it is never
/// handed out again): the agent dies after recording it, or the relay dies
/// in a turn's finish before it commits (the cut finish is not sent
/// again). A mention lane's turn shares that
/// fate: every mention of the turn fails so, where a workflow lane loses
/// one delivery of its three.
fn by_design(point: &str) -> Vec<&'static str> {
    let mut codes = BY_DESIGN.to_vec();
    if matches!(
        point,
        "AgentAfterRecordedWrite" | "AgentAfterSideEffect" | "RelayBeforeTurnCommit"
    ) {
        codes.push("lease_expired");
    }
    codes
}
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use nostr::prelude::Keys;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tests::agent::AgentProc;
use tests::hooks::{Answer, HookServer};
use tests::pg::PgServer;
use tests::relay::Store;
use tests::workflow::Fixture;
use tests::{Backend, Relay, RelayOptions};

#[derive(Parser, Debug)]
#[command(about = "Crash campaign against real relay and agent processes")]
struct Args {
    #[arg(long, default_value_t = 24)]
    trials: usize,
    #[arg(long, default_value = "sqlite")]
    backend: String,
    /// Independent lanes (relay + agent + database) run at once.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Messages (hence deliveries) per trial.
    #[arg(long, default_value_t = 3)]
    messages: usize,
    /// PostgreSQL: two relay processes per lane (agent on the second), and
    /// database restarts and backend terminations during the campaign.
    #[arg(long)]
    pg_faults: bool,
    /// PostgreSQL: a primary and a synchronous standby, the relays given
    /// both hosts; during the campaign the primary is SIGKILLed and the
    /// standby promoted, again and again (the old primary rejoins as the
    /// new one's standby). Two relay processes per lane, as `--pg-faults`.
    #[arg(long, conflicts_with = "pg_faults")]
    pg_failover: bool,
    /// Seconds between failovers (`--pg-failover`).
    #[arg(long, default_value_t = 8)]
    failover_every_secs: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Most of a kill point's deliveries and runs that may fail visibly
    /// (a share, 0 to 1) before the campaign fails, not counting the
    /// failures the contract itself makes on a kill ([`BY_DESIGN`]).
    #[arg(long, default_value_t = 0.5)]
    max_failure_share: f64,
    /// Breaks the work on purpose (see the module's doc).
    #[arg(long, value_enum)]
    sabotage: Option<Sabotage>,
    /// Mention lanes: no workflow; each trial's messages mention the
    /// lane's agent (its mentions on), answered as turns, and the kills
    /// are those of a mention's way ([`MENTION_POINTS`]).
    #[arg(long)]
    mentions: bool,
}

/// What `--sabotage` breaks.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Sabotage {
    /// The agent's handler fails every delivery (visible failures).
    HandlerFails,
    /// Each trial arms a fault point no code has (never reached).
    UnreachablePoint,
    /// The owner deletes (NIP-09) each message once acknowledged.
    DeleteMessages,
    /// The owner deletes the workflows (NIP-09) before the campaign.
    NoRuns,
    /// The checker reads the side-effect log as empty.
    ForgetSideEffects,
}

/// Where a trial kills a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Point {
    AgentBeforeClaim,
    AgentAfterClaim,
    AgentAfterRecordedWrite,
    AgentAfterSideEffect,
    AgentAfterFinishAck,
    RelayAfterFinishCommit,
    RelayBetweenStepAndWake,
    RelayInStepTransaction,
    RelayDuringSweep,
    /// In the transaction that ends an `ask_agent` step, after the finish
    /// that woke the run committed.
    RelayBetweenFinishAndAdvance,
    /// In the transaction that fires a `delay`.
    RelayAtTimerFiring,
    /// After a webhook call was recorded (committed), before it is sent.
    RelayBeforeWebhookSend,
    /// After the webhook server answered, before the answer is recorded.
    RelayAfterWebhookSend,
    /// After the answer was recorded (committed), before the run goes on.
    RelayAfterWebhookAnswer,
    /// In the transaction that ends an approval step, after the decision
    /// committed (the run waited for it).
    RelayWhileAwaitingApproval,
    /// In the transaction that posts the revision of a refused answer,
    /// after the refusing finish committed.
    RelayWhileRevising,
    /// In the transaction of a finish, after its reply was stored and
    /// before the statuses of its turn: nothing of it commits.
    RelayBeforeTurnCommit,
    /// In the transaction of a rerun (NIP-86 `rerunrun`) of a run whose
    /// webhook call failed, after the rerun and its notice were written;
    /// the request is then asked again, as a client does when no answer
    /// came.
    RelayWhileRerunning,
    Random,
}

const POINTS: [Point; 18] = [
    Point::AgentBeforeClaim,
    Point::AgentAfterClaim,
    Point::AgentAfterRecordedWrite,
    Point::AgentAfterSideEffect,
    Point::AgentAfterFinishAck,
    Point::RelayAfterFinishCommit,
    Point::RelayBetweenStepAndWake,
    Point::RelayInStepTransaction,
    Point::RelayDuringSweep,
    Point::RelayBetweenFinishAndAdvance,
    Point::RelayAtTimerFiring,
    Point::RelayBeforeWebhookSend,
    Point::RelayAfterWebhookSend,
    Point::RelayAfterWebhookAnswer,
    Point::RelayWhileAwaitingApproval,
    Point::RelayWhileRevising,
    Point::RelayWhileRerunning,
    Point::Random,
];

/// The kills of a mention lane: before the claim, during the handler
/// (after the claim, after a recorded write, after the side effect),
/// before and after the turn's final commit, in the sweep of a lapsed
/// turn, and at random.
const MENTION_POINTS: [Point; 9] = [
    Point::AgentBeforeClaim,
    Point::AgentAfterClaim,
    Point::AgentAfterRecordedWrite,
    Point::AgentAfterSideEffect,
    Point::AgentAfterFinishAck,
    Point::RelayBeforeTurnCommit,
    Point::RelayAfterFinishCommit,
    Point::RelayDuringSweep,
    Point::Random,
];

impl Point {
    /// (process, fault spec) armed for the trial; the first is the kill
    /// awaited. The sweep is reached through a lapsed lease: the agent dies
    /// after its claim, then the relay dies in the sweep that follows.
    fn faults(self) -> Vec<(&'static str, &'static str)> {
        if self == Point::RelayDuringSweep {
            return vec![
                ("relay", "sweep:after_transition=kill*1"),
                ("agent", "claim:after=kill*1"),
            ];
        }
        self.fault().into_iter().collect()
    }

    fn fault(self) -> Option<(&'static str, &'static str)> {
        Some(match self {
            Point::AgentBeforeClaim => ("agent", "claim:before=kill*1"),
            Point::AgentAfterClaim => ("agent", "claim:after=kill*1"),
            Point::AgentAfterRecordedWrite => ("agent", "handler:after_record=kill*1"),
            Point::AgentAfterSideEffect => ("agent", "handler:after_run=kill*1"),
            Point::AgentAfterFinishAck => ("agent", "finish:after_ack=kill*1"),
            Point::RelayAfterFinishCommit => ("relay", "finish:after_commit=kill*1"),
            Point::RelayBetweenStepAndWake => ("relay", "wake:before_send=kill*1"),
            Point::RelayInStepTransaction => ("relay", "step:after_rows=kill*1"),
            Point::RelayDuringSweep => ("relay", "sweep:after_transition=kill*1"),
            Point::RelayBetweenFinishAndAdvance => ("relay", "ask:before_end=kill*1"),
            Point::RelayAtTimerFiring => ("relay", "delay:before_fire=kill*1"),
            Point::RelayBeforeWebhookSend => ("relay", "webhook:before_send=kill*1"),
            Point::RelayAfterWebhookSend => ("relay", "webhook:after_send=kill*1"),
            Point::RelayAfterWebhookAnswer => ("relay", "webhook:after_answer=kill*1"),
            Point::RelayWhileAwaitingApproval => ("relay", "approval:before_end=kill*1"),
            Point::RelayWhileRevising => ("relay", "revision:after_reissue=kill*1"),
            Point::RelayWhileRerunning => ("relay", "rerun:before_commit=kill*1"),
            Point::RelayBeforeTurnCommit => ("relay", "finish:after_reply=kill*1"),
            Point::Random => return None,
        })
    }
}

#[derive(Debug, Default, Clone)]
struct Counts {
    trials: usize,
    deliveries: usize,
    delivered: usize,
    visible_failures: usize,
    lost: usize,
    duplicate_side_effects: usize,
    duplicate_replies: usize,
    replies_without_delivered: usize,
    delivered_without_reply: usize,
    stuck: usize,
    /// Runs of the trial that ended (completed, or failed/cancelled with a code).
    runs_ended: usize,
    /// Runs still running or waiting when the trial settled.
    runs_stuck: usize,
    /// Runs whose step ran twice (two final messages, or a step twice in the trace).
    runs_advanced_twice: usize,
    /// Completed runs without their final message.
    runs_without_final: usize,
    /// Webhook calls sent more than once for a step that does not retry.
    webhook_calls_twice: usize,
    /// Runs that were interrupted mid-call and failed visibly (`interrupted`).
    webhook_interrupted: usize,
    /// Approval steps that ended with more than one decision message.
    approvals_decided_twice: usize,
    /// Trigger messages the relay acknowledged (`OK true`).
    acked: usize,
    /// Acknowledged messages a REQ by id did not return.
    unreadable: usize,
    /// Acknowledged messages that started no run.
    acked_without_run: usize,
    /// Deliveries marked delivered whose side effect never ran.
    delivered_without_effect: usize,
    /// Failed runs rerun (their reruns are counted as runs).
    reruns: usize,
    /// Failed runs asked to be rerun that have no rerun.
    reruns_missing: usize,
    /// Runs rerun twice, with two notices, or a request asked again that
    /// did not name the same rerun.
    reruns_twice: usize,
    kills: usize,
    points_reached: HashMap<String, (usize, usize)>,
    /// By kill point: (deliveries and runs that failed visibly, all of them).
    failures_by_point: HashMap<String, (usize, usize)>,
    /// By kill point and failure code: how many.
    failure_codes: HashMap<(String, String), usize>,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.trials += o.trials;
        self.deliveries += o.deliveries;
        self.delivered += o.delivered;
        self.visible_failures += o.visible_failures;
        self.lost += o.lost;
        self.duplicate_side_effects += o.duplicate_side_effects;
        self.duplicate_replies += o.duplicate_replies;
        self.replies_without_delivered += o.replies_without_delivered;
        self.delivered_without_reply += o.delivered_without_reply;
        self.stuck += o.stuck;
        self.runs_ended += o.runs_ended;
        self.runs_stuck += o.runs_stuck;
        self.runs_advanced_twice += o.runs_advanced_twice;
        self.runs_without_final += o.runs_without_final;
        self.webhook_calls_twice += o.webhook_calls_twice;
        self.webhook_interrupted += o.webhook_interrupted;
        self.approvals_decided_twice += o.approvals_decided_twice;
        self.acked += o.acked;
        self.unreadable += o.unreadable;
        self.acked_without_run += o.acked_without_run;
        self.delivered_without_effect += o.delivered_without_effect;
        self.reruns += o.reruns;
        self.reruns_missing += o.reruns_missing;
        self.reruns_twice += o.reruns_twice;
        self.kills += o.kills;
        for (from, to) in [
            (&o.points_reached, &mut self.points_reached),
            (&o.failures_by_point, &mut self.failures_by_point),
        ] {
            for (k, (a, b)) in from {
                let e = to.entry(k.clone()).or_default();
                e.0 += a;
                e.1 += b;
            }
        }
        for (k, n) in &o.failure_codes {
            *self.failure_codes.entry(k.clone()).or_default() += n;
        }
    }

    /// Counts one delivery or run of the trial at `point`, failed visibly
    /// with `code` or not (`None`).
    fn work(&mut self, point: &str, failed: Option<&str>) {
        let e = self.failures_by_point.entry(point.to_string()).or_default();
        e.1 += 1;
        if let Some(code) = failed {
            e.0 += 1;
            let code = if code.is_empty() { "(none)" } else { code };
            *self
                .failure_codes
                .entry((point.to_string(), code.to_string()))
                .or_default() += 1;
        }
    }

    /// Kill points never reached in some trial.
    fn unreached(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .points_reached
            .iter()
            .filter(|(_, (hit, of))| hit < of)
            .map(|(k, (hit, of))| format!("{k}:{hit}/{of}"))
            .collect();
        out.sort();
        out
    }

    /// Kill points where more than `max_share` of the work failed visibly
    /// for a reason other than the contract's ([`by_design`]).
    fn failing_points(&self, max_share: f64) -> Vec<String> {
        let mut out: Vec<String> = self
            .failures_by_point
            .iter()
            .map(|(k, (failed, of))| {
                let designed: usize = by_design(k)
                    .iter()
                    .filter_map(|code| self.failure_codes.get(&(k.clone(), code.to_string())))
                    .sum();
                (k, failed.saturating_sub(designed), *of)
            })
            .filter(|(_, failed, of)| *of > 0 && *failed as f64 > max_share * *of as f64)
            .map(|(k, failed, of)| format!("{k}:{failed}/{of}"))
            .collect();
        out.sort();
        out
    }

    fn bad(&self) -> usize {
        self.lost
            + self.duplicate_side_effects
            + self.duplicate_replies
            + self.replies_without_delivered
            + self.delivered_without_reply
            + self.stuck
            + self.runs_stuck
            + self.runs_advanced_twice
            + self.runs_without_final
            + self.webhook_calls_twice
            + self.approvals_decided_twice
            + self.unreadable
            + self.acked_without_run
            + self.delivered_without_effect
            + self.reruns_missing
            + self.reruns_twice
    }
}

const RELAY_TOML: &str = "[deliveries]\nretry_base_secs = 1\nretry_cap_secs = 2\nlifetime_secs = 600\n\
default_lease_secs = 3\nmax_lease_secs = 30\nsweep_interval_ms = 200\n\
[workflows]\nrun_poll_interval_ms = 200\n[limits]\nevents_per_second = 1000\nevents_burst = 1000\n\
[webhooks]\ncall_grace_secs = 1\n[communities.default]\nwebhook_allow_hosts = [\"127.0.0.1\"]\n";

struct Lane {
    sabotage: Option<Sabotage>,
    /// A mention lane (`--mentions`): the trials mention the agent.
    mentions: bool,
    /// Relays of the lane: `[A]` or `[A, B]` (B serves the agent).
    relays: Vec<Relay>,
    agent: AgentProc,
    fx: Fixture,
    side_log: PathBuf,
    store: Arc<Store>,
    /// Receives the runs' webhook calls.
    hooks: HookServer,
    /// Approves every open approval request of the lane, as a person would.
    approver: tokio::task::JoinHandle<()>,
}

impl Drop for Lane {
    fn drop(&mut self) {
        self.approver.abort();
    }
}

/// Every 300 ms, reacts `+` (as `approver`, over WebSocket) to each open
/// approval request it has not reacted to yet. Bounded: one request is
/// answered once; it lives as long as its lane. Each round runs as a task
/// of its own: the test client panics when a relay dies under it, and that
/// must cost one round, not the approver.
fn spawn_approver(
    store: Arc<Store>,
    url: String,
    approver: Keys,
    channel: String,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let done = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let round = approve_open(
                store.clone(),
                url.clone(),
                approver.clone(),
                channel.clone(),
                done.clone(),
            );
            let _ = tokio::spawn(round).await;
        }
    })
}

/// One round of the approver: reacts to the open requests not yet approved.
async fn approve_open(
    store: Arc<Store>,
    url: String,
    approver: Keys,
    channel: String,
    done: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
) {
    let q = format!(
        "SELECT {} FROM workflow_approvals WHERE decision IS NULL",
        hex_expr(&store, "request_event_id")
    );
    let open = tokio::task::spawn_blocking(move || store.try_sql(&q).unwrap_or_default())
        .await
        .unwrap_or_default();
    let todo: Vec<String> = {
        let done = done.lock().expect("approver state");
        open.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !done.contains(*l))
            .map(str::to_string)
            .collect()
    };
    if todo.is_empty() {
        return;
    }
    let Ok(mut c) = tests::Client::connect_host(&url, None).await else {
        return;
    };
    let auth = tests::client::auth_event(&approver, &c.challenge, &url);
    if !c.try_send(serde_json::json!(["AUTH", auth])).await
        || wait_ok(&mut c, &auth.id.to_hex()).await != Some(true)
    {
        return;
    }
    for id in todo {
        let ev = tests::event(&approver, 7, "+", &[&["e", &id], &["h", &channel]]);
        if !c.try_send(serde_json::json!(["EVENT", ev])).await {
            return;
        }
        if wait_ok(&mut c, &ev.id.to_hex()).await == Some(true) {
            done.lock().expect("approver state").insert(id);
        }
    }
}

fn handler_script(store: &Store, fails: bool) -> (String, PathBuf) {
    let dir = store.dir.path();
    let side_log = dir.join("side-effects.log");
    let script = dir.join("side-effect.sh");
    // The side effect: one line per delivery and revision, appended.
    // The answer: not JSON on the step's message (refused: the step asks
    // again), the step's output on its revision. Sabotaged, it fails
    // before any.
    let fail = if fails {
        "import sys; print('sabotaged', file=sys.stderr); sys.exit(1)\n"
    } else {
        ""
    };
    let program = dir.join("side-effect.py");
    std::fs::write(
        &program,
        format!(
            "{fail}import json, sys\nd = json.load(sys.stdin)\n\
             with open({log:?}, 'a') as log:\n\
             \x20   for m in d['messages']:\n\
             \x20       log.write(f\"{{m['delivery_id']}} {{m['revision']}}\\n\")\n\
             revised = all(m['revision'] > 0 for m in d['messages'])\n\
             print(json.dumps({{'done': True}}) if revised else 'done')\n",
            log = side_log.display().to_string()
        ),
    )
    .expect("program");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nexec python3 {}\n", program.display()),
    )
    .expect("script");
    (
        format!(
            "type = \"exec\"\ncommand = [\"sh\", \"{}\"]\ntimeout_secs = 20\neffect = \"write\"",
            script.display()
        ),
        side_log,
    )
}

const AGENT_EXTRA: &str = "lease_secs = 3\npoll_interval_secs = 1\ndebounce_ms = 0\nmax_turn_deliveries = 1\nreconnect_min_ms = 50\nreconnect_max_ms = 500";
/// A lane's relays, agent and fixtures on a database of `backend` (its
/// URL naming the servers of `hosts`' ports when there are several).
async fn lane(
    backend: &Backend,
    hosts: &[u16],
    two_relays: bool,
    sabotage: Option<Sabotage>,
    mentions: bool,
) -> Lane {
    let store = match backend {
        Backend::Postgres(primary) if hosts.len() > 1 => Store::on_hosts(primary, hosts),
        _ => Store::new(backend),
    };
    let opts = RelayOptions {
        config_toml: RELAY_TOML.into(),
        ..Default::default()
    };
    let mut relays = vec![Relay::start_with(store.clone(), opts.clone())];
    if two_relays {
        relays.push(Relay::start_with(store.clone(), opts));
    }
    let mut fx = Fixture::new(&relays[0], "chaos", 1).await;
    let approver = Keys::generate();
    let put = tests::event(
        &fx.owner,
        9000,
        "",
        &[&["h", "chaos"], &["p", &approver.public_key().to_hex()]],
    );
    fx.owner_client.publish_ok(&put).await;
    let hooks = HookServer::start().await;
    hooks.answer("/call", Answer::json(200, serde_json::json!({"ok": true})));
    hooks.answer("/once", Answer::json(200, serde_json::json!({"ok": true})));
    if mentions {
        // No workflow: the agent's mentions on, as its owner.
        let agent = fx.agents[0].public_key().to_hex();
        let set = tests::workflow::rpc(
            &relays[0],
            &fx.owner,
            "setmentions",
            serde_json::json!([agent, true]),
        )
        .await;
        assert_eq!(set.0, 200, "setmentions: {set:?}");
    } else {
        define_workflows(&mut fx, &hooks, &approver, sabotage).await;
    }
    let url = relays[0].ws_url();
    let approver = spawn_approver(store.clone(), url, approver, "chaos".into());
    let (handler, side_log) = handler_script(&store, sabotage == Some(Sabotage::HandlerFails));
    let agent_relay = relays.last().expect("a relay");
    let agent = AgentProc::start_env(
        agent_relay,
        &fx.agents[0].clone(),
        &fx.owner.clone(),
        &handler,
        AGENT_EXTRA,
        &[],
    );
    Lane {
        sabotage,
        mentions,
        relays,
        agent,
        fx,
        side_log,
        store,
        hooks,
        approver,
    }
}

/// The lane's workflows: the run waits for the agent's answer, then for a
/// timer, then calls out (sent again after a crash: retry), then waits for
/// a person's approval, then posts the answer: every kind of wait a run
/// has, with a side effect at the end. Each message also starts a
/// one-step run whose call never retries.
async fn define_workflows(fx: &mut Fixture, hooks: &HookServer, approver: &Keys, sabotage: Option<Sabotage>) {
    let chaos = fx.define(
        "chaos",
        &serde_json::json!({"name": "chaos", "trigger": {"on": "message_posted"}, "steps": [
            {"id": "ask", "action": "ask_agent", "text": format!("{} work on {{{{trigger.text}}}}", fx.mention(0)),
             "output": {"type": "object", "required": ["done"], "properties": {"done": {"type": "boolean"}}}, "revise": 1},
            {"id": "pause", "action": "delay", "secs": 1},
            {"id": "call", "action": "call_webhook", "url": hooks.url("/call"), "retry": true, "timeout_secs": 2,
             "body": {"text": "{{trigger.text}}", "reply": "{{steps.ask.output.reply}}"}},
            {"id": "approve", "action": "request_approval", "text": "ship {{trigger.text}}?",
             "approvers": [approver.public_key().to_hex()]},
            {"id": "final", "action": "send_message", "text": "finished {{trigger.text}}: {{steps.ask.output.reply}}"}]}),
    )
    .await;
    let once = fx
        .define(
            "once",
            &serde_json::json!({"name": "once", "trigger": {"on": "message_posted"}, "steps": [
            {"id": "call", "action": "call_webhook", "url": hooks.url("/once"), "timeout_secs": 2,
             "body": {"text": "{{trigger.text}}"}}]}),
        )
        .await;
    if sabotage == Some(Sabotage::NoRuns) {
        let (a, b) = (chaos.id.to_hex(), once.id.to_hex());
        let deletion = tests::event(&fx.owner, 5, "", &[&["e", &a], &["e", &b]]);
        fx.owner_client.publish_ok(&deletion).await;
    }
}

async fn wait_exit(lane: &mut Lane, which: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let dead = match which {
            "agent" => lane.agent.exited(),
            _ => lane.relays.iter_mut().any(|r| r.exited()),
        };
        if dead {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

/// Restarts every dead or still armed process of the lane, without
/// faults. A live agent is left running through a relay's kill, as it
/// would be: it reconnects, renews its claims and finishes them (a new
/// agent process would let the claims of recorded writes lapse, turning
/// a relay's kill into an agent's).
fn revive(lane: &mut Lane) {
    for r in lane.relays.iter_mut() {
        if r.exited() || r.options.env.iter().any(|(k, _)| k == "RELAY_FAULTS") {
            r.restart_with(RelayOptions {
                config_toml: RELAY_TOML.into(),
                ..Default::default()
            });
        }
    }
    let armed = lane.agent.env().iter().any(|(k, _)| k == "AGENT_FAULTS");
    if armed || lane.agent.exited() {
        lane.agent.restart_env(&[]);
    }
}

/// One trial: arm, post, kill, revive, wait, check.
async fn trial(
    lane: &mut Lane,
    t: usize,
    point: Point,
    messages: usize,
    rng: &mut rand::rngs::StdRng,
) -> Counts {
    let mut c = Counts {
        trials: 1,
        ..Default::default()
    };
    let mut faults = point.faults();
    if lane.sabotage == Some(Sabotage::UnreachablePoint) {
        faults = vec![("relay", "chaos:no_such_point=kill*1")];
    }
    for (which, spec) in &faults {
        if *which == "relay" {
            let env = vec![("RELAY_FAULTS".to_string(), spec.to_string())];
            for r in lane.relays.iter_mut() {
                r.restart_with(RelayOptions {
                    config_toml: RELAY_TOML.into(),
                    env: env.clone(),
                });
            }
        } else {
            lane.agent
                .restart_env(&[("AGENT_FAULTS".to_string(), spec.to_string())]);
        }
    }
    let armed = faults.first().copied();
    let tag = format!("trial-{t}-");
    let rerunning = point == Point::RelayWhileRerunning;
    if rerunning {
        // The trial's one-step runs fail; they are rerun once it is fixed.
        let down = Answer::json(500, serde_json::json!({"error": "down"}));
        lane.hooks.answer("/once", down);
    }
    // Post the trial's messages; a message counts only once acknowledged
    // (the relay may die under the poster: what was not acknowledged was
    // never promised).
    let mut acked = Vec::new();
    // A PostgreSQL restart or a terminated backend may refuse the first
    // attempts; keep trying (bounded) until the relay acknowledges
    // something, or the armed kill point could never be reached.
    let post_deadline = Instant::now() + Duration::from_secs(30);
    while acked.is_empty() && Instant::now() < post_deadline {
        let Ok(mut poster) = tests::Client::connect_host(&lane.relays[0].ws_url(), None).await else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let owner = lane.fx.owner.clone();
        let challenge_ok = {
            let url = lane.relays[0].ws_url();
            let ev = tests::client::auth_event(&owner, &poster.challenge, &url);
            poster.send(serde_json::json!(["AUTH", ev])).await;
            wait_ok(&mut poster, &ev.id.to_hex()).await == Some(true)
        };
        if challenge_ok {
            let agent = lane.fx.agents[0].public_key().to_hex();
            for i in 0..messages {
                let text = format!("{tag}{i}");
                let ev = if lane.mentions {
                    tests::event(
                        &owner,
                        9,
                        &format!("@agent {text}"),
                        &[&["h", "chaos"], &["p", &agent]],
                    )
                } else {
                    tests::event(&owner, 9, &text, &[&["h", "chaos"]])
                };
                poster.send(serde_json::json!(["EVENT", ev])).await;
                match wait_ok(&mut poster, &ev.id.to_hex()).await {
                    Some(true) => acked.push((text, ev.id.to_hex())),
                    Some(false) | None => break,
                }
            }
            if lane.sabotage == Some(Sabotage::DeleteMessages) && !acked.is_empty() {
                let ids: Vec<Vec<String>> =
                    acked.iter().map(|(_, id)| vec!["e".into(), id.clone()]).collect();
                let tags: Vec<Vec<&str>> = ids
                    .iter()
                    .map(|t| t.iter().map(String::as_str).collect())
                    .collect();
                let tags: Vec<&[&str]> = tags.iter().map(Vec::as_slice).collect();
                let deletion = tests::event(&owner, 5, "", &tags);
                poster.send(serde_json::json!(["EVENT", deletion])).await;
                let _ = wait_ok(&mut poster, &deletion.id.to_hex()).await;
            }
        }
        if acked.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    if rerunning {
        ask_reruns(lane, &tag, acked.len()).await;
    }
    let reached = match armed {
        Some((which, _)) => wait_exit(lane, which, Duration::from_secs(30)).await,
        None => {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..1500))).await;
            if rng.random_bool(0.5) {
                lane.agent.kill();
            } else {
                let i = rng.random_range(0..lane.relays.len());
                lane.relays[i].kill();
            }
            true
        }
    };
    if reached {
        c.kills += 1;
    }
    let key = format!("{point:?}");
    c.points_reached.insert(key.clone(), (usize::from(reached), 1));
    revive(lane);
    if rerunning {
        c.reruns_twice += ask_reruns_again(lane, &tag).await;
    }
    c.acked += acked.len();
    c.unreadable += unreadable(lane, &acked).await;
    let texts: Vec<String> = acked.into_iter().map(|(text, _)| text).collect();
    if lane.mentions {
        check_mentions(lane, &key, &tag, &texts, &mut c).await;
    } else {
        check(lane, &key, &tag, &texts, &mut c).await;
    }
    c
}

/// The trial's mention rows (id, status, failure code, reply id in hex,
/// trigger context), once every acknowledged mention has one and all are
/// terminal (or after 60 s).
async fn mention_rows(store: &Store, tag: &str, acked: &[String]) -> Vec<Vec<String>> {
    let q = format!(
        "SELECT id, status, failure_code, {}, trigger_context FROM workflow_agent_deliveries \
         WHERE source = 'mention' AND trigger_context LIKE '%{tag}%'",
        hex_expr(store, "reply_event_id")
    );
    let terminal = ["delivered", "failed", "expired", "cancelled"];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rows: Vec<Vec<String>> = store
            .sql_retrying(&q)
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| l.split('|').map(str::to_string).collect())
            .collect();
        let has_row = |text: &String| {
            rows.iter()
                .any(|r| r.get(4).is_some_and(|ctx| ctx.contains(text.as_str())))
        };
        let settled = acked.iter().all(has_row) && rows.iter().all(|r| terminal.contains(&r[1].as_str()));
        if settled || Instant::now() > deadline {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A mention lane's trial: every acknowledged mention has its row, ended
/// (none stuck); its side effect ran once (a turn runs once: each of its
/// rows is logged once); a delivered row names a stored reply of the
/// agent's, a failed one has its notice and no reply; no message is
/// answered twice (two replies under it: a turn run twice).
async fn check_mentions(lane: &Lane, point: &str, tag: &str, acked: &[String], c: &mut Counts) {
    let store = &lane.store;
    let rows = mention_rows(store, tag, acked).await;
    c.deliveries += rows.len();
    c.lost += acked
        .iter()
        .filter(|text| {
            !rows
                .iter()
                .any(|r| r.get(4).is_some_and(|ctx| ctx.contains(text.as_str())))
        })
        .count();
    let side = side_effects(lane);
    let mut reply_ids = std::collections::HashSet::new();
    let mut replies_per_message: HashMap<String, usize> = HashMap::new();
    for ev in agent_messages(lane) {
        reply_ids.insert(ev["id"].as_str().unwrap_or_default().to_string());
        for t in ev["tags"].as_array().into_iter().flatten() {
            if t[0] == "e" && t[3] == "root" {
                *replies_per_message
                    .entry(t[1].as_str().unwrap_or_default().to_string())
                    .or_default() += 1;
            }
        }
    }
    c.duplicate_replies += replies_per_message.values().filter(|n| **n > 1).count();
    for r in &rows {
        let (id, status, code) = (&r[0], r[1].as_str(), r[2].as_str());
        let reply = r[3].trim_start_matches("\\x").to_ascii_lowercase();
        let effects = side
            .lines()
            .filter(|l| l.split(' ').next() == Some(id.as_str()))
            .count();
        if effects > 1 {
            c.duplicate_side_effects += 1;
        }
        if status == "delivered" && effects == 0 {
            c.delivered_without_effect += 1;
        }
        // Its reply: a stored one of the agent's, named by the row.
        let replied = match status {
            "delivered" => reply_ids.contains(&reply),
            _ => !reply.is_empty(),
        };
        count_row(store, c, point, (id, status, code), replied);
    }
}

/// The side-effect log: a line per delivery the handler ran (read as
/// empty under `--sabotage forget-side-effects`).
fn side_effects(lane: &Lane) -> String {
    match lane.sabotage {
        Some(Sabotage::ForgetSideEffects) => String::new(),
        _ => std::fs::read_to_string(&lane.side_log).unwrap_or_default(),
    }
}

/// Every kind 9 the lane's agent stored (its replies).
fn agent_messages(lane: &Lane) -> Vec<Value> {
    let agent_hex = lane.fx.agents[0].public_key().to_hex();
    let raw = lane.store.sql_retrying(&format!(
        "SELECT raw FROM events WHERE kind = 9 AND pubkey = {}",
        lane.store.blob(&agent_hex)
    ));
    raw.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// Counts one delivery row of a trial by its status: delivered (`replied`:
/// with its reply), failed or expired (with its notice, and not
/// `replied`), cancelled; any other status is stuck.
fn count_row(
    store: &Store,
    c: &mut Counts,
    point: &str,
    (id, status, code): (&str, &str, &str),
    replied: bool,
) {
    match status {
        "delivered" => {
            c.delivered += 1;
            c.work(point, None);
            if !replied {
                c.delivered_without_reply += 1;
            }
        }
        "failed" | "expired" => {
            if replied {
                c.replies_without_delivered += 1;
            }
            let notice = store.sql_retrying(&format!(
                "SELECT COUNT(*) FROM events WHERE kind = 9 AND raw LIKE '%\"workflow-delivery-failed\",\"{id}\"%'"
            ));
            if notice.trim() == "1" {
                c.visible_failures += 1;
                c.work(point, Some(code));
            } else {
                c.lost += 1;
            }
        }
        "cancelled" => {
            c.visible_failures += 1;
            c.work(point, Some(code));
        }
        _ => c.stuck += 1,
    }
}

/// How many of the acknowledged messages a REQ by their ids, to the
/// revived relay, does not return (retried for 30 s while the relay or
/// its database comes back).
async fn unreadable(lane: &Lane, acked: &[(String, String)]) -> usize {
    if acked.is_empty() {
        return 0;
    }
    let ids: Vec<&str> = acked.iter().map(|(_, id)| id.as_str()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut found = 0;
    while Instant::now() < deadline {
        if let Ok(mut c) = tests::Client::connect_host(&lane.relays[0].ws_url(), None).await {
            // Not the test client's `req`: it panics on a relay that dies.
            c.send(serde_json::json!(["REQ", "readback", {"ids": ids}])).await;
            let mut seen = std::collections::HashSet::new();
            loop {
                match c.try_recv(Duration::from_secs(5)).await {
                    Some(v) if v[0] == "EVENT" && v[1] == "readback" => {
                        if let Some(id) = v[2]["id"].as_str() {
                            seen.insert(id.to_string());
                        }
                    }
                    Some(v) if v[0] == "EOSE" && v[1] == "readback" => {
                        return ids.len() - seen.len();
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            found = seen.len();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ids.len() - found
}

/// The trial's one-step runs that failed on the server's 500, once every
/// one of the `expected` has ended (up to 30 s).
async fn failed_origins(lane: &Lane, tag: &str, expected: usize) -> Vec<String> {
    let of_trial = format!(
        "FROM workflow_runs WHERE workflow_id = 'once' AND cause_type <> 'rerun' \
         AND trigger_context LIKE '%\"{tag}%'"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let counts = lane.store.sql_retrying(&format!(
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN status IN ('running', 'waiting') THEN 1 ELSE 0 END), 0) \
             {of_trial}"
        ));
        let mut n = counts.trim().split('|').map(|v| v.parse::<usize>().unwrap_or(0));
        let (all, open) = (n.next().unwrap_or(0), n.next().unwrap_or(1));
        if (all >= expected && open == 0) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    lane.store
        .sql_retrying(&format!(
            "SELECT id {of_trial} AND status = 'failed' AND error_code = 'http_500'"
        ))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Once the trial's one-step runs failed, fixes the server and asks (as
/// the owner, NIP-86 `rerunrun`) to rerun each; stops at the first
/// request that gets no answer (the relay died in it). An answer of 500
/// or more (the database between two primaries, `--pg-failover`) is
/// asked again, up to 30 s: `rerunrun` is idempotent, and a rerun never
/// asked would leave the trial's kill point unreached.
async fn ask_reruns(lane: &Lane, tag: &str, expected: usize) {
    let origins = failed_origins(lane, tag, expected).await;
    let fixed = Answer::json(200, serde_json::json!({"ok": true}));
    lane.hooks.answer("/once", fixed);
    let deadline = Instant::now() + Duration::from_secs(30);
    for id in origins {
        loop {
            let asked = tests::workflow::try_rpc(
                &lane.relays[0],
                &lane.fx.owner,
                "rerunrun",
                serde_json::json!([id]),
            );
            match asked.await {
                None => return,
                Some((status, _)) if status >= 500 && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Some(_) => break,
            }
        }
    }
}

/// After the revival, asks for every rerun again until answered (up to
/// 30 s each), then once more (until answered too): the second answer
/// must name the same rerun as made before (`created` false). Returns how
/// many did not.
async fn ask_reruns_again(lane: &Lane, tag: &str) -> usize {
    let mut twice = 0;
    for id in failed_origins(lane, tag, 0).await {
        let ask = || {
            tests::workflow::try_rpc(
                &lane.relays[0],
                &lane.fx.owner,
                "rerunrun",
                serde_json::json!([id]),
            )
        };
        // Both asks until answered: with `--pg-failover` either may meet
        // the database between two primaries (503), which says nothing of
        // the rerun.
        let answered = || async {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match ask().await {
                    Some((200, v)) => break Some(v["result"].clone()),
                    _ if Instant::now() > deadline => break None,
                    _ => tokio::time::sleep(Duration::from_millis(300)).await,
                }
            }
        };
        let Some(first) = answered().await else {
            continue; // no rerun: counted missing by `check_runs`
        };
        let again = answered().await;
        let same = again.as_ref().is_some_and(|a| {
            a["created"] == false && a["rerun"] == first["rerun"] && first["rerun"].is_string()
        });
        if !same {
            eprintln!("rerun of {id} asked again: {first} then {again:?}");
            twice += 1;
        }
    }
    twice
}

/// The OK for `id` within 5 s; `None` if the connection ended or nothing came.
async fn wait_ok(c: &mut tests::Client, id: &str) -> Option<bool> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let v = c.try_recv(Duration::from_millis(500)).await;
        match v {
            Some(v) if v[0] == "OK" && v[1] == id => return v[2].as_bool(),
            Some(_) => {}
            None if Instant::now() < deadline => return None,
            None => {}
        }
    }
    None
}

/// Waits for the trial's deliveries to settle, then counts (the trial's
/// kill point is `point`).
async fn check(lane: &Lane, point: &str, tag: &str, acked: &[String], c: &mut Counts) {
    let store = &lane.store;
    let q = format!(
        "SELECT d.id, d.status, d.failure_code, d.message_event_id, r.trigger_context FROM workflow_agent_deliveries d \
         JOIN workflow_runs r ON r.community_id = d.community_id AND r.id = d.run_id \
         WHERE r.trigger_context LIKE '%\"{tag}%'"
    );
    let hexcol = |s: &str| -> String {
        // SQLite prints bytes as b'..'; psql as \x..; normalise to hex.
        if let Some(h) = s.strip_prefix("\\x") {
            return h.to_string();
        }
        s.to_string()
    };
    let terminal = ["delivered", "failed", "expired", "cancelled"];
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut rows: Vec<Vec<String>>;
    loop {
        let out =
            store.sql_retrying(&q.replace("d.message_event_id", &hex_expr(store, "d.message_event_id")));
        rows = out
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| l.split('|').map(str::to_string).collect())
            .collect();
        let has_row = |text: &String| {
            rows.iter()
                .any(|r| r.get(4).is_some_and(|ctx| ctx.contains(&format!("\"{text}\""))))
        };
        let settled = acked.iter().all(has_row) && rows.iter().all(|r| terminal.contains(&r[1].as_str()));
        if settled || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.deliveries += rows.len();
    // An acknowledged message whose delivery never appeared is lost.
    c.lost += acked
        .iter()
        .filter(|text| {
            !rows
                .iter()
                .any(|r| r.get(4).is_some_and(|ctx| ctx.contains(&format!("\"{text}\""))))
        })
        .count();
    let side = side_effects(lane);
    let mut replies_per_message: HashMap<String, usize> = HashMap::new();
    for ev in agent_messages(lane) {
        for t in ev["tags"].as_array().into_iter().flatten() {
            if t[0] == "e" && (t[3] == "root" || t[3] == "reply") {
                if let Some(id) = t[1].as_str() {
                    *replies_per_message.entry(id.to_string()).or_default() += 1;
                }
            }
        }
    }
    for r in &rows {
        let (id, status, msg) = (&r[0], r[1].as_str(), hexcol(&r[3]));
        // One side effect per revision of the delivery's message.
        let mine: Vec<&str> = side
            .lines()
            .map(str::trim)
            .filter(|l| l.split(' ').next() == Some(id.as_str()))
            .collect();
        let effects = mine.len();
        if mine.iter().enumerate().any(|(i, l)| mine[..i].contains(l)) {
            c.duplicate_side_effects += 1;
        }
        if status == "delivered" && effects == 0 {
            c.delivered_without_effect += 1;
        }
        let code = r.get(2).map(String::as_str).unwrap_or_default();
        let n_replies = replies_per_message.get(&msg).copied().unwrap_or(0);
        if n_replies > 1 {
            c.duplicate_replies += 1;
        }
        count_row(store, c, point, (id, status, code), n_replies > 0);
    }
    check_runs(lane, point, tag, acked, c).await;
}

/// Waits for the trial's runs to end, then checks each: nothing stuck
/// running or waiting, no step run twice, a completed run posted its
/// final message once, a run that did not complete says why.
async fn check_runs(lane: &Lane, point: &str, tag: &str, acked: &[String], c: &mut Counts) {
    let store = &lane.store;
    let q = format!(
        "SELECT id, workflow_id, status, COALESCE(error_code, ''), trace FROM workflow_runs \
         WHERE trigger_context LIKE '%\"{tag}%'"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let q = q.replace("SELECT id,", "SELECT id, cause_type, cause_id, trigger_context,");
    // Each run as [id, workflow, status, code, trace, context, cause type, cause id].
    let runs: Vec<Vec<String>> = loop {
        let runs: Vec<Vec<String>> = store
            .sql_retrying(&q)
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| l.splitn(8, '|').map(str::to_string).collect())
            .filter(|r: &Vec<String>| r.len() == 8)
            .map(|mut r| {
                let cause: Vec<String> = r.drain(1..3).collect();
                let context = r.remove(1);
                r.push(context);
                r.extend(cause);
                r
            })
            .collect();
        let open = runs
            .iter()
            .any(|r| matches!(r[2].as_str(), "running" | "waiting"));
        if !open || Instant::now() > deadline {
            break runs;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    c.acked_without_run += acked
        .iter()
        .filter(|text| !runs.iter().any(|r| r[5].contains(&format!("\"{text}\""))))
        .count();
    for r in &runs {
        let (id, workflow, status, code, trace) = (&r[0], r[1].as_str(), r[2].as_str(), r[3].as_str(), &r[4]);
        check_side_steps(lane, id, workflow, code, c);
        let steps: Vec<String> = serde_json::from_str::<Value>(trace)
            .ok()
            .and_then(|t| t.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|e| e["step"].as_str().map(str::to_string))
            .collect();
        let mut unique = steps.clone();
        unique.sort();
        unique.dedup();
        let finals = store.sql_retrying(&format!(
            "SELECT COUNT(*) FROM events WHERE kind = 9 AND raw LIKE '%[\"workflow-run\",\"{id}\"]%' \
             AND raw LIKE '%[\"workflow-step\",\"final\"]%'"
        ));
        let finals: usize = finals.trim().parse().unwrap_or(0);
        if unique.len() != steps.len() || finals > 1 {
            c.runs_advanced_twice += 1;
        }
        if matches!(status, "running" | "waiting") {
            // Say where it stands, for whoever reads the campaign's log.
            let row = store.sql_retrying(&format!(
                "SELECT workflow_id, status, current_step, wake_at, {} FROM workflow_runs WHERE id = '{id}'",
                lane.store_now()
            ));
            let calls = store.sql_retrying(&format!(
                "SELECT step_id, attempt, state, deadline, COALESCE(error_code, '') FROM workflow_webhook_calls \
                 WHERE run_id = '{id}'"
            ));
            let approvals = store.sql_retrying(&format!(
                "SELECT step_id, COALESCE(decision, 'open') FROM workflow_approvals WHERE run_id = '{id}'"
            ));
            let wakes = store.sql_retrying(&format!(
                "SELECT delivery_id FROM workflow_run_wakes WHERE run_id = '{id}'"
            ));
            eprintln!(
                "stuck run {id}: {} | calls: {} | approvals: {} | wakes: {}",
                row.trim(),
                calls.trim(),
                approvals.trim(),
                wakes.trim()
            );
        }
        if check_rerun(store, r, &runs, c) {
            continue; // failed by the trial's design: its rerun is the work
        }
        match status {
            "running" | "waiting" => c.runs_stuck += 1,
            "completed" if workflow == "once" || finals == 1 => {
                c.runs_ended += 1;
                c.work(point, None);
            }
            "completed" => c.runs_without_final += 1,
            _ if !code.is_empty() => {
                c.runs_ended += 1;
                c.work(point, Some(code));
            }
            _ => c.runs_stuck += 1,
        }
    }
}

/// Counts the rerun of `run` when it is an origin (a one-step run failed
/// on the rerun trial's server error, or any run rerun): exactly one
/// rerun, announced by exactly one notice. Whether it was one.
fn check_rerun(store: &Store, run: &[String], runs: &[Vec<String>], c: &mut Counts) -> bool {
    let (id, workflow, code) = (&run[0], run[1].as_str(), run[3].as_str());
    let reruns: Vec<&Vec<String>> = runs.iter().filter(|o| o[6] == "rerun" && o[7] == *id).collect();
    if reruns.is_empty() && !(workflow == "once" && code == "http_500") {
        return false;
    }
    match reruns.as_slice() {
        [] => c.reruns_missing += 1,
        [rerun] => {
            c.reruns += 1;
            let notices = store.sql_retrying(&format!(
                "SELECT COUNT(*) FROM events WHERE kind = 9 AND raw LIKE '%[\"rerun\",\"{}\"]%'",
                rerun[0]
            ));
            if notices.trim() != "1" {
                c.reruns_twice += 1;
            }
        }
        _ => c.reruns_twice += 1,
    }
    true
}

/// A run's webhook calls and approval: a call that does not retry was
/// received at most once (an interrupted one failed the run visibly); an
/// approval was announced decided at most once.
fn check_side_steps(lane: &Lane, run_id: &str, workflow: &str, code: &str, c: &mut Counts) {
    let key = format!("{run_id}:call");
    let path = if workflow == "once" { "/once" } else { "/call" };
    let calls = lane
        .hooks
        .received(path)
        .iter()
        .filter(|r| r.header("idempotency-key") == Some(key.as_str()))
        .count();
    if workflow == "once" && calls > 1 {
        c.webhook_calls_twice += 1;
    }
    if code == "interrupted" {
        c.webhook_interrupted += 1;
    }
    let decisions = lane.store.sql_retrying(&format!(
        "SELECT COUNT(*) FROM events WHERE kind = 9 AND raw LIKE '%[\"workflow-run\",\"{run_id}\"]%' \
         AND raw LIKE '%\"workflow-approval\",\"approved\"%'"
    ));
    if decisions.trim().parse::<usize>().unwrap_or(0) > 1 {
        c.approvals_decided_twice += 1;
    }
}

impl Lane {
    /// The database's clock in unix seconds, as SQL.
    fn store_now(&self) -> &'static str {
        match self.store.backend {
            Backend::Sqlite => "CAST(strftime('%s','now') AS INTEGER)",
            Backend::Postgres(_) => "CAST(EXTRACT(EPOCH FROM now()) AS BIGINT)",
        }
    }
}

fn hex_expr(store: &Store, col: &str) -> String {
    match store.backend {
        Backend::Sqlite => format!("lower(hex({col}))"),
        Backend::Postgres(_) => format!("encode({col}, 'hex')"),
    }
}

/// Fails over between the servers of `pair` (the first the primary)
/// every `every` until `stop`: once a synchronous standby streams, the
/// primary is SIGKILLed, the standby promoted and made to commit alone,
/// and the old primary rejoins as its standby (a base backup), the new
/// primary then waiting for it again. From a plain thread that lives to
/// the end (a server started by a thread dies with it). Returns how many
/// failovers were made.
fn failovers(mut pair: [Arc<PgServer>; 2], every: Duration, stop: &std::sync::atomic::AtomicBool) -> u64 {
    let stopped = || stop.load(std::sync::atomic::Ordering::SeqCst);
    let mut done = 0;
    // Let the lanes set up first.
    let mut next = Instant::now() + Duration::from_secs(15);
    loop {
        while Instant::now() < next || !pair[0].has_synchronous_standby() {
            if stopped() {
                return done;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let [old, new] = &pair;
        old.kill();
        new.promote().expect("promotion");
        // Alone until the old primary rejoins: commits must not wait for
        // a standby that is not there.
        new.set_synchronous(false).expect("asynchronous");
        old.follow(new).expect("the old primary rejoins as a standby");
        new.set_synchronous(true).expect("synchronous again");
        pair.swap(0, 1);
        done += 1;
        next = Instant::now() + every;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let started = Instant::now();
    let server = match args.backend.as_str() {
        "postgres" => Some(Arc::new(PgServer::start().expect("PostgreSQL for the campaign"))),
        "sqlite" => None,
        other => panic!("unknown backend {other}"),
    };
    let backend = match &server {
        Some(s) => Backend::Postgres(s.clone()),
        None => Backend::Sqlite,
    };
    // `--pg-failover`: a synchronous standby, both servers in each URL.
    let standby = match (&server, args.pg_failover) {
        (Some(s), true) => Some(Arc::new(s.standby(true).expect("a standby"))),
        (None, true) => panic!("--pg-failover needs --backend postgres"),
        _ => None,
    };
    let hosts: Vec<u16> = server.iter().chain(&standby).map(|s| s.port).collect();
    let two_relays = args.pg_faults || args.pg_failover;
    let lanes = args.parallel.max(1).min(args.trials.max(1));
    let mut handles = Vec::new();
    for l in 0..lanes {
        let (backend, hosts) = (backend.clone(), hosts.clone());
        let (trials, messages, seed) = (args.trials, args.messages, args.seed);
        let (sabotage, mentions) = (args.sabotage, args.mentions);
        handles.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_mul(1000) + l as u64);
            let mut lane = lane(&backend, &hosts, two_relays, sabotage, mentions).await;
            let mut counts = Counts::default();
            let points: &[Point] = if mentions { &MENTION_POINTS } else { &POINTS };
            for t in (l..trials).step_by(lanes) {
                let point = points[t % points.len()];
                let c = trial(&mut lane, t, point, messages, &mut rng).await;
                counts.add(&c);
            }
            counts
        }));
    }
    // PostgreSQL faults while the lanes run: restarts and terminated backends.
    // From a plain thread that lives to the end: a server (re)started by a
    // thread dies with it (parent-death signal).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pg_thread = match (&server, args.pg_faults) {
        (Some(s), true) => {
            let (s, stop) = (s.clone(), stop.clone());
            Some(std::thread::spawn(move || {
                let mut n = 0u64;
                let (mut restarts, mut terminations) = (0u64, 0u64);
                // Let the lanes set up first.
                std::thread::sleep(Duration::from_secs(15));
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    for _ in 0..70 {
                        if stop.load(std::sync::atomic::Ordering::SeqCst) {
                            return (restarts, terminations);
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    n += 1;
                    if n.is_multiple_of(3) {
                        s.stop();
                        std::thread::sleep(Duration::from_millis(800));
                        s.start_again();
                        restarts += 1;
                    } else {
                        terminations += 1;
                        let _ = s.psql(
                            "postgres",
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                             WHERE application_name = 'relay' AND pid <> pg_backend_pid()",
                        );
                    }
                }
                (restarts, terminations)
            }))
        }
        _ => None,
    };
    let failover_thread = match (&server, &standby) {
        (Some(a), Some(b)) => {
            let pair = [a.clone(), b.clone()];
            let every = Duration::from_secs(args.failover_every_secs);
            let stop = stop.clone();
            Some(std::thread::spawn(move || failovers(pair, every, &stop)))
        }
        _ => None,
    };
    let mut total = Counts::default();
    for h in handles {
        total.add(&h.await.expect("lane"));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (pg_restarts, pg_terminations) = pg_thread.map(|t| t.join().unwrap_or((0, 0))).unwrap_or((0, 0));
    let pg_failovers = failover_thread.map_or(0, |t| t.join().expect("failover thread"));
    let mut reached: Vec<String> = total
        .points_reached
        .iter()
        .map(|(k, (a, b))| format!("{k}:{a}/{b}"))
        .collect();
    reached.sort();
    println!(
        "chaos backend={} trials={} acked={} unreadable={} acked_without_run={} deliveries={} delivered={} \
         delivered_without_effect={} visible_failures={} lost={} duplicate_side_effects={} \
         duplicate_replies={} replies_without_delivered={} delivered_without_reply={} stuck={} runs_ended={} \
         runs_stuck={} runs_advanced_twice={} runs_without_final={} webhook_calls_twice={} webhook_interrupted={} \
         approvals_decided_twice={} reruns={} reruns_missing={} reruns_twice={} kills={} pg_restarts={} \
         pg_terminations={} pg_failovers={} seconds={}",
        args.backend,
        total.trials,
        total.acked,
        total.unreadable,
        total.acked_without_run,
        total.deliveries,
        total.delivered,
        total.delivered_without_effect,
        total.visible_failures,
        total.lost,
        total.duplicate_side_effects,
        total.duplicate_replies,
        total.replies_without_delivered,
        total.delivered_without_reply,
        total.stuck,
        total.runs_ended,
        total.runs_stuck,
        total.runs_advanced_twice,
        total.runs_without_final,
        total.webhook_calls_twice,
        total.webhook_interrupted,
        total.approvals_decided_twice,
        total.reruns,
        total.reruns_missing,
        total.reruns_twice,
        total.kills,
        pg_restarts,
        pg_terminations,
        pg_failovers,
        started.elapsed().as_secs()
    );
    println!("kill points reached: {}", reached.join(" "));
    // Each point's visible failures, with the reason for each kind.
    let mut points: Vec<&String> = total.failures_by_point.keys().collect();
    points.sort();
    for point in points {
        let (failed, of) = total.failures_by_point[point];
        let mut codes: Vec<String> = total
            .failure_codes
            .iter()
            .filter(|((p, _), _)| p == point)
            .map(|((_, code), n)| format!("{code}={n}"))
            .collect();
        codes.sort();
        println!(
            "failed visibly at {point}: {failed} of {of} ({})",
            codes.join(" ")
        );
    }
    let unreached = total.unreached();
    let failing = total.failing_points(args.max_failure_share);
    if !unreached.is_empty() {
        println!("FAILED: kill points not reached: {}", unreached.join(" "));
    }
    if !failing.is_empty() {
        println!(
            "FAILED: more than {:.0}% of the work failed visibly at: {}",
            args.max_failure_share * 100.0,
            failing.join(" ")
        );
    }
    if total.bad() > 0 {
        println!("FAILED: work lost, duplicated, stuck or unreadable (see the counts above)");
    }
    let _ = Keys::generate();
    if total.bad() > 0 || !unreached.is_empty() || !failing.is_empty() {
        std::process::exit(1);
    }
}
