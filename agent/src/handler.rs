//! Handlers: what the agent does with a turn (one or more verified
//! deliveries of one channel). `echo` for demos and tests, `exec` to run a
//! command, `acp` to drive an Agent Client Protocol agent.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nostr::prelude::Event;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::api::{Api, Delivery};
use crate::config::HandlerConfig;
use protocol::api::{DeliverySource, Effect};

/// Longest reply a handler may produce (bytes); longer output is cut.
pub const MAX_REPLY_BYTES: usize = 32 * 1024;
/// Exit status that asks for a retry (sysexits EX_TEMPFAIL).
pub const EXIT_RETRY: i32 = 75;

/// One verified delivery in a turn.
#[derive(Debug, Clone)]
pub struct TurnItem {
    pub delivery: Delivery,
    /// The verified workflow message.
    pub message: Event,
}

/// Work for one channel, handed to the handler at once.
#[derive(Debug, Clone)]
pub struct Turn {
    pub channel: String,
    pub items: Vec<TurnItem>,
}

impl Turn {
    /// The same outcome for every delivery of the turn (a handler that
    /// answers the turn as a whole).
    pub fn same(&self, outcome: Outcome) -> Vec<Outcome> {
        vec![outcome; self.items.len()]
    }

    /// The turn's messages as one prompt; a message whose answer must
    /// have a shape says so after it (a revision message already does).
    pub fn prompt(&self) -> String {
        self.items
            .iter()
            .map(|i| match &i.delivery.output {
                Some(schema) if i.delivery.revision == 0 => format!(
                    "{}\n\nAnswer with one JSON object that fits this JSON Schema:\n{}",
                    i.message.content,
                    schema.to_value()
                ),
                _ => i.message.content.clone(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// What the handler decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done, with an optional reply text.
    Delivered(Option<String>),
    /// Try again later: nothing was done (the handler says so, or it
    /// stopped before any write was recorded).
    Retry(String),
    /// Stopped at an unknown point (timeout, lost lease, broken handler):
    /// a retry if no write was recorded in the turn, else a visible failure.
    Interrupted(String),
    /// Give up, visibly.
    Failed { code: String, message: String },
}

/// Records operations of a turn, on every delivery in it, before they happen.
#[derive(Clone)]
pub struct Ops {
    api: Api,
    items: Vec<(String, String)>,
    /// A write was recorded (so it may have happened): from then on the
    /// turn must not end in a retry, which would run it again.
    wrote: Arc<AtomicBool>,
}

impl Ops {
    pub fn new(api: Api, turn: &Turn) -> Self {
        Self {
            api,
            items: turn
                .items
                .iter()
                .map(|i| (i.delivery.id.clone(), i.delivery.claim_token.clone()))
                .collect(),
            wrote: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether a write was recorded in this turn.
    pub fn wrote(&self) -> bool {
        self.wrote.load(Ordering::SeqCst)
    }

    /// Records `name` with its effect; the caller does the operation only
    /// after this returned `Ok`.
    pub async fn record(&self, name: &str, effect: Effect) -> Result<(), String> {
        for (id, token) in &self.items {
            self.api
                .operation(id, token, name, effect)
                .await
                .map_err(|e| e.to_string())?;
        }
        if effect == Effect::Write {
            self.wrote.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// A configured handler.
pub enum Handler {
    Echo,
    Exec {
        command: Vec<String>,
        timeout: Duration,
        effect: Effect,
    },
    Acp {
        runner: AcpRunner,
        timeout: Duration,
    },
}

impl Handler {
    pub fn new(cfg: &HandlerConfig) -> Self {
        match cfg {
            HandlerConfig::Echo => Handler::Echo,
            HandlerConfig::Exec {
                command,
                timeout_secs,
                effect,
            } => Handler::Exec {
                command: command.clone(),
                timeout: Duration::from_secs(*timeout_secs),
                effect: *effect,
            },
            HandlerConfig::Acp {
                command,
                timeout_secs,
            } => Handler::Acp {
                runner: AcpRunner::spawn(command.clone()),
                timeout: Duration::from_secs(*timeout_secs),
            },
        }
    }

    /// Runs a turn; `cancel` fires when a lease is lost (the turn must
    /// stop). One outcome per delivery of the turn, in its order: each
    /// delivery is finished on its own, so one failure fails no other.
    pub async fn run(&self, turn: &Turn, ops: &Ops, cancel: &CancellationToken) -> Vec<Outcome> {
        match self {
            Handler::Echo => {
                if let Err(e) = ops.record("echo", Effect::Read).await {
                    return turn.same(Outcome::Retry(format!("recording the operation failed: {e}")));
                }
                // Mentions are answered once a turn (one reply to what was
                // said); a workflow's deliveries each get their own.
                let mentions = turn
                    .items
                    .iter()
                    .all(|i| i.delivery.source == DeliverySource::Mention);
                if mentions {
                    let said: Vec<&str> = turn.items.iter().map(|i| i.message.content.as_str()).collect();
                    return turn.same(Outcome::Delivered(Some(format!("echo: {}", said.join("\n")))));
                }
                let echo = |i: &TurnItem| Outcome::Delivered(Some(format!("echo: {}", i.message.content)));
                turn.items.iter().map(echo).collect()
            }
            Handler::Exec {
                command,
                timeout,
                effect,
            } => exec(command, *timeout, *effect, turn, ops, cancel).await,
            Handler::Acp { runner, timeout } => {
                // One prompt, one answer: the turn's deliveries share it.
                let work = runner.turn(&turn.channel, turn.prompt(), ops.clone());
                turn.same(tokio::select! {
                    _ = cancel.cancelled() => Outcome::Interrupted("lease lost; turn cancelled".into()),
                    r = tokio::time::timeout(*timeout, work) => match r {
                        Err(_) => Outcome::Interrupted("ACP turn timed out".into()),
                        Ok(Ok(text)) => Outcome::Delivered((!text.trim().is_empty()).then(|| cut(text))),
                        Ok(Err(e)) => Outcome::Interrupted(format!("ACP agent: {e}")),
                    }
                })
            }
        }
    }
}

fn cut(mut s: String) -> String {
    if s.len() > MAX_REPLY_BYTES {
        let mut end = MAX_REPLY_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Most bytes of a handler's stderr kept in a failure message (its tail).
pub const MAX_STDERR_TAIL_BYTES: usize = 1000;

/// The `exec` handler's per-delivery answer on stdout:
/// `{"results": [{"delivery_id", "outcome", "reply"?, "failure_code"?, "failure_message"?}]}`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecAnswer {
    results: Vec<ExecResult>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecResult {
    delivery_id: String,
    outcome: protocol::api::Outcome,
    #[serde(default)]
    reply: Option<String>,
    #[serde(default)]
    failure_code: Option<String>,
    #[serde(default)]
    failure_message: Option<String>,
}

async fn exec(
    command: &[String],
    timeout: Duration,
    effect: Effect,
    turn: &Turn,
    ops: &Ops,
    cancel: &CancellationToken,
) -> Vec<Outcome> {
    if let Err(e) = ops.record(&format!("exec:{}", command[0]), effect).await {
        return turn.same(Outcome::Retry(format!("recording the operation failed: {e}")));
    }
    if let Err(e) = crate::faults::check("handler:after_record") {
        return turn.same(Outcome::Retry(e));
    }
    let input = exec_input(turn);
    // The command continues the run's trace (W3C `TRACEPARENT`): the first
    // delivery's span; each delivery's own is in its stdin entry.
    let trace = turn.items.first().and_then(|i| i.delivery.traceparent.as_deref());
    let ran = tokio::select! {
        _ = cancel.cancelled() => return turn.same(Outcome::Interrupted("lease lost; turn cancelled".into())),
        r = tokio::time::timeout(timeout, run_command(command, &input, trace)) => match r {
            Err(_) => return turn.same(Outcome::Interrupted(format!("handler timed out after {timeout:?}"))),
            Ok(r) => r,
        },
    };
    if let Err(e) = crate::faults::check("handler:after_run") {
        return turn.same(Outcome::Interrupted(e));
    }
    match ran {
        Ok(ran) => exec_outcomes(turn, &ran),
        Err(outcome) => turn.same(outcome),
    }
}

/// What the `exec` handler reads on stdin: the turn's deliveries.
fn exec_input(turn: &Turn) -> serde_json::Value {
    json!({
        "channel": turn.channel,
        "messages": turn.items.iter().map(|i| json!({
            "delivery_id": i.delivery.id,
            "workflow_id": i.delivery.workflow_id,
            "run_id": i.delivery.run_id,
            "step_id": i.delivery.step_id,
            "attempt": i.delivery.attempt,
            "message_event_id": i.message.id.to_hex(),
            "text": i.message.content,
            "trigger_context": i.delivery.trigger_context,
            "execution_trace": i.delivery.execution_trace,
            "output": i.delivery.output,
            "revision": i.delivery.revision,
            "traceparent": i.delivery.traceparent,
        })).collect::<Vec<_>>(),
    })
}

/// A finished command: its exit status, stdout (bounded) and stderr tail.
struct Ran {
    status: std::process::ExitStatus,
    stdout: Vec<u8>,
    stderr_tail: String,
}

/// Runs the command with `input` on stdin; `Err` is the outcome when it
/// could not run or be waited for.
async fn run_command(
    command: &[String],
    input: &serde_json::Value,
    trace: Option<&str>,
) -> Result<Ran, Outcome> {
    let mut cmd = tokio::process::Command::new(&command[0]);
    if let Some(traceparent) = trace.filter(|t| protocol::trace::TraceParent::parse(t).is_some()) {
        cmd.env("TRACEPARENT", traceparent);
    }
    let mut child = cmd
        .args(&command[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Outcome::Failed {
            code: "handler_failed".into(),
            message: format!("could not start {}: {e}", command[0]),
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.to_string().as_bytes()).await;
    }
    let (mut stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
    let mut out = Vec::new();
    let mut err = Vec::new();
    // Both pipes at once, so a chatty stderr cannot block the child's stdout.
    let read_out = async {
        if let Some(s) = stdout.as_mut() {
            let _ = s.take(MAX_REPLY_BYTES as u64 * 4).read_to_end(&mut out).await;
        }
    };
    let read_err = async {
        if let Some(s) = stderr.as_mut() {
            let _ = s.take(64 * 1024).read_to_end(&mut err).await;
        }
    };
    tokio::join!(read_out, read_err);
    let status = child
        .wait()
        .await
        .map_err(|e| Outcome::Interrupted(format!("waiting for the handler: {e}")))?;
    Ok(Ran {
        status,
        stdout: out,
        stderr_tail: tail(&String::from_utf8_lossy(&err), MAX_STDERR_TAIL_BYTES),
    })
}

/// The last `max` bytes of `s` (at a character boundary), trimmed.
fn tail(s: &str, max: usize) -> String {
    let s = s.trim();
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

/// How the command ended, for a failure message.
fn exit_text(status: std::process::ExitStatus, stderr_tail: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
    let how = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "ended without a status".to_string(),
    };
    if stderr_tail.is_empty() {
        how
    } else {
        format!("{how}: {stderr_tail}")
    }
}

/// The outcomes of a finished command: per delivery when stdout is an
/// [`ExecAnswer`] (whatever the exit status), else one for the whole
/// turn from the exit status (0 delivered with stdout as the reply, 75
/// retry, anything else failed with the stderr tail).
fn exec_outcomes(turn: &Turn, ran: &Ran) -> Vec<Outcome> {
    if let Ok(answer) = serde_json::from_slice::<ExecAnswer>(&ran.stdout) {
        return turn
            .items
            .iter()
            .map(|i| per_delivery(&answer, &i.delivery.id, &ran.stderr_tail))
            .collect();
    }
    turn.same(match ran.status.code() {
        Some(0) => {
            let text = cut(String::from_utf8_lossy(&ran.stdout).trim().to_string());
            Outcome::Delivered((!text.is_empty()).then_some(text))
        }
        Some(EXIT_RETRY) => Outcome::Retry(format!("handler asked to retry: {}", ran.stderr_tail)),
        _ => Outcome::Failed {
            code: "handler_failed".into(),
            message: exit_text(ran.status, &ran.stderr_tail),
        },
    })
}

/// One delivery's outcome from a per-delivery answer; a delivery the
/// answer does not name fails (`no_result`): the handler did not say
/// what it did with it.
fn per_delivery(answer: &ExecAnswer, id: &str, stderr_tail: &str) -> Outcome {
    use protocol::api::Outcome as Wire;
    let Some(r) = answer.results.iter().find(|r| r.delivery_id == id) else {
        return Outcome::Failed {
            code: "no_result".into(),
            message: "the handler's results do not name this delivery".into(),
        };
    };
    let message = || {
        r.failure_message
            .clone()
            .map(|m| tail(&m, MAX_STDERR_TAIL_BYTES))
            .unwrap_or_else(|| stderr_tail.to_string())
    };
    match r.outcome {
        Wire::Delivered => Outcome::Delivered(r.reply.clone().filter(|t| !t.trim().is_empty()).map(cut)),
        Wire::Retry => Outcome::Retry(message()),
        Wire::Failed => Outcome::Failed {
            code: r.failure_code.clone().unwrap_or_else(|| "handler_failed".into()),
            message: message(),
        },
    }
}

/// One turn sent to the ACP connection task.
struct AcpTurn {
    channel: String,
    prompt: String,
    ops: Ops,
    reply: oneshot::Sender<Result<String, String>>,
}

/// Drives one ACP agent process: one session per channel, one prompt per
/// turn, the reply assembled from the streamed message chunks. A tool call
/// the agent asks permission for is recorded (with its effect) through the
/// operations endpoint BEFORE permission is granted; if recording fails the
/// permission is refused.
#[derive(Clone)]
pub struct AcpRunner {
    turns: mpsc::Sender<AcpTurn>,
}

impl AcpRunner {
    pub fn spawn(command: Vec<String>) -> Self {
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(acp_loop(command, rx));
        Self { turns: tx }
    }

    async fn turn(&self, channel: &str, prompt: String, ops: Ops) -> Result<String, String> {
        let (tx, rx) = oneshot::channel();
        let t = AcpTurn {
            channel: channel.to_string(),
            prompt,
            ops,
            reply: tx,
        };
        self.turns
            .send(t)
            .await
            .map_err(|_| "ACP runner stopped".to_string())?;
        rx.await
            .map_err(|_| "ACP connection ended during the turn".to_string())?
    }
}

/// Maps an ACP tool kind to the effect recorded for it.
pub fn effect_of(kind: Option<&agent_client_protocol::v1::schema::ToolKind>) -> Effect {
    use agent_client_protocol::v1::schema::ToolKind;
    match kind {
        Some(ToolKind::Read | ToolKind::Search | ToolKind::Think | ToolKind::Fetch) => Effect::Read,
        _ => Effect::Write,
    }
}

type Shared<T> = Arc<Mutex<HashMap<String, T>>>;

async fn acp_loop(command: Vec<String>, turns: mpsc::Receiver<AcpTurn>) {
    use agent_client_protocol::schema::ProtocolVersion;
    use agent_client_protocol::v1::schema::{
        ContentBlock, InitializeRequest, NewSessionRequest, PermissionOptionKind, PromptRequest,
        RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
        SelectedPermissionOutcome, SessionNotification, SessionUpdate, TextContent,
    };
    use agent_client_protocol::v1::ConnectionTo;
    use agent_client_protocol::{AcpAgent, AcpAgentConfig, Agent, Client};

    let turns = Arc::new(tokio::sync::Mutex::new(turns));
    loop {
        let chunks: Shared<String> = Arc::new(Mutex::new(HashMap::new()));
        let recorders: Shared<Ops> = Arc::new(Mutex::new(HashMap::new()));
        let sessions: Shared<String> = Arc::new(Mutex::new(HashMap::new()));
        let agent = AcpAgent::new(AcpAgentConfig::new(&command[0]).args(command[1..].iter().cloned()));
        let (chunks_n, recorders_r) = (chunks.clone(), recorders.clone());
        let turns_c = turns.clone();
        let result = Client
            .v1()
            .name("relay-agent")
            .on_receive_notification(
                async move |n: SessionNotification, _cx| {
                    if let SessionUpdate::AgentMessageChunk(chunk) = n.update {
                        if let ContentBlock::Text(t) = chunk.content {
                            let mut map = chunks_n.lock().unwrap_or_else(|p| p.into_inner());
                            map.entry(n.session_id.to_string()).or_default().push_str(&t.text);
                        }
                    }
                    Ok(())
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .on_receive_request(
                async move |req: RequestPermissionRequest, responder, _cx| {
                    let ops = recorders_r.lock().unwrap_or_else(|p| p.into_inner()).get(&req.session_id.to_string()).cloned();
                    let name = req.tool_call.fields.title.clone().unwrap_or_else(|| req.tool_call.tool_call_id.to_string());
                    let effect = effect_of(req.tool_call.fields.kind.as_ref());
                    let recorded = match ops {
                        Some(ops) => ops.record(&name, effect).await,
                        None => Err("no turn is running for this session".into()),
                    };
                    let allow = [PermissionOptionKind::AllowOnce, PermissionOptionKind::AllowAlways]
                        .iter()
                        .find_map(|k| req.options.iter().find(|o| o.kind == *k).map(|o| o.option_id.clone()));
                    let outcome = match (recorded, allow) {
                        (Ok(()), Some(id)) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id)),
                        (Err(e), _) => {
                            tracing::warn!(error = %e, tool = %name, "operation not recorded; permission refused");
                            RequestPermissionOutcome::Cancelled
                        }
                        (Ok(()), None) => RequestPermissionOutcome::Cancelled,
                    };
                    responder.respond(RequestPermissionResponse::new(outcome))
                },
                agent_client_protocol::on_receive_request!(),
            )
            .connect_with(agent, async move |cx: ConnectionTo<Agent>| {
                cx.send_request(InitializeRequest::new(ProtocolVersion::V1)).block_task().await?;
                loop {
                    let next = turns_c.lock().await.recv().await;
                    let Some(turn) = next else { return Ok(()) };
                    let cx = cx.clone();
                    let (chunks, recorders, sessions) = (chunks.clone(), recorders.clone(), sessions.clone());
                    cx.clone().spawn(async move {
                        let known = sessions.lock().unwrap_or_else(|p| p.into_inner()).get(&turn.channel).cloned();
                        let session = match known {
                            Some(s) => s,
                            None => {
                                let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
                                match cx.send_request(NewSessionRequest::new(cwd)).block_task().await {
                                    Ok(r) => {
                                        let id = r.session_id.to_string();
                                        sessions.lock().unwrap_or_else(|p| p.into_inner()).insert(turn.channel.clone(), id.clone());
                                        id
                                    }
                                    Err(e) => {
                                        let _ = turn.reply.send(Err(format!("new session: {e}")));
                                        return Ok(());
                                    }
                                }
                            }
                        };
                        recorders.lock().unwrap_or_else(|p| p.into_inner()).insert(session.clone(), turn.ops.clone());
                        chunks.lock().unwrap_or_else(|p| p.into_inner()).insert(session.clone(), String::new());
                        let prompt = PromptRequest::new(session.clone(), vec![ContentBlock::Text(TextContent::new(turn.prompt))]);
                        let r = cx.send_request(prompt).block_task().await;
                        recorders.lock().unwrap_or_else(|p| p.into_inner()).remove(&session);
                        let text = chunks.lock().unwrap_or_else(|p| p.into_inner()).remove(&session).unwrap_or_default();
                        let _ = turn.reply.send(r.map(|_| text).map_err(|e| e.to_string()));
                        Ok(())
                    })?;
                }
            })
            .await;
        match result {
            Ok(()) => return,
            Err(e) => tracing::warn!(error = %e, "ACP agent connection ended; restarting it"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind};
    use std::os::unix::process::ExitStatusExt;

    fn turn(ids: &[&str]) -> Turn {
        let keys = Keys::generate();
        let item = |id: &&str| TurnItem {
            delivery: Delivery {
                id: id.to_string(),
                workflow_id: "w".into(),
                run_id: "r".into(),
                step_id: "s".into(),
                definition_event_id: String::new(),
                message_event_id: String::new(),
                channel: "ops".into(),
                target_pubkey: String::new(),
                attempt: 1,
                claim_token: "t".into(),
                claim_expires_at: 0,
                expires_at: 0,
                trigger_context: json!({}),
                execution_trace: json!([]),
                output: None,
                revision: 0,
                traceparent: None,
                source: Default::default(),
                conversation: String::new(),
                turn: Vec::new(),
            },
            message: EventBuilder::new(Kind::from_u16(9), format!("msg {id}"))
                .finalize(&keys)
                .unwrap(),
        };
        Turn {
            channel: "ops".into(),
            items: ids.iter().map(item).collect(),
        }
    }

    fn ran(code: i32, stdout: &str, stderr: &str) -> Ran {
        Ran {
            status: std::process::ExitStatus::from_raw(code << 8),
            stdout: stdout.as_bytes().to_vec(),
            stderr_tail: tail(stderr, MAX_STDERR_TAIL_BYTES),
        }
    }

    #[test]
    fn a_per_delivery_answer_gives_each_delivery_its_own_outcome() {
        let t = turn(&["a", "b", "c", "d"]);
        let answer = json!({"results": [
            {"delivery_id": "a", "outcome": "delivered", "reply": "done a"},
            {"delivery_id": "b", "outcome": "failed", "failure_code": "webhook_refused", "failure_message": "503 from upstream"},
            {"delivery_id": "c", "outcome": "retry"}]});
        // Whatever the exit status: the answer says what happened to each.
        for code in [0, 1] {
            let got = exec_outcomes(&t, &ran(code, &answer.to_string(), "c: busy"));
            assert_eq!(
                got,
                vec![
                    Outcome::Delivered(Some("done a".into())),
                    Outcome::Failed {
                        code: "webhook_refused".into(),
                        message: "503 from upstream".into()
                    },
                    Outcome::Retry("c: busy".into()),
                    Outcome::Failed {
                        code: "no_result".into(),
                        message: "the handler's results do not name this delivery".into()
                    },
                ]
            );
        }
    }

    #[test]
    fn a_plain_exit_status_answers_the_whole_turn() {
        let t = turn(&["a", "b"]);
        assert_eq!(
            exec_outcomes(&t, &ran(0, "hello\n", "")),
            t.same(Outcome::Delivered(Some("hello".into())))
        );
        assert_eq!(
            exec_outcomes(&t, &ran(0, "", "")),
            t.same(Outcome::Delivered(None))
        );
        assert_eq!(
            exec_outcomes(&t, &ran(EXIT_RETRY, "", "later")),
            t.same(Outcome::Retry("handler asked to retry: later".into()))
        );
        let long = format!("{}the end", "x".repeat(5000));
        let got = exec_outcomes(&t, &ran(3, "{\"not\": \"results\"}", &long));
        let Outcome::Failed { code, message } = &got[0] else {
            panic!("{got:?}")
        };
        assert_eq!(code, "handler_failed");
        assert!(
            message.starts_with("exit status 3: x") && message.ends_with("the end"),
            "{message}"
        );
        assert!(
            message.len() <= MAX_STDERR_TAIL_BYTES + 20,
            "bounded: {}",
            message.len()
        );
        let killed = Ran {
            status: std::process::ExitStatus::from_raw(9),
            stdout: Vec::new(),
            stderr_tail: String::new(),
        };
        assert_eq!(
            exec_outcomes(&t, &killed)[1],
            Outcome::Failed {
                code: "handler_failed".into(),
                message: "killed by signal 9".into()
            }
        );
    }
}
