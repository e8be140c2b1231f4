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
use protocol::api::Effect;

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
    /// The turn's messages as one prompt.
    pub fn prompt(&self) -> String {
        self.items
            .iter()
            .map(|i| i.message.content.as_str())
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

    /// Runs a turn; `cancel` fires when a lease is lost (the turn must stop).
    pub async fn run(&self, turn: &Turn, ops: &Ops, cancel: &CancellationToken) -> Outcome {
        match self {
            Handler::Echo => {
                if let Err(e) = ops.record("echo", Effect::Read).await {
                    return Outcome::Retry(format!("recording the operation failed: {e}"));
                }
                Outcome::Delivered(Some(format!("echo: {}", turn.prompt())))
            }
            Handler::Exec {
                command,
                timeout,
                effect,
            } => exec(command, *timeout, *effect, turn, ops, cancel).await,
            Handler::Acp { runner, timeout } => {
                let work = runner.turn(&turn.channel, turn.prompt(), ops.clone());
                tokio::select! {
                    _ = cancel.cancelled() => Outcome::Interrupted("lease lost; turn cancelled".into()),
                    r = tokio::time::timeout(*timeout, work) => match r {
                        Err(_) => Outcome::Interrupted("ACP turn timed out".into()),
                        Ok(Ok(text)) => Outcome::Delivered((!text.trim().is_empty()).then(|| cut(text))),
                        Ok(Err(e)) => Outcome::Interrupted(format!("ACP agent: {e}")),
                    }
                }
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

async fn exec(
    command: &[String],
    timeout: Duration,
    effect: Effect,
    turn: &Turn,
    ops: &Ops,
    cancel: &CancellationToken,
) -> Outcome {
    if let Err(e) = ops.record(&format!("exec:{}", command[0]), effect).await {
        return Outcome::Retry(format!("recording the operation failed: {e}"));
    }
    if let Err(e) = crate::faults::check("handler:after_record") {
        return Outcome::Retry(e);
    }
    let input = json!({
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
        })).collect::<Vec<_>>(),
    });
    let mut child = match tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            return Outcome::Failed {
                code: "handler_failed".into(),
                message: format!("spawn: {e}"),
            }
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.to_string().as_bytes()).await;
    }
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let read_all = async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.take(MAX_REPLY_BYTES as u64 * 4).read_to_end(&mut out).await;
        }
        if let Some(s) = stderr.as_mut() {
            let _ = s.take(16 * 1024).read_to_end(&mut err).await;
        }
        (out, err)
    };
    let waited = async {
        let (out, err) = read_all.await;
        (child.wait().await, out, err)
    };
    let (status, out, err) = tokio::select! {
        _ = cancel.cancelled() => return Outcome::Interrupted("lease lost; turn cancelled".into()),
        r = tokio::time::timeout(timeout, waited) => match r {
            Err(_) => return Outcome::Interrupted(format!("handler timed out after {timeout:?}")),
            Ok(r) => r,
        },
    };
    if let Err(e) = crate::faults::check("handler:after_run") {
        return Outcome::Interrupted(e);
    }
    let stderr_tail = String::from_utf8_lossy(&err)
        .chars()
        .rev()
        .take(500)
        .collect::<String>()
        .chars()
        .rev()
        .collect::<String>();
    match status.map(|s| s.code()) {
        Ok(Some(0)) => {
            let text = cut(String::from_utf8_lossy(&out).trim().to_string());
            Outcome::Delivered((!text.is_empty()).then_some(text))
        }
        Ok(Some(EXIT_RETRY)) => Outcome::Retry(format!("handler asked to retry: {stderr_tail}")),
        Ok(code) => Outcome::Failed {
            code: "handler_failed".into(),
            message: format!("exit {code:?}: {stderr_tail}"),
        },
        Err(e) => Outcome::Interrupted(format!("waiting for the handler: {e}")),
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
