//! Workflow definitions (kind 30620) and the tags of the messages and wake
//! hints a workflow produces (docs/protocol.md, "Workflows"). Shared by the
//! relay (which validates and executes) and the agent (which verifies).

use nostr::prelude::{Event, PublicKey, Tag};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::CauseKind;
use crate::condition::{Condition, StepShape, Ty};
use crate::template::{Template, TemplateError};

/// Kind of a workflow definition.
pub const DEFINITION_KIND: u16 = 30620;
/// Kind of a workflow message (NIP-29 chat message).
pub const MESSAGE_KIND: u16 = 9;
/// Value of the `workflow` tag of workflow messages.
pub const MESSAGE_VERSION: &str = "message-v1";
/// Shortest schedule interval.
pub const MIN_INTERVAL_SECS: u64 = 60;
/// Longest schedule interval (a year).
pub const MAX_INTERVAL_SECS: u64 = 366 * 24 * 3600;
/// Most steps in one workflow.
pub const MAX_STEPS: usize = 32;

/// A definition's JSON content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default = "yes")]
    pub enabled: bool,
    pub trigger: Trigger,
    pub steps: Vec<Step>,
}

fn yes() -> bool {
    true
}

/// What starts a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "on", rename_all = "snake_case", deny_unknown_fields)]
pub enum Trigger {
    MessagePosted {
        #[serde(default)]
        filter: MessageFilter,
    },
    Webhook,
    /// Every `interval_secs`, or at each slot of `cron` (five fields) in
    /// `timezone` (IANA, default UTC): exactly one of the two.
    Schedule {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interval_secs: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cron: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timezone: Option<String>,
    },
    Manual,
    /// A NIP-25 reaction (kind 7) in the channel on a message of the channel.
    ReactionAdded {
        #[serde(default)]
        filter: ReactionFilter,
    },
}

impl Trigger {
    /// The stored name of the trigger type.
    pub fn name(&self) -> &'static str {
        match self {
            Trigger::MessagePosted { .. } => "message_posted",
            Trigger::Webhook => "webhook",
            Trigger::Schedule { .. } => "schedule",
            Trigger::Manual => "manual",
            Trigger::ReactionAdded { .. } => "reaction_added",
        }
    }

    /// Whether a channel event (a message, a reaction) fires this trigger:
    /// its filter matches (the caller knows whether the author is an agent).
    /// Triggers that no event fires never match.
    pub fn matches_event(&self, content: &str, author: &PublicKey, author_is_agent: bool) -> bool {
        match self {
            Trigger::MessagePosted { filter } => filter.matches(content, author, author_is_agent),
            Trigger::ReactionAdded { filter } => filter.matches(content, author, author_is_agent),
            _ => false,
        }
    }
}

/// Which posted messages fire a `message_posted` workflow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageFilter {
    /// Case-insensitive substring of the message text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_contains: Option<String>,
    /// Hex pubkeys whose messages count (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authors: Option<Vec<String>>,
    /// Whether messages by managed agents count (they do not by default, so
    /// that an agent's reply cannot loop).
    #[serde(default)]
    pub include_agents: bool,
}

impl MessageFilter {
    /// Whether a message matches (the caller knows whether its author is an agent).
    pub fn matches(&self, text: &str, author: &PublicKey, author_is_agent: bool) -> bool {
        let text_counts = self
            .text_contains
            .as_ref()
            .is_none_or(|needle| text.to_lowercase().contains(&needle.to_lowercase()));
        text_counts
            && author_counts(
                self.authors.as_deref(),
                self.include_agents,
                author,
                author_is_agent,
            )
    }
}

/// Which reactions fire a `reaction_added` workflow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReactionFilter {
    /// Reaction contents that count, compared exactly (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<String>>,
    /// Hex pubkeys whose reactions count (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authors: Option<Vec<String>>,
    /// Whether reactions by managed agents count (they do not by default,
    /// so that an agent reacting to a workflow's message cannot loop).
    #[serde(default)]
    pub include_agents: bool,
}

/// Most values in a filter's `content` or `authors` list.
pub const MAX_FILTER_VALUES: usize = 64;

impl ReactionFilter {
    /// Whether a reaction matches (the caller knows whether its author is an agent).
    pub fn matches(&self, content: &str, author: &PublicKey, author_is_agent: bool) -> bool {
        let content_counts = self
            .content
            .as_ref()
            .is_none_or(|list| list.iter().any(|c| c == content));
        content_counts
            && author_counts(
                self.authors.as_deref(),
                self.include_agents,
                author,
                author_is_agent,
            )
    }
}

/// Whether a filter's author rules let `author` through: agents only with
/// `include_agents`, and only listed `authors` when there is a list.
fn author_counts(
    authors: Option<&[String]>,
    include_agents: bool,
    author: &PublicKey,
    is_agent: bool,
) -> bool {
    if is_agent && !include_agents {
        return false;
    }
    let hex = author.to_hex();
    authors.is_none_or(|list| list.iter().any(|a| a.eq_ignore_ascii_case(&hex)))
}

/// Shortest and longest wait of an `ask_agent` step, and its default.
pub const ASK_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 60..=604_800;
pub const DEFAULT_ASK_TIMEOUT_SECS: u64 = 3600;
/// Shortest and longest `delay`.
pub const DELAY_SECS: std::ops::RangeInclusive<u64> = 1..=2_592_000;
/// Shortest and longest wait for an approval, and its default.
pub const APPROVAL_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 60..=2_592_000;
pub const DEFAULT_APPROVAL_TIMEOUT_SECS: u64 = 86_400;
/// Most approvers named by one step (the owner is always one more).
pub const MAX_APPROVERS: usize = 32;
/// Shortest and longest webhook call, and its default.
pub const WEBHOOK_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 1..=60;
pub const DEFAULT_WEBHOOK_TIMEOUT_SECS: u64 = 10;
/// Longest webhook URL.
pub const MAX_URL_BYTES: usize = 2048;

/// One step. Every step may carry `"if"`, a condition (CEL) that skips it
/// when false.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Posts the rendered text; managed-agent recipients get deliveries.
    SendMessage {
        id: String,
        text: String,
        #[serde(default)]
        reply_in_thread: bool,
        #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
        condition: Option<String>,
    },
    /// As `send_message`, then the run waits for the deliveries' replies.
    AskAgent {
        id: String,
        text: String,
        #[serde(default)]
        reply_in_thread: bool,
        #[serde(default)]
        wait: Wait,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_secs: Option<u64>,
        #[serde(default)]
        on_failure: OnFailure,
        #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
        condition: Option<String>,
    },
    /// The run waits `secs`, durably.
    Delay {
        id: String,
        secs: u64,
        #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
        condition: Option<String>,
    },
    /// Posts the rendered text as an approval request; the run waits for
    /// the first decision (a NIP-25 reaction) by an approver.
    RequestApproval {
        id: String,
        text: String,
        /// Hex pubkeys that may decide, besides the owner.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        approvers: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_secs: Option<u64>,
        #[serde(default)]
        on_deny: OnFailure,
        #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
        condition: Option<String>,
    },
    /// An outbound HTTP call to a fixed URL.
    CallWebhook {
        id: String,
        url: String,
        #[serde(default)]
        method: HttpMethod,
        /// A JSON value whose strings are templates (a string that is one
        /// placeholder alone becomes the value it names), or one template
        /// string whose rendering must be JSON.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<Value>,
        /// Name of an owner secret: the body's HMAC-SHA256 is sent with it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_secs: Option<u64>,
        /// Whether a call interrupted by a crash is sent again.
        #[serde(default)]
        retry: bool,
        #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
        condition: Option<String>,
    },
}

/// The method of a `call_webhook` step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    #[default]
    Post,
    Put,
}

impl HttpMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
        }
    }
}

/// Which replies an `ask_agent` step waits for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Wait {
    /// Every delivery ends.
    #[default]
    All,
    /// One delivery is delivered (the others are then cancelled).
    Any,
}

/// What a step that did not succeed does to its run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// The run fails.
    #[default]
    Fail,
    /// The run goes on; the step's output says what happened.
    Continue,
}

/// The wire name of a step's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    SendMessage,
    AskAgent,
    Delay,
    RequestApproval,
    CallWebhook,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::SendMessage => "send_message",
            Action::AskAgent => "ask_agent",
            Action::Delay => "delay",
            Action::RequestApproval => "request_approval",
            Action::CallWebhook => "call_webhook",
        }
    }

    /// The fields of this action's output, for conditions.
    pub fn output_fields(self) -> &'static [(&'static str, Ty)] {
        match self {
            Action::SendMessage => &[("event_id", Ty::String), ("text", Ty::String)],
            Action::AskAgent => &[
                ("event_id", Ty::String),
                ("status", Ty::String),
                ("reply", Ty::String),
                ("replies", Ty::List),
            ],
            Action::Delay => &[("until", Ty::Int)],
            Action::RequestApproval => &[
                ("decision", Ty::String),
                ("by", Ty::String),
                ("event_id", Ty::String),
            ],
            Action::CallWebhook => &[("status", Ty::Int), ("body", Ty::Dyn)],
        }
    }
}

impl Step {
    pub fn id(&self) -> &str {
        match self {
            Step::SendMessage { id, .. }
            | Step::AskAgent { id, .. }
            | Step::Delay { id, .. }
            | Step::RequestApproval { id, .. }
            | Step::CallWebhook { id, .. } => id,
        }
    }

    pub fn action(&self) -> Action {
        match self {
            Step::SendMessage { .. } => Action::SendMessage,
            Step::AskAgent { .. } => Action::AskAgent,
            Step::Delay { .. } => Action::Delay,
            Step::RequestApproval { .. } => Action::RequestApproval,
            Step::CallWebhook { .. } => Action::CallWebhook,
        }
    }

    /// What later steps' conditions may read of this one.
    pub fn shape(&self) -> StepShape<'_> {
        StepShape {
            id: self.id(),
            fields: self.action().output_fields(),
        }
    }

    /// The step's condition, if it has one.
    pub fn condition(&self) -> Option<&str> {
        match self {
            Step::SendMessage { condition, .. }
            | Step::AskAgent { condition, .. }
            | Step::Delay { condition, .. }
            | Step::RequestApproval { condition, .. }
            | Step::CallWebhook { condition, .. } => condition.as_deref(),
        }
    }

    /// The message template of a step that posts one (`send_message`,
    /// `ask_agent`), with whether it replies in thread.
    pub fn message(&self) -> Option<(&str, bool)> {
        match self {
            Step::SendMessage {
                text,
                reply_in_thread,
                ..
            }
            | Step::AskAgent {
                text,
                reply_in_thread,
                ..
            } => Some((text, *reply_in_thread)),
            _ => None,
        }
    }

    /// The text template of a step that posts a kind 9 (`send_message`,
    /// `ask_agent`, `request_approval`).
    pub fn text(&self) -> Option<&str> {
        match self {
            Step::SendMessage { text, .. }
            | Step::AskAgent { text, .. }
            | Step::RequestApproval { text, .. } => Some(text),
            _ => None,
        }
    }
}

/// Why a definition is invalid (the text follows `OK false invalid:`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    #[error("definition content is not valid JSON for a workflow: {0}")]
    Json(String),
    #[error("definition needs exactly one d tag (the workflow id, [a-z0-9_-]{{1,64}})")]
    BadId,
    #[error("definition needs exactly one h tag (the channel)")]
    BadChannel,
    #[error("name must be 1 to 200 characters")]
    BadName,
    #[error("a workflow needs 1 to {MAX_STEPS} steps")]
    StepCount,
    #[error("step id {0:?} must be [a-z0-9_-]{{1,64}} and unique")]
    BadStepId(String),
    #[error("step {step}: text: {error}")]
    Template { step: String, error: TemplateError },
    #[error("step {step}: {error}")]
    StepJson { step: String, error: String },
    #[error("step {step}: {field}: {why}")]
    StepField {
        step: String,
        field: &'static str,
        why: String,
    },
    #[error("schedule interval_secs must be between {MIN_INTERVAL_SECS} and {MAX_INTERVAL_SECS}")]
    BadInterval,
    #[error("a schedule needs interval_secs or cron (not both); timezone goes with cron")]
    ScheduleShape,
    #[error("schedule: {0}")]
    Schedule(#[from] crate::schedule::ScheduleError),
    #[error("filter.authors must be at most {MAX_FILTER_VALUES} 64-character hex pubkeys")]
    BadAuthors,
    #[error("filter.content must list 1 to {MAX_FILTER_VALUES} reaction contents")]
    BadReactionContent,
    #[error("filter.text_contains must not be empty")]
    EmptyTextFilter,
}

/// Whether `s` is a workflow, step or secret name: `[a-z0-9_-]{1,64}`.
pub fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn single_tag<'e>(event: &'e Event, name: &str) -> Option<&'e str> {
    let mut it = event.tags.iter().filter(|t| t.kind() == name);
    let first = it.next()?.content()?;
    it.next().is_none().then_some(first)
}

/// A validated definition with its ids.
#[derive(Debug, Clone)]
pub struct Validated {
    pub workflow_id: String,
    pub channel: String,
    pub definition: Definition,
    /// Parsed templates, by step index (`None` for a step that posts no message).
    pub templates: Vec<Option<Template>>,
}

/// Validates a kind 30620 event (tags and content).
pub fn validate(event: &Event) -> Result<Validated, DefinitionError> {
    let workflow_id = single_tag(event, "d")
        .filter(|d| valid_id(d))
        .ok_or(DefinitionError::BadId)?;
    let channel = single_tag(event, "h")
        .filter(|h| !h.is_empty())
        .ok_or(DefinitionError::BadChannel)?;
    let definition = parse(&event.content)?;
    let templates = check(&definition)?;
    Ok(Validated {
        workflow_id: workflow_id.to_string(),
        channel: channel.to_string(),
        definition,
        templates,
    })
}

/// Parses a definition's content. A step whose JSON is wrong is named,
/// with the field when one is at fault.
pub fn parse(content: &str) -> Result<Definition, DefinitionError> {
    let raw: Value = serde_json::from_str(content).map_err(|e| DefinitionError::Json(e.to_string()))?;
    let steps = raw
        .get("steps")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, v) in steps.iter().enumerate() {
        precheck_step(i, v)?;
    }
    serde_json::from_value(raw).map_err(|e| {
        let named = steps.iter().enumerate().find_map(|(i, v)| {
            let err = serde_json::from_value::<Step>(v.clone()).err()?;
            Some(DefinitionError::StepJson {
                step: step_name(i, v),
                error: err.to_string(),
            })
        });
        named.unwrap_or_else(|| DefinitionError::Json(e.to_string()))
    })
}

/// How an error names a step: its id, else its position.
fn step_name(i: usize, v: &Value) -> String {
    v.get("id")
        .and_then(Value::as_str)
        .map_or_else(|| format!("#{}", i + 1), str::to_string)
}

/// Checks the fields whose serde error would not name them.
fn precheck_step(i: usize, v: &Value) -> Result<(), DefinitionError> {
    let bad = |field: &'static str, why: &str| {
        Err(DefinitionError::StepField {
            step: step_name(i, v),
            field,
            why: why.to_string(),
        })
    };
    for (field, allowed) in [
        ("wait", ["all", "any"]),
        ("on_failure", ["fail", "continue"]),
        ("on_deny", ["fail", "continue"]),
        ("method", ["POST", "PUT"]),
    ] {
        if let Some(x) = v.get(field) {
            if !x.as_str().is_some_and(|x| allowed.contains(&x)) {
                return bad(
                    field,
                    &format!("must be \"{}\" or \"{}\"", allowed[0], allowed[1]),
                );
            }
        }
    }
    for field in ["timeout_secs", "secs"] {
        if v.get(field).is_some_and(|x| x.as_u64().is_none()) {
            return bad(field, "must be a whole number of seconds");
        }
    }
    if v.get("if").is_some_and(|x| !x.is_string()) {
        return bad("if", "must be a string (a CEL expression)");
    }
    if v.get("retry").is_some_and(|x| !x.is_boolean()) {
        return bad("retry", "must be true or false");
    }
    Ok(())
}

/// Checks a trigger's own fields.
fn check_trigger(trigger: &Trigger) -> Result<(), DefinitionError> {
    match trigger {
        Trigger::Schedule {
            interval_secs,
            cron,
            timezone,
        } => match (interval_secs, cron) {
            (Some(secs), None) if timezone.is_none() => {
                if !(MIN_INTERVAL_SECS..=MAX_INTERVAL_SECS).contains(secs) {
                    return Err(DefinitionError::BadInterval);
                }
            }
            (None, Some(expr)) => {
                crate::schedule::Cron::parse(expr, timezone.as_deref())?;
            }
            _ => return Err(DefinitionError::ScheduleShape),
        },
        Trigger::MessagePosted { filter } => {
            if filter.text_contains.as_deref() == Some("") {
                return Err(DefinitionError::EmptyTextFilter);
            }
            check_authors(filter.authors.as_deref())?;
        }
        Trigger::ReactionAdded { filter } => {
            check_authors(filter.authors.as_deref())?;
            if let Some(content) = &filter.content {
                if content.is_empty() || content.len() > MAX_FILTER_VALUES {
                    return Err(DefinitionError::BadReactionContent);
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Checks a filter's `authors`: hex pubkeys, at most [`MAX_FILTER_VALUES`].
fn check_authors(authors: Option<&[String]>) -> Result<(), DefinitionError> {
    let Some(authors) = authors else { return Ok(()) };
    let valid = authors.len() <= MAX_FILTER_VALUES && authors.iter().all(|a| is_hex_pubkey(a));
    if valid {
        Ok(())
    } else {
        Err(DefinitionError::BadAuthors)
    }
}

/// Whether `s` is a 64-character hex public key.
pub fn is_hex_pubkey(s: &str) -> bool {
    s.len() == 64 && PublicKey::from_hex(s).is_ok()
}

/// Checks a parsed definition; returns its templates (by step index, for
/// the steps that post a message).
pub fn check(d: &Definition) -> Result<Vec<Option<Template>>, DefinitionError> {
    let name_chars = d.name.chars().count();
    if name_chars == 0 || name_chars > 200 {
        return Err(DefinitionError::BadName);
    }
    if d.steps.is_empty() || d.steps.len() > MAX_STEPS {
        return Err(DefinitionError::StepCount);
    }
    check_trigger(&d.trigger)?;
    let mut earlier: Vec<StepShape<'_>> = Vec::new();
    let mut templates = Vec::with_capacity(d.steps.len());
    for step in &d.steps {
        let id = step.id();
        if !valid_id(id) || earlier.iter().any(|s| s.id == id) {
            return Err(DefinitionError::BadStepId(id.to_string()));
        }
        templates.push(check_step(step, &earlier)?);
        earlier.push(step.shape());
    }
    Ok(templates)
}

/// Checks one step against the steps before it; returns its template.
fn check_step(step: &Step, earlier: &[StepShape<'_>]) -> Result<Option<Template>, DefinitionError> {
    let id = step.id();
    let field = |field: &'static str, why: String| DefinitionError::StepField {
        step: id.to_string(),
        field,
        why,
    };
    if let Some(src) = step.condition() {
        Condition::compile(src, earlier).map_err(|e| field("if", e.to_string()))?;
    }
    let template = match step.text() {
        Some(text) => {
            let ids: Vec<&str> = earlier.iter().map(|s| s.id).collect();
            let t = Template::parse(text)
                .and_then(|t| t.check(&ids).map(|_| t))
                .map_err(|error| DefinitionError::Template {
                    step: id.to_string(),
                    error,
                })?;
            Some(t)
        }
        None => None,
    };
    match step {
        Step::AskAgent { timeout_secs, .. } => {
            check_range(*timeout_secs, ASK_TIMEOUT_SECS).map_err(|w| field("timeout_secs", w))?;
            if template
                .as_ref()
                .is_some_and(|t| crate::template::mentions(t).is_empty())
            {
                let why = "must mention at least one agent (nostr:npub1… or nostr:nprofile1…)";
                return Err(field("text", why.to_string()));
            }
        }
        Step::Delay { secs, .. } if !DELAY_SECS.contains(secs) => {
            let (lo, hi) = DELAY_SECS.into_inner();
            return Err(field("secs", format!("{secs} is not from {lo} to {hi}")));
        }
        Step::RequestApproval {
            approvers,
            timeout_secs,
            ..
        } => {
            check_range(*timeout_secs, APPROVAL_TIMEOUT_SECS).map_err(|w| field("timeout_secs", w))?;
            if approvers.len() > MAX_APPROVERS || !approvers.iter().all(|a| is_hex_pubkey(a)) {
                let why = format!("must be at most {MAX_APPROVERS} 64-character hex pubkeys");
                return Err(field("approvers", why));
            }
        }
        Step::CallWebhook {
            url,
            body,
            secret,
            timeout_secs,
            ..
        } => {
            check_range(*timeout_secs, WEBHOOK_TIMEOUT_SECS).map_err(|w| field("timeout_secs", w))?;
            crate::webhook::check_url(url).map_err(|w| field("url", w))?;
            if secret.as_deref().is_some_and(|s| !valid_id(s)) {
                return Err(field("secret", "must be a name [a-z0-9_-]{1,64}".into()));
            }
            if let Some(body) = body {
                let ids: Vec<&str> = earlier.iter().map(|s| s.id).collect();
                crate::webhook::check_body(body, &ids).map_err(|w| field("body", w))?;
            }
        }
        _ => {}
    }
    Ok(template)
}

/// Checks an optional whole number of seconds against its range.
fn check_range(value: Option<u64>, range: std::ops::RangeInclusive<u64>) -> Result<(), String> {
    match value {
        Some(t) if !range.contains(&t) => {
            let (lo, hi) = range.into_inner();
            Err(format!("{t} is not from {lo} to {hi}"))
        }
        _ => Ok(()),
    }
}

/// What caused a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    /// `event`, `webhook`, `schedule` or `manual`.
    #[serde(rename = "type")]
    pub kind: CauseKind,
    /// Trigger event id, webhook request id, schedule slot, or manual request id.
    pub id: String,
}

/// Everything that identifies one workflow message.
#[derive(Debug, Clone)]
pub struct MessageBinding<'a> {
    pub channel: &'a str,
    pub definition_event_id: &'a str,
    pub step_id: &'a str,
    pub run_id: &'a str,
    pub owner: &'a PublicKey,
    pub cause: &'a Cause,
    pub recipients: &'a [PublicKey],
    /// Trigger event to thread under (NIP-10), when the step replies in thread.
    pub reply_to: Option<&'a str>,
}

/// The exact tags of a workflow message (docs/protocol.md, "The workflow message").
pub fn message_tags(b: &MessageBinding<'_>) -> Vec<Tag> {
    let mut tags = vec![
        Tag::custom("h", [b.channel]),
        Tag::custom("workflow-definition", [b.definition_event_id, b.step_id]),
        Tag::custom("workflow-run", [b.run_id]),
        Tag::custom("workflow-step", [b.step_id]),
        Tag::custom("workflow-owner", [b.owner.to_hex()]),
        Tag::custom("workflow-cause", [b.cause.kind.as_str(), b.cause.id.as_str()]),
    ];
    for p in b.recipients {
        tags.push(Tag::custom("p", [p.to_hex()]));
    }
    if let Some(e) = b.reply_to {
        tags.push(Tag::custom("e", [e, "", "root"]));
    }
    tags.push(Tag::custom("workflow", [MESSAGE_VERSION]));
    tags
}

/// Recipients of a step: the owner, then every literal mention, once each.
pub fn recipients(owner: &PublicKey, template: &Template) -> Vec<PublicKey> {
    let mut out = vec![*owner];
    for pk in crate::template::mentions(template) {
        if !out.contains(&pk) {
            out.push(pk);
        }
    }
    out
}

/// Tag values of an event by name (first value of each).
pub fn tag_values<'e>(event: &'e Event, name: &str) -> Vec<&'e str> {
    event
        .tags
        .iter()
        .filter(|t| t.kind() == name)
        .filter_map(|t| t.content())
        .collect()
}

/// The whole tag by name (first one), as a slice.
pub fn tag_slice<'e>(event: &'e Event, name: &str) -> Option<&'e [String]> {
    event.tags.iter().find(|t| t.kind() == name).map(|t| t.as_slice())
}

/// Tags of a wake hint (kind 24620, docs/protocol.md, "Wake hints").
pub fn wake_tags(
    target: &PublicKey,
    channel: &str,
    delivery_id: &str,
    definition_event_id: &str,
    run_id: &str,
    step_id: &str,
    message_event_id: &str,
) -> Vec<Tag> {
    vec![
        Tag::custom("p", [target.to_hex()]),
        Tag::custom("h", [channel]),
        Tag::custom("delivery", [delivery_id]),
        Tag::custom("workflow-definition", [definition_event_id]),
        Tag::custom("workflow-run", [run_id]),
        Tag::custom("workflow-step", [step_id]),
        Tag::custom("e", [message_event_id]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind};
    use serde_json::json;

    fn def_event(content: &serde_json::Value, tags: &[(&str, &str)]) -> Event {
        let tags: Vec<Tag> = tags.iter().map(|(k, v)| Tag::custom(*k, [*v])).collect();
        EventBuilder::new(Kind::from_u16(DEFINITION_KIND), content.to_string())
            .tags(tags)
            .finalize(&Keys::generate())
            .unwrap()
    }

    fn good() -> serde_json::Value {
        json!({"name": "triage", "trigger": {"on": "message_posted", "filter": {"text_contains": "help"}},
               "steps": [{"id": "ask", "action": "send_message", "text": "Look at {{trigger.text}}"},
                         {"id": "after", "action": "send_message", "text": "done {{steps.ask.output.event_id}}"}]})
    }

    #[test]
    fn validates_a_good_definition() {
        let v = validate(&def_event(&good(), &[("d", "triage"), ("h", "ops")])).unwrap();
        assert_eq!(v.workflow_id, "triage");
        assert_eq!(v.channel, "ops");
        assert!(v.definition.enabled);
        for trig in [
            json!({"on": "webhook"}),
            json!({"on": "manual"}),
            json!({"on": "schedule", "interval_secs": 60}),
            json!({"on": "schedule", "cron": "0 9 * * mon-fri", "timezone": "Europe/Berlin"}),
            json!({"on": "schedule", "cron": "*/5 * * * *"}),
        ] {
            let mut d = good();
            d["trigger"] = trig;
            assert!(validate(&def_event(&d, &[("d", "w"), ("h", "c")])).is_ok());
        }
    }

    #[test]
    fn names_each_invalid_case() {
        let tags = [("d", "w"), ("h", "c")];
        let bad = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut d = good();
            f(&mut d);
            validate(&def_event(&d, &tags)).unwrap_err()
        };
        assert!(matches!(
            bad(&|d| d["name"] = json!("")),
            DefinitionError::BadName
        ));
        assert!(matches!(
            bad(&|d| d["steps"] = json!([])),
            DefinitionError::StepCount
        ));
        assert!(matches!(
            bad(&|d| d["trigger"] = json!({"on": "schedule", "interval_secs": 59})),
            DefinitionError::BadInterval
        ));
        for shape in [
            json!({"on": "schedule"}),
            json!({"on": "schedule", "interval_secs": 60, "cron": "* * * * *"}),
            json!({"on": "schedule", "interval_secs": 60, "timezone": "UTC"}),
        ] {
            assert!(matches!(
                bad(&|d| d["trigger"] = shape.clone()),
                DefinitionError::ScheduleShape
            ));
        }
        assert!(matches!(
            bad(&|d| d["trigger"] =
                json!({"on": "schedule", "cron": "0 9 * * *", "timezone": "Mars/Olympus"})),
            DefinitionError::Schedule(crate::schedule::ScheduleError::BadZone(_))
        ));
        assert!(matches!(
            bad(&|d| d["trigger"] = json!({"on": "schedule", "cron": "0 0 9 * * *"})),
            DefinitionError::Schedule(crate::schedule::ScheduleError::BadCron(_))
        ));
        assert!(matches!(
            bad(&|d| d["trigger"] = json!({"on": "telepathy"})),
            DefinitionError::Json(_)
        ));
        assert!(matches!(
            bad(&|d| d["extra"] = json!(1)),
            DefinitionError::Json(_)
        ));
        assert!(matches!(
            bad(&|d| d["steps"][1]["id"] = json!("ask")),
            DefinitionError::BadStepId(_)
        ));
        assert!(matches!(
            bad(&|d| d["steps"][0]["id"] = json!("Bad Id")),
            DefinitionError::BadStepId(_)
        ));
        assert!(matches!(
            bad(&|d| d["steps"][0]["action"] = json!("launch_missiles")),
            DefinitionError::StepJson { step, .. } if step == "ask"
        ));
        assert!(matches!(
            bad(&|d| d["steps"][0]["text"] = json!("{{trigger.secret}}")),
            DefinitionError::Template { .. }
        ));
        // A step may only use outputs of earlier steps.
        assert!(matches!(
            bad(&|d| d["steps"][0]["text"] = json!("{{steps.after.output.x}}")),
            DefinitionError::Template { .. }
        ));
        assert!(matches!(
            bad(&|d| d["trigger"]["filter"]["authors"] = json!(["nope"])),
            DefinitionError::BadAuthors
        ));
        assert!(matches!(
            bad(&|d| d["trigger"]["filter"]["text_contains"] = json!("")),
            DefinitionError::EmptyTextFilter
        ));
        assert!(matches!(
            validate(&def_event(&good(), &[("h", "c")])),
            Err(DefinitionError::BadId)
        ));
        assert!(matches!(
            validate(&def_event(&good(), &[("d", "w")])),
            Err(DefinitionError::BadChannel)
        ));
        assert!(matches!(
            validate(&def_event(&good(), &[("d", "w"), ("h", "a"), ("h", "b")])),
            Err(DefinitionError::BadChannel)
        ));
        assert!(matches!(
            validate(&def_event(&json!("not an object"), &tags)),
            Err(DefinitionError::Json(_))
        ));
    }

    #[test]
    fn v2_steps_validate_with_the_step_and_field_named() {
        let agent = Keys::generate().public_key();
        let npub = nostr::prelude::ToBech32::to_bech32(&agent).unwrap();
        let v2 = || {
            json!({"name": "v2", "trigger": {"on": "manual"}, "steps": [
                {"id": "triage", "action": "ask_agent", "text": format!("nostr:{npub} triage {{{{trigger.text}}}}"),
                 "wait": "any", "timeout_secs": 600, "on_failure": "continue"},
                {"id": "pause", "action": "delay", "secs": 5, "if": "steps.triage.output.status == 'delivered'"},
                {"id": "page", "action": "send_message", "text": "urgent: {{steps.triage.output.reply}}",
                 "if": "steps.triage.output.reply.startsWith('urgent')"}]})
        };
        let v = validate(&def_event(&v2(), &[("d", "w"), ("h", "c")])).unwrap();
        assert_eq!(v.templates.iter().filter(|t| t.is_some()).count(), 2);
        assert!(matches!(
            &v.definition.steps[0],
            Step::AskAgent {
                wait: Wait::Any,
                on_failure: OnFailure::Continue,
                ..
            }
        ));
        let refused = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut d = v2();
            f(&mut d);
            validate(&def_event(&d, &[("d", "w"), ("h", "c")]))
                .unwrap_err()
                .to_string()
        };
        for (change, want) in [
            (
                json!({"0": {"wait": "most"}}),
                "step triage: wait: must be \"all\" or \"any\"",
            ),
            (
                json!({"0": {"on_failure": "retry"}}),
                "step triage: on_failure: must be",
            ),
            (
                json!({"0": {"timeout_secs": 59}}),
                "step triage: timeout_secs: 59 is not from 60 to 604800",
            ),
            (
                json!({"0": {"timeout_secs": "soon"}}),
                "step triage: timeout_secs: must be a whole number",
            ),
            (
                json!({"0": {"text": "nobody to ask"}}),
                "step triage: text: must mention at least one agent",
            ),
            (
                json!({"1": {"secs": 0}}),
                "step pause: secs: 0 is not from 1 to 2592000",
            ),
            (json!({"1": {"secs": 2_592_001}}), "step pause: secs:"),
            (
                json!({"1": {"if": "steps.page.output.text == ''"}}),
                "step pause: if: steps.page names no earlier step (line 1, column 6)",
            ),
            (
                json!({"1": {"if": "steps.pause.output.until > 0"}}),
                "step pause: if: steps.pause names no earlier step",
            ),
            (json!({"1": {"if": "trigger.text +"}}), "step pause: if:"),
            (json!({"1": {"if": 3}}), "step pause: if: must be a string"),
            (
                json!({"2": {"text": "{{steps.page.output.text}}"}}),
                "step page: text: {{steps.page.output.text}} names step page, which is not an earlier step",
            ),
            (json!({"1": {"text": "x"}}), "step pause: unknown field `text`"),
        ] {
            let got = refused(&|d| {
                for (i, fields) in change.as_object().unwrap() {
                    let i: usize = i.parse().unwrap();
                    for (k, v) in fields.as_object().unwrap() {
                        d["steps"][i][k] = v.clone();
                    }
                }
            });
            assert!(got.starts_with(want), "{change}: {got}");
        }
        let got = refused(&|d| {
            d["steps"][1]
                .as_object_mut()
                .unwrap()
                .remove("secs")
                .map(|_| ())
                .unwrap()
        });
        assert!(got.starts_with("step pause: missing field `secs`"), "{got}");
    }

    #[test]
    fn message_filter() {
        let pk = Keys::generate().public_key();
        let f = MessageFilter {
            text_contains: Some("HeLp".into()),
            authors: None,
            include_agents: false,
        };
        assert!(f.matches("please help me", &pk, false));
        assert!(!f.matches("please help me", &pk, true));
        assert!(!f.matches("nothing", &pk, false));
        let f = MessageFilter {
            text_contains: None,
            authors: Some(vec![pk.to_hex()]),
            include_agents: true,
        };
        assert!(f.matches("x", &pk, true));
        assert!(!f.matches("x", &Keys::generate().public_key(), false));
    }
}
