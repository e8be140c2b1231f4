//! Parsing of client-to-relay messages (NIP-01, NIP-42, NIP-45) with errors
//! precise enough for the relay to answer in the machine-readable form NIP-01
//! asks for: `OK <id> false invalid: …` when an event id can be read,
//! `CLOSED <sub> invalid: …` when a subscription id can be read, and `NOTICE`
//! otherwise.
//!
//! Events are decoded by the `nostr` crate; this module only adds the
//! envelope handling and the error mapping. Signatures are NOT checked here
//! (that is CPU work the relay moves off its async executor).

use nostr::prelude::{Event, Filter};
use serde_json::Value;

/// Longest subscription id NIP-01 allows.
pub const MAX_SUBSCRIPTION_ID_CHARS: usize = 64;

/// An EVENT as received.
#[derive(Debug, Clone)]
pub struct Incoming {
    /// The event as the `nostr` crate holds it.
    pub event: Event,
    /// Set when the event had tags the `nostr` crate cannot hold (empty
    /// tag arrays, which NIP-01 does not forbid): `event` lacks them, and
    /// this is what the relay checks, stores and serves instead.
    pub verbatim: Option<Verbatim>,
}

/// An event kept as its author wrote it (see [`Incoming::verbatim`]).
#[derive(Debug, Clone)]
pub struct Verbatim {
    /// The event's JSON with every tag, its fields in NIP-01 order.
    pub json: String,
    /// Whether its `id` is the hash of its NIP-01 serialisation, every
    /// tag included (its signature is then checked on that id as usual).
    pub id_ok: bool,
}

impl Incoming {
    /// The JSON to store and serve.
    pub fn json(&self) -> String {
        match &self.verbatim {
            Some(v) => v.json.clone(),
            None => self.event.as_json(),
        }
    }
}

/// A well-formed client message.
#[derive(Debug, Clone)]
pub enum ClientMessage {
    /// `["EVENT", <event>]`
    Event(Box<Incoming>),
    /// `["REQ", <sub>, <filter>...]`
    Req { sub_id: String, filters: Vec<Filter> },
    /// `["COUNT", <sub>, <filter>...]` (NIP-45)
    Count { sub_id: String, filters: Vec<Filter> },
    /// `["CLOSE", <sub>]`
    Close { sub_id: String },
    /// `["AUTH", <event>]` (NIP-42)
    Auth(Box<Event>),
    /// `["NEG-OPEN", <sub>, <filter>, <hex message>]` (NIP-77)
    NegOpen {
        sub_id: String,
        filter: Box<Filter>,
        message: Vec<u8>,
    },
    /// `["NEG-MSG", <sub>, <hex message>]` (NIP-77)
    NegMsg { sub_id: String, message: Vec<u8> },
    /// `["NEG-CLOSE", <sub>]` (NIP-77)
    NegClose { sub_id: String },
}

/// Why a message could not be parsed, with whatever identifiers could be
/// recovered so that the answer can name them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not JSON, not an array, no type, or an unknown type: answer NOTICE.
    #[error("{0}")]
    Envelope(String),
    /// A malformed EVENT or AUTH whose `id` could be read: answer OK false.
    #[error("{reason}")]
    Event {
        /// Lower-case hex id as sent (64 hex characters).
        event_id: String,
        /// Human readable reason, without prefix.
        reason: String,
    },
    /// A malformed REQ/COUNT whose subscription id could be read: answer
    /// CLOSED (`NEG-ERR` for the NIP-77 messages).
    #[error("{reason}")]
    Subscription {
        /// Message type (`REQ`, `COUNT`, `NEG-OPEN`, `NEG-MSG`, `NEG-CLOSE`).
        verb: &'static str,
        /// The subscription id as sent.
        sub_id: String,
        /// Human readable reason, without prefix.
        reason: String,
    },
}

fn envelope(reason: impl Into<String>) -> ParseError {
    ParseError::Envelope(reason.into())
}

/// Parses one text frame from a client.
pub fn parse(text: &str) -> Result<ClientMessage, ParseError> {
    let value: Value = serde_json::from_str(text).map_err(|e| envelope(format!("malformed JSON: {e}")))?;
    let Value::Array(mut items) = value else {
        return Err(envelope("message must be a JSON array"));
    };
    let Some(Value::String(verb)) = items.first().cloned() else {
        return Err(envelope("message must start with a type string"));
    };
    match verb.as_str() {
        "EVENT" => parse_event_message(&mut items, "EVENT").map(ClientMessage::Event),
        "AUTH" => parse_event_message(&mut items, "AUTH").map(|i| ClientMessage::Auth(Box::new(i.event))),
        "REQ" => {
            let (sub_id, filters) = parse_filters(&mut items, "REQ")?;
            Ok(ClientMessage::Req { sub_id, filters })
        }
        "COUNT" => {
            let (sub_id, filters) = parse_filters(&mut items, "COUNT")?;
            Ok(ClientMessage::Count { sub_id, filters })
        }
        "CLOSE" => {
            if items.len() != 2 {
                return Err(envelope("CLOSE takes exactly one subscription id"));
            }
            let sub_id = subscription_id(&items[1]).map_err(envelope)?;
            Ok(ClientMessage::Close { sub_id })
        }
        "NEG-OPEN" | "NEG-MSG" | "NEG-CLOSE" => parse_negentropy(&mut items),
        other => Err(envelope(format!(
            "unknown message type {:?}",
            truncate(other, 32)
        ))),
    }
}

fn parse_event_message(items: &mut [Value], verb: &str) -> Result<Box<Incoming>, ParseError> {
    if items.len() != 2 {
        return Err(envelope(format!("{verb} takes exactly one event object")));
    }
    let raw = std::mem::take(&mut items[1]);
    let event_id = match raw.get("id").and_then(Value::as_str) {
        Some(id) if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) => id.to_ascii_lowercase(),
        _ => return Err(envelope(format!("{verb} event has no valid id"))),
    };
    if !raw.is_object() {
        return Err(envelope(format!("{verb} payload must be an object")));
    }
    let (raw, verbatim) = without_empty_tags(raw);
    match serde_json::from_value::<Event>(raw) {
        Ok(event) => Ok(Box::new(Incoming { event, verbatim })),
        Err(e) => Err(ParseError::Event {
            event_id,
            reason: format!("malformed event: {e}"),
        }),
    }
}

/// Longest NIP-77 message accepted, in bytes once decoded from hex (the
/// relay's own frames are kept under it too).
pub const MAX_NEG_MESSAGE_BYTES: usize = 256 * 1024;

/// The NIP-77 messages; errors name the subscription when it can be read
/// (the relay answers `NEG-ERR`).
fn parse_negentropy(items: &mut [Value]) -> Result<ClientMessage, ParseError> {
    let verb: &'static str = match items[0].as_str() {
        Some("NEG-OPEN") => "NEG-OPEN",
        Some("NEG-MSG") => "NEG-MSG",
        _ => "NEG-CLOSE",
    };
    let Some(first) = items.get(1) else {
        return Err(envelope(format!("{verb} needs a subscription id")));
    };
    let sub_id = subscription_id(first).map_err(envelope)?;
    let fail = |reason: &str| ParseError::Subscription {
        verb,
        sub_id: sub_id.clone(),
        reason: reason.to_string(),
    };
    let want = match verb {
        "NEG-OPEN" => 4,
        "NEG-MSG" => 3,
        _ => 2,
    };
    if items.len() != want {
        return Err(fail(&format!("{verb} takes {} elements", want)));
    }
    let message = |v: &Value| -> Result<Vec<u8>, ParseError> {
        let text = v
            .as_str()
            .ok_or_else(|| fail("the message must be a hex string"))?;
        if text.len() > 2 * MAX_NEG_MESSAGE_BYTES {
            return Err(fail(&format!(
                "a message longer than {MAX_NEG_MESSAGE_BYTES} bytes"
            )));
        }
        hex::decode(text).map_err(|_| fail("the message is not hex"))
    };
    match verb {
        "NEG-OPEN" => {
            let raw = std::mem::take(&mut items[2]);
            if !raw.is_object() {
                return Err(fail("the filter must be an object"));
            }
            let filter =
                serde_json::from_value::<Filter>(raw).map_err(|e| fail(&format!("malformed filter: {e}")))?;
            let message = message(&items[3])?;
            Ok(ClientMessage::NegOpen {
                sub_id: sub_id.clone(),
                filter: Box::new(filter),
                message,
            })
        }
        "NEG-MSG" => {
            let message = message(&items[2])?;
            Ok(ClientMessage::NegMsg {
                sub_id: sub_id.clone(),
                message,
            })
        }
        _ => Ok(ClientMessage::NegClose {
            sub_id: sub_id.clone(),
        }),
    }
}

/// Takes empty tag arrays out of an event object for the `nostr` crate,
/// keeping the event as written ([`Verbatim`]) when there were any.
fn without_empty_tags(mut raw: Value) -> (Value, Option<Verbatim>) {
    let has_empty = raw
        .get("tags")
        .and_then(Value::as_array)
        .is_some_and(|tags| tags.iter().any(|t| t.as_array().is_some_and(Vec::is_empty)));
    if !has_empty {
        return (raw, None);
    }
    let field = |name: &str| raw.get(name).cloned().unwrap_or(Value::Null);
    let canonical = Value::Array(vec![
        Value::from(0),
        field("pubkey"),
        field("created_at"),
        field("kind"),
        field("tags"),
        field("content"),
    ]);
    let hash = sha256_hex(canonical.to_string().as_bytes());
    let id_ok = raw
        .get("id")
        .and_then(Value::as_str)
        .is_some_and(|id| id.eq_ignore_ascii_case(&hash));
    let mut ordered = serde_json::Map::new();
    for name in ["id", "pubkey", "created_at", "kind", "tags", "content", "sig"] {
        ordered.insert(name.to_string(), field(name));
    }
    let json = Value::Object(ordered).to_string();
    if let Some(Value::Array(tags)) = raw.get_mut("tags") {
        tags.retain(|t| !t.as_array().is_some_and(Vec::is_empty));
    }
    (raw, Some(Verbatim { json, id_ok }))
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

fn parse_filters(items: &mut [Value], verb: &'static str) -> Result<(String, Vec<Filter>), ParseError> {
    let Some(first) = items.get(1) else {
        return Err(envelope(format!("{verb} needs a subscription id")));
    };
    let sub_id = subscription_id(first).map_err(envelope)?;
    if items.len() < 3 {
        return Err(ParseError::Subscription {
            verb,
            sub_id,
            reason: "at least one filter is required".into(),
        });
    }
    let mut filters = Vec::with_capacity(items.len() - 2);
    for raw in items[2..].iter_mut() {
        let raw = std::mem::take(raw);
        if !raw.is_object() {
            return Err(ParseError::Subscription {
                verb,
                sub_id,
                reason: "each filter must be an object".into(),
            });
        }
        match serde_json::from_value::<Filter>(raw) {
            Ok(f) => filters.push(f),
            Err(e) => {
                return Err(ParseError::Subscription {
                    verb,
                    sub_id,
                    reason: format!("malformed filter: {e}"),
                })
            }
        }
    }
    Ok((sub_id, filters))
}

fn subscription_id(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) if s.is_empty() => Err("subscription id must not be empty".into()),
        Value::String(s) if s.chars().count() > MAX_SUBSCRIPTION_ID_CHARS => Err(format!(
            "subscription id longer than {MAX_SUBSCRIPTION_ID_CHARS} characters"
        )),
        Value::String(s) => Ok(s.clone()),
        _ => Err("subscription id must be a string".into()),
    }
}

fn truncate(s: &str, max_chars: usize) -> String {
    s.chars().take(max_chars).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind};

    fn event_json() -> String {
        let keys = Keys::generate();
        let ev = EventBuilder::new(Kind::TextNote, "hi").finalize(&keys).unwrap();
        serde_json::to_string(&ev).unwrap()
    }

    #[test]
    fn parses_each_type() {
        let ev = event_json();
        assert!(matches!(
            parse(&format!(r#"["EVENT",{ev}]"#)),
            Ok(ClientMessage::Event(_))
        ));
        assert!(matches!(
            parse(&format!(r#"["AUTH",{ev}]"#)),
            Ok(ClientMessage::Auth(_))
        ));
        match parse(r#"["REQ","s",{"kinds":[1]},{"limit":2}]"#) {
            Ok(ClientMessage::Req { sub_id, filters }) => {
                assert_eq!(sub_id, "s");
                assert_eq!(filters.len(), 2);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(r#"["COUNT","c",{}]"#),
            Ok(ClientMessage::Count { .. })
        ));
        assert!(matches!(
            parse(r#"["CLOSE","s"]"#),
            Ok(ClientMessage::Close { .. })
        ));
    }

    #[test]
    fn envelope_errors() {
        for bad in [
            "",
            "{",
            "{}",
            "[]",
            "[1]",
            r#"["NOPE"]"#,
            r#"["CLOSE"]"#,
            r#"["REQ"]"#,
            r#"["REQ",""]"#,
            r#"["REQ",5,{}]"#,
        ] {
            assert!(matches!(parse(bad), Err(ParseError::Envelope(_))), "{bad}");
        }
        let long = "x".repeat(65);
        assert!(matches!(
            parse(&format!(r#"["CLOSE","{long}"]"#)),
            Err(ParseError::Envelope(_))
        ));
    }

    #[test]
    fn event_errors_keep_the_id() {
        let id = "a".repeat(64);
        match parse(&format!(r#"["EVENT",{{"id":"{id}","kind":"x"}}]"#)) {
            Err(ParseError::Event { event_id, .. }) => assert_eq!(event_id, id),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(r#"["EVENT",{"id":"zz"}]"#),
            Err(ParseError::Envelope(_))
        ));
    }

    #[test]
    fn filter_errors_keep_the_sub() {
        match parse(r#"["REQ","s",{"kinds":"x"}]"#) {
            Err(ParseError::Subscription { sub_id, .. }) => assert_eq!(sub_id, "s"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(r#"["REQ","s"]"#),
            Err(ParseError::Subscription { .. })
        ));
        assert!(matches!(
            parse(r#"["COUNT","s",[]]"#),
            Err(ParseError::Subscription { .. })
        ));
    }
}
