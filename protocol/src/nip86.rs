//! Relay management (NIP-86, docs/protocol.md, "Management"): `POST /` with
//! `Content-Type: application/nostr+json+rpc`, a NIP-98 header and a body
//! `{"method", "params"}`; the answer is `{"result"}` or `{"error"}`.
//!
//! Every method is a [`Call`] parsed from the request with its parameters
//! checked and bounded here, so the relay and the command line that builds
//! requests share one reading of them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::{DeliveryStatus, RunStatus};

/// The content type of a management request (and of its answer).
pub const CONTENT_TYPE: &str = "application/nostr+json+rpc";

/// Longest `reason` kept with a list entry, in bytes.
pub const MAX_REASON_BYTES: usize = 1024;
/// Longest relay name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest relay description, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 4096;
/// Most rows `listdeliveries` answers.
pub const MAX_LIST_DELIVERIES: u32 = 500;
/// Most ids one bulk call (`retrydeliveries`, `canceldeliveries`,
/// `cancelruns`, `rerunruns`) acts on.
pub const MAX_BULK_IDS: usize = 100;

/// A request body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub method: String,
    #[serde(default)]
    pub params: Vec<Value>,
}

/// An answer body: `result` on success, `error` (a machine-readable
/// `prefix: text`) when the call was refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    #[serde(default)]
    pub result: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An entry of `listbannedpubkeys` / `listallowedpubkeys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PubkeyEntry {
    pub pubkey: String,
    pub reason: String,
}

/// An entry of `listbannedevents`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventEntry {
    pub id: String,
    pub reason: String,
}

/// `listdeliveries` filter (every field optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<DeliveryStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// Only this run's rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Only this agent's rows (hex pubkey).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Only rows created at least this many seconds ago.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub older_than_secs: Option<u64>,
    /// 1..=[`MAX_LIST_DELIVERIES`] (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// The answer of `retrydelivery` and `canceldelivery`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryChanged {
    pub id: String,
    pub status: DeliveryStatus,
}

/// The answer of a bulk call: what changed, and each id refused with the
/// error its single call would have answered (`pending: ...` when the row
/// moved on since it was listed, `restricted: ...`, `invalid: ...`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkChanged<T> {
    pub changed: Vec<T>,
    pub refused: Vec<BulkRefused>,
}

/// One id of a bulk call left as it was, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkRefused {
    pub id: String,
    pub error: String,
}

/// The answer of `cancelrun`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunChanged {
    pub id: String,
    pub status: RunStatus,
}

/// Which definition revision a rerun runs: the one its origin ran with
/// (the default), or the workflow's latest, whose steps up to the rerun's
/// first must be the origin's (same ids, same order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RerunDefinition {
    #[default]
    Kept,
    Latest,
}

/// `rerunrun` / `rerunruns` options (`{"definition": "kept"|"latest"}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerunOptions {
    #[serde(default)]
    pub definition: RerunDefinition,
}

/// The answer of `rerunrun`: the new run, the step it starts at, and
/// whether this call made it (`false`: the origin was rerun before, and
/// `rerun` is that run; nothing new was made).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRerun {
    /// The origin run.
    pub id: String,
    pub rerun: String,
    pub from_step: String,
    pub created: bool,
}

/// The answer of `pauseworkflow` and `resumeworkflow`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkflowChanged {
    pub id: String,
    pub paused: bool,
}

/// Where an agent takes mentions: one channel, or (`None`) every channel
/// of the community.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MentionScope {
    pub agent: [u8; 32],
    pub channel: Option<String>,
}

/// One agent's mentions turned on (`setmentions`' answer and
/// `listmentions`' rows; `on` is false in the answer of a call that turned
/// them off). `channel` is `null` for every channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MentionSetting {
    pub agent: String,
    pub channel: Option<String>,
    pub on: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<i64>,
}

/// Most rows `listmentions` answers.
pub const MAX_LIST_MENTIONS: usize = 1000;

/// The methods, NIP-86's first, then this relay's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    SupportedMethods,
    BanPubkey,
    ListBannedPubkeys,
    AllowPubkey,
    ListAllowedPubkeys,
    BanEvent,
    ListBannedEvents,
    ChangeRelayName,
    ChangeRelayDescription,
    ListDeliveries,
    RetryDelivery,
    CancelDelivery,
    CancelRun,
    PauseWorkflow,
    ResumeWorkflow,
    RetryDeliveries,
    CancelDeliveries,
    CancelRuns,
    RerunRun,
    RerunRuns,
    SetMentions,
    ListMentions,
}

impl Method {
    pub const ALL: &'static [Method] = &[
        Method::SupportedMethods,
        Method::BanPubkey,
        Method::ListBannedPubkeys,
        Method::AllowPubkey,
        Method::ListAllowedPubkeys,
        Method::BanEvent,
        Method::ListBannedEvents,
        Method::ChangeRelayName,
        Method::ChangeRelayDescription,
        Method::ListDeliveries,
        Method::RetryDelivery,
        Method::CancelDelivery,
        Method::CancelRun,
        Method::PauseWorkflow,
        Method::ResumeWorkflow,
        Method::RetryDeliveries,
        Method::CancelDeliveries,
        Method::CancelRuns,
        Method::RerunRun,
        Method::RerunRuns,
        Method::SetMentions,
        Method::ListMentions,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Method::SupportedMethods => "supportedmethods",
            Method::BanPubkey => "banpubkey",
            Method::ListBannedPubkeys => "listbannedpubkeys",
            Method::AllowPubkey => "allowpubkey",
            Method::ListAllowedPubkeys => "listallowedpubkeys",
            Method::BanEvent => "banevent",
            Method::ListBannedEvents => "listbannedevents",
            Method::ChangeRelayName => "changerelayname",
            Method::ChangeRelayDescription => "changerelaydescription",
            Method::ListDeliveries => "listdeliveries",
            Method::RetryDelivery => "retrydelivery",
            Method::CancelDelivery => "canceldelivery",
            Method::CancelRun => "cancelrun",
            Method::PauseWorkflow => "pauseworkflow",
            Method::ResumeWorkflow => "resumeworkflow",
            Method::RetryDeliveries => "retrydeliveries",
            Method::CancelDeliveries => "canceldeliveries",
            Method::CancelRuns => "cancelruns",
            Method::RerunRun => "rerunrun",
            Method::RerunRuns => "rerunruns",
            Method::SetMentions => "setmentions",
            Method::ListMentions => "listmentions",
        }
    }

    pub fn parse(s: &str) -> Option<Method> {
        Method::ALL.iter().copied().find(|m| m.as_str() == s)
    }

    /// Whether a workflow's owner may call it (for that workflow's runs
    /// and deliveries); admins may call every method. `listdeliveries`
    /// shows an owner only the deliveries of its own workflows.
    pub fn open_to_owners(self) -> bool {
        matches!(
            self,
            Method::SupportedMethods
                | Method::ListDeliveries
                | Method::RetryDelivery
                | Method::CancelDelivery
                | Method::CancelRun
                | Method::PauseWorkflow
                | Method::ResumeWorkflow
                | Method::RetryDeliveries
                | Method::CancelDeliveries
                | Method::CancelRuns
                | Method::RerunRun
                | Method::RerunRuns
                | Method::SetMentions
                | Method::ListMentions
        )
    }
}

/// Which of the community's lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum List {
    BannedPubkeys,
    AllowedPubkeys,
    BannedEvents,
}

impl List {
    /// The name the database keeps.
    pub fn as_str(self) -> &'static str {
        match self {
            List::BannedPubkeys => "banned_pubkey",
            List::AllowedPubkeys => "allowed_pubkey",
            List::BannedEvents => "banned_event",
        }
    }
}

/// A request, its parameters checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    SupportedMethods,
    /// Add `value` (32 bytes, a pubkey or an event id) to `list`.
    Add {
        list: List,
        value: [u8; 32],
        reason: String,
    },
    Show(List),
    ChangeName(String),
    ChangeDescription(String),
    ListDeliveries(DeliveryQuery),
    RetryDelivery(String),
    CancelDelivery(String),
    CancelRun(String),
    PauseWorkflow(String),
    ResumeWorkflow(String),
    /// Each delivery, as `retrydelivery` would (distinct ids, in order).
    RetryDeliveries(Vec<String>),
    /// Each delivery, as `canceldelivery` would.
    CancelDeliveries(Vec<String>),
    /// Each run, as `cancelrun` would.
    CancelRuns(Vec<String>),
    /// Rerun a failed or cancelled run from the step it ended at.
    RerunRun(String, RerunOptions),
    /// Each run, as `rerunrun` would.
    RerunRuns(Vec<String>, RerunOptions),
    /// Turn an agent's mentions on or off, here or in one channel.
    SetMentions(MentionScope, bool),
    /// The agents that take mentions (an owner's own agents only).
    ListMentions,
}

impl Call {
    /// Parses and checks a request. The error is the answer's `error`.
    pub fn parse(req: &Request) -> Result<Call, String> {
        let method =
            Method::parse(&req.method).ok_or_else(|| format!("invalid: unknown method {:?}", req.method))?;
        let p = &req.params;
        Ok(match method {
            Method::SupportedMethods => Call::SupportedMethods,
            Method::BanPubkey => add(List::BannedPubkeys, p, "pubkey")?,
            Method::AllowPubkey => add(List::AllowedPubkeys, p, "pubkey")?,
            Method::BanEvent => add(List::BannedEvents, p, "event id")?,
            Method::ListBannedPubkeys => Call::Show(List::BannedPubkeys),
            Method::ListAllowedPubkeys => Call::Show(List::AllowedPubkeys),
            Method::ListBannedEvents => Call::Show(List::BannedEvents),
            Method::ChangeRelayName => Call::ChangeName(text(p, 0, "name", MAX_NAME_BYTES)?),
            Method::ChangeRelayDescription => {
                Call::ChangeDescription(text(p, 0, "description", MAX_DESCRIPTION_BYTES)?)
            }
            Method::ListDeliveries => Call::ListDeliveries(query(p)?),
            Method::RetryDelivery => Call::RetryDelivery(id(p, "delivery id")?),
            Method::CancelDelivery => Call::CancelDelivery(id(p, "delivery id")?),
            Method::CancelRun => Call::CancelRun(id(p, "run id")?),
            Method::PauseWorkflow => Call::PauseWorkflow(id(p, "workflow id")?),
            Method::ResumeWorkflow => Call::ResumeWorkflow(id(p, "workflow id")?),
            Method::RetryDeliveries => Call::RetryDeliveries(ids(p, "delivery ids")?),
            Method::CancelDeliveries => Call::CancelDeliveries(ids(p, "delivery ids")?),
            Method::CancelRuns => Call::CancelRuns(ids(p, "run ids")?),
            Method::RerunRun => Call::RerunRun(id(p, "run id")?, rerun_options(p)?),
            Method::RerunRuns => Call::RerunRuns(ids(p, "run ids")?, rerun_options(p)?),
            Method::SetMentions => set_mentions(p)?,
            Method::ListMentions => Call::ListMentions,
        })
    }

    pub fn method(&self) -> Method {
        match self {
            Call::SupportedMethods => Method::SupportedMethods,
            Call::Add { list, .. } => match list {
                List::BannedPubkeys => Method::BanPubkey,
                List::AllowedPubkeys => Method::AllowPubkey,
                List::BannedEvents => Method::BanEvent,
            },
            Call::Show(list) => match list {
                List::BannedPubkeys => Method::ListBannedPubkeys,
                List::AllowedPubkeys => Method::ListAllowedPubkeys,
                List::BannedEvents => Method::ListBannedEvents,
            },
            Call::ChangeName(_) => Method::ChangeRelayName,
            Call::ChangeDescription(_) => Method::ChangeRelayDescription,
            Call::ListDeliveries(_) => Method::ListDeliveries,
            Call::RetryDelivery(_) => Method::RetryDelivery,
            Call::CancelDelivery(_) => Method::CancelDelivery,
            Call::CancelRun(_) => Method::CancelRun,
            Call::PauseWorkflow(_) => Method::PauseWorkflow,
            Call::ResumeWorkflow(_) => Method::ResumeWorkflow,
            Call::RetryDeliveries(_) => Method::RetryDeliveries,
            Call::CancelDeliveries(_) => Method::CancelDeliveries,
            Call::CancelRuns(_) => Method::CancelRuns,
            Call::RerunRun(..) => Method::RerunRun,
            Call::RerunRuns(..) => Method::RerunRuns,
            Call::SetMentions(..) => Method::SetMentions,
            Call::ListMentions => Method::ListMentions,
        }
    }
}

/// `[<agent, 64 hex>, <on: bool>, <channel>?]`: every channel of the
/// community when the channel is absent or `null`.
fn set_mentions(p: &[Value]) -> Result<Call, String> {
    let agent = hex32(p, 0, "agent pubkey")?;
    let on = p
        .get(1)
        .and_then(Value::as_bool)
        .ok_or("invalid: params[1] must be true (mentions on) or false (off)")?;
    let channel = match p.get(2) {
        None | Some(Value::Null) => None,
        Some(_) => {
            let c = text(p, 2, "channel", crate::nip29::MAX_CHANNEL_ID_BYTES)?;
            if c.is_empty() {
                return Err("invalid: channel must not be empty (null: every channel)".into());
            }
            Some(c)
        }
    };
    Ok(Call::SetMentions(MentionScope { agent, channel }, on))
}

/// `[<64 hex>, <reason>?]`.
fn add(list: List, p: &[Value], what: &str) -> Result<Call, String> {
    let value = hex32(p, 0, what)?;
    let reason = match p.get(1) {
        None | Some(Value::Null) => String::new(),
        Some(_) => text(p, 1, "reason", MAX_REASON_BYTES)?,
    };
    Ok(Call::Add { list, value, reason })
}

/// `params[at]`: 32 bytes as 64 lowercase hex characters.
fn hex32(p: &[Value], at: usize, what: &str) -> Result<[u8; 32], String> {
    let hex_value = p
        .get(at)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("invalid: params[{at}] must be the {what} (64 hex characters)"))?;
    let mut value = [0u8; 32];
    let lower = hex_value
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if hex_value.len() != 64 || !lower || hex::decode_to_slice(hex_value, &mut value).is_err() {
        return Err(format!("invalid: {what} must be 64 lowercase hex characters"));
    }
    Ok(value)
}

/// A string parameter of at most `max` bytes, without U+0000.
fn text(p: &[Value], at: usize, what: &str, max: usize) -> Result<String, String> {
    let s = p
        .get(at)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("invalid: params[{at}] must be the {what} (a string)"))?;
    if s.len() > max || s.contains('\0') {
        return Err(format!(
            "invalid: {what} must be at most {max} bytes, without U+0000"
        ));
    }
    Ok(s.to_string())
}

/// `[<id>]`: the ids this relay makes (`[a-z0-9_-]{1,64}`).
fn id(p: &[Value], what: &str) -> Result<String, String> {
    let s = p
        .first()
        .and_then(Value::as_str)
        .ok_or_else(|| format!("invalid: params[0] must be the {what}"))?;
    if !crate::workflow::valid_id(s) {
        return Err(format!("invalid: {what} must match [a-z0-9_-]{{1,64}}"));
    }
    Ok(s.to_string())
}

/// `[[<id>, ...]]`: 1 to [`MAX_BULK_IDS`] ids this relay makes, repeats
/// dropped.
fn ids(p: &[Value], what: &str) -> Result<Vec<String>, String> {
    let list = p
        .first()
        .and_then(Value::as_array)
        .ok_or_else(|| format!("invalid: params[0] must be the list of {what}"))?;
    if list.is_empty() || list.len() > MAX_BULK_IDS {
        return Err(format!("invalid: {what}: 1 to {MAX_BULK_IDS} of them"));
    }
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for v in list {
        let s = v
            .as_str()
            .filter(|s| crate::workflow::valid_id(s))
            .ok_or_else(|| format!("invalid: each of the {what} must match [a-z0-9_-]{{1,64}}"))?;
        if !out.iter().any(|o| o == s) {
            out.push(s.to_string());
        }
    }
    Ok(out)
}

/// `params[1]`: absent, `null`, or `{"definition": "kept"|"latest"}`.
fn rerun_options(p: &[Value]) -> Result<RerunOptions, String> {
    match p.get(1) {
        None | Some(Value::Null) => Ok(RerunOptions::default()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| format!("invalid: params[1]: {e}")),
    }
}

/// `[]` or `[{status?, workflow?, older_than_secs?, limit?}]`.
fn query(p: &[Value]) -> Result<DeliveryQuery, String> {
    let q: DeliveryQuery = match p.first() {
        None | Some(Value::Null) => DeliveryQuery::default(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| format!("invalid: params[0]: {e}"))?,
    };
    if let Some(w) = &q.workflow {
        if !crate::workflow::valid_id(w) {
            return Err("invalid: workflow must match [a-z0-9_-]{1,64}".into());
        }
    }
    if q.run.as_deref().is_some_and(|r| !crate::workflow::valid_id(r)) {
        return Err("invalid: run must match [a-z0-9_-]{1,64}".into());
    }
    if q.target
        .as_deref()
        .is_some_and(|t| !crate::workflow::is_hex_pubkey(t))
    {
        return Err("invalid: target must be a 64-character hex pubkey".into());
    }
    if q.limit.is_some_and(|l| l == 0 || l > MAX_LIST_DELIVERIES) {
        return Err(format!("invalid: limit must be 1 to {MAX_LIST_DELIVERIES}"));
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(method: &str, params: Value) -> Request {
        serde_json::from_value(json!({"method": method, "params": params})).unwrap()
    }

    #[test]
    fn every_method_has_one_name() {
        for m in Method::ALL {
            assert_eq!(Method::parse(m.as_str()), Some(*m));
        }
        assert_eq!(Method::parse("BanPubkey"), None);
    }

    #[test]
    fn parameters_are_checked() {
        let pk = "a".repeat(64);
        assert_eq!(
            Call::parse(&req("banpubkey", json!([pk, "spam"]))).unwrap(),
            Call::Add {
                list: List::BannedPubkeys,
                value: [0xaa; 32],
                reason: "spam".into()
            }
        );
        assert!(Call::parse(&req("banpubkey", json!([])))
            .unwrap_err()
            .starts_with("invalid:"));
        assert!(Call::parse(&req("banpubkey", json!(["A".repeat(64)]))).is_err());
        assert!(Call::parse(&req("banevent", json!(["ab"]))).is_err());
        let long = "x".repeat(MAX_REASON_BYTES + 1);
        assert!(Call::parse(&req("banpubkey", json!([pk, long]))).is_err());
        assert!(Call::parse(&req("changerelayname", json!([1]))).is_err());
        assert!(Call::parse(&req("retrydelivery", json!(["../x"]))).is_err());
        assert!(Call::parse(&req("listdeliveries", json!([{"limit": 0}]))).is_err());
        assert!(Call::parse(&req("listdeliveries", json!([{"colour": "red"}]))).is_err());
        assert_eq!(
            Call::parse(&req("listdeliveries", json!([{"status": "failed"}]))).unwrap(),
            Call::ListDeliveries(DeliveryQuery {
                status: Some(DeliveryStatus::Failed),
                ..Default::default()
            })
        );
        assert_eq!(
            Call::parse(&req("retrydeliveries", json!([["a", "b", "a"]]))).unwrap(),
            Call::RetryDeliveries(vec!["a".into(), "b".into()])
        );
        assert!(Call::parse(&req("canceldeliveries", json!([[]]))).is_err());
        assert!(Call::parse(&req("cancelruns", json!([["../x"]]))).is_err());
        assert!(Call::parse(&req("cancelruns", json!(["a"]))).is_err());
        let too_many: Vec<String> = (0..=MAX_BULK_IDS).map(|i| format!("r{i}")).collect();
        assert!(Call::parse(&req("cancelruns", json!([too_many]))).is_err());
        assert_eq!(
            Call::parse(&req("rerunrun", json!(["r1"]))).unwrap(),
            Call::RerunRun("r1".into(), RerunOptions::default())
        );
        assert_eq!(
            Call::parse(&req("rerunruns", json!([["r1"], {"definition": "latest"}]))).unwrap(),
            Call::RerunRuns(
                vec!["r1".into()],
                RerunOptions {
                    definition: RerunDefinition::Latest
                }
            )
        );
        assert!(Call::parse(&req("rerunrun", json!(["r1", {"definition": "newest"}]))).is_err());
        assert!(Call::parse(&req("rerunrun", json!(["r1", {"from": "s"}]))).is_err());
        let agent = "b".repeat(64);
        assert_eq!(
            Call::parse(&req("setmentions", json!([agent, true, "ops"]))),
            Ok(Call::SetMentions(
                MentionScope {
                    agent: [0xbb; 32],
                    channel: Some("ops".into())
                },
                true
            ))
        );
        assert_eq!(
            Call::parse(&req("setmentions", json!([agent, false, null]))),
            Ok(Call::SetMentions(
                MentionScope {
                    agent: [0xbb; 32],
                    channel: None
                },
                false
            ))
        );
        for bad in [
            json!([agent]),
            json!([agent, "on"]),
            json!([agent, true, ""]),
            json!([agent, true, "x".repeat(129)]),
            json!(["B".repeat(64), true]),
        ] {
            assert!(Call::parse(&req("setmentions", bad.clone())).is_err(), "{bad}");
        }
        assert!(Call::parse(&req("dropdatabase", json!([])))
            .unwrap_err()
            .contains("unknown method"));
    }

    #[test]
    fn a_call_names_its_method() {
        for m in Method::ALL {
            let params = match m {
                Method::BanPubkey | Method::AllowPubkey | Method::BanEvent => json!(["b".repeat(64)]),
                Method::ChangeRelayName | Method::ChangeRelayDescription => json!(["x"]),
                Method::RetryDelivery
                | Method::CancelDelivery
                | Method::CancelRun
                | Method::RerunRun
                | Method::PauseWorkflow
                | Method::ResumeWorkflow => json!(["abc"]),
                Method::RetryDeliveries
                | Method::CancelDeliveries
                | Method::CancelRuns
                | Method::RerunRuns => {
                    json!([["abc"]])
                }
                Method::SetMentions => json!(["b".repeat(64), true]),
                _ => json!([]),
            };
            assert_eq!(Call::parse(&req(m.as_str(), params)).unwrap().method(), *m);
        }
    }
}
