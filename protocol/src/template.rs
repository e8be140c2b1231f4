//! Workflow message templates: `{{path}}` placeholders, deterministic
//! rendering shared by relay and agent (the agent re-renders and compares
//! byte for byte), and recipients from literal NIP-27 mentions.

use nostr::prelude::{Nip21, PublicKey};
use serde_json::Value;

/// Longest template accepted.
pub const MAX_TEMPLATE_BYTES: usize = 16 * 1024;
/// Most placeholders in one template.
pub const MAX_PLACEHOLDERS: usize = 64;

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    /// Dotted path, e.g. `["trigger", "body", "title"]`.
    Var(Vec<String>),
}

/// Why a template is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("template is longer than {MAX_TEMPLATE_BYTES} bytes")]
    TooLong,
    #[error("unclosed {{{{ at byte {0}")]
    Unclosed(usize),
    #[error("empty placeholder at byte {0}")]
    Empty(usize),
    #[error("more than {MAX_PLACEHOLDERS} placeholders")]
    TooManyPlaceholders,
    #[error("{{{{{path}}}}} names step {step}, which is not an earlier step")]
    NotEarlier { path: String, step: String },
    #[error("unknown placeholder {{{{{0}}}}}: use trigger.text, trigger.author, trigger.event_id, trigger.channel, trigger.body.<field> or steps.<id>.output.<field>")]
    Unknown(String),
}

/// A rendering that would pass its bound; `at_least` bytes were reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the rendered text reaches at least {at_least} bytes")]
pub struct TooLarge {
    pub at_least: usize,
}

fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Template {
    /// Parses `{{ a.b.c }}` placeholders (spaces inside the braces allowed).
    pub fn parse(src: &str) -> Result<Self, TemplateError> {
        if src.len() > MAX_TEMPLATE_BYTES {
            return Err(TemplateError::TooLong);
        }
        let mut parts = Vec::new();
        let mut rest = src;
        let mut offset = 0;
        let mut vars = 0;
        while let Some(start) = rest.find("{{") {
            if start > 0 {
                parts.push(Part::Text(rest[..start].to_string()));
            }
            let after = &rest[start + 2..];
            let end = after.find("}}").ok_or(TemplateError::Unclosed(offset + start))?;
            let inner = after[..end].trim();
            if inner.is_empty() {
                return Err(TemplateError::Empty(offset + start));
            }
            let path: Vec<String> = inner.split('.').map(str::to_string).collect();
            if !path.iter().all(|s| valid_segment(s)) {
                return Err(TemplateError::Unknown(inner.to_string()));
            }
            vars += 1;
            if vars > MAX_PLACEHOLDERS {
                return Err(TemplateError::TooManyPlaceholders);
            }
            parts.push(Part::Var(path));
            let consumed = start + 2 + end + 2;
            offset += consumed;
            rest = &rest[consumed..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(Self { parts })
    }

    /// Placeholder paths, in order.
    pub fn variables(&self) -> impl Iterator<Item = &[String]> {
        self.parts.iter().filter_map(|p| {
            if let Part::Var(v) = p {
                Some(v.as_slice())
            } else {
                None
            }
        })
    }

    /// Checks every placeholder names a known root; `earlier_steps` are the
    /// step ids a `steps.<id>` reference may name.
    pub fn check(&self, earlier_steps: &[&str]) -> Result<(), TemplateError> {
        for v in self.variables() {
            if v.first().is_some_and(|r| r == "steps")
                && v.len() >= 2
                && !earlier_steps.contains(&v[1].as_str())
            {
                return Err(TemplateError::NotEarlier {
                    path: v.join("."),
                    step: v[1].clone(),
                });
            }
            let ok = match v.first().map(String::as_str) {
                Some("trigger") => match v.get(1).map(String::as_str) {
                    Some("text" | "author" | "event_id" | "channel") => v.len() == 2,
                    Some("body") => v.len() >= 3,
                    _ => false,
                },
                Some("steps") => v.len() >= 4 && earlier_steps.contains(&v[1].as_str()) && v[2] == "output",
                _ => false,
            };
            if !ok {
                return Err(TemplateError::Unknown(v.join(".")));
            }
        }
        Ok(())
    }

    /// Renders against a context `{"trigger": …, "steps": {id: {"output": …}}}`.
    /// A missing value renders as the empty string; strings render as they
    /// are; other JSON values as compact JSON. Deterministic.
    pub fn render(&self, ctx: &Value) -> String {
        match self.render_bounded(ctx, usize::MAX) {
            Ok(s) => s,
            Err(TooLarge { .. }) => unreachable!("no text is longer than usize::MAX bytes"),
        }
    }

    /// [`Template::render`], stopping as soon as the text would pass
    /// `max_bytes`: 64 placeholders of substituted data, each of them the
    /// output of an earlier step, would otherwise multiply trigger data
    /// without bound (an 8 KB webhook body became a 33.5 MB message).
    pub fn render_bounded(&self, ctx: &Value, max_bytes: usize) -> Result<String, TooLarge> {
        let mut out = String::new();
        for p in &self.parts {
            let piece: std::borrow::Cow<'_, str> = match p {
                Part::Text(t) => t.as_str().into(),
                Part::Var(path) => {
                    let mut v = ctx;
                    for seg in path {
                        v = v.get(seg).unwrap_or(&Value::Null);
                    }
                    match v {
                        Value::Null => "".into(),
                        Value::String(s) => s.as_str().into(),
                        other => other.to_string().into(),
                    }
                }
            };
            if out.len().saturating_add(piece.len()) > max_bytes {
                return Err(TooLarge {
                    at_least: out.len().saturating_add(piece.len()),
                });
            }
            out.push_str(&piece);
        }
        Ok(out)
    }

    /// The literal text of the template (placeholders excluded).
    fn literal_text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| {
                if let Part::Text(t) = p {
                    Some(t.as_str())
                } else {
                    None
                }
            })
            .collect()
    }
}

/// Pubkeys mentioned literally in a template (`nostr:npub1…`,
/// `nostr:nprofile1…`), in order of first appearance, without duplicates.
/// Only the template's own text counts: text substituted from trigger data
/// can never add a recipient.
pub fn mentions(template: &Template) -> Vec<PublicKey> {
    let text = template.literal_text();
    let mut out: Vec<PublicKey> = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("nostr:") {
        let candidate = &rest[i..];
        let end = candidate[6..]
            .find(|c: char| !c.is_ascii_alphanumeric())
            .map_or(candidate.len(), |e| e + 6);
        let uri = &candidate[..end];
        let pk = match Nip21::parse(uri) {
            Ok(Nip21::Pubkey(pk)) => Some(pk),
            Ok(Nip21::Profile(p)) => Some(p.public_key),
            _ => None,
        };
        if let Some(pk) = pk {
            if !out.contains(&pk) {
                out.push(pk);
            }
        }
        rest = &candidate[end.max(6)..];
    }
    out
}

/// The rendering context from a delivery's snapshot: the trigger context and
/// the execution trace (`[{"step": id, "output": {...}}, ...]`).
pub fn context(trigger: &Value, trace: &Value) -> Value {
    let mut steps = serde_json::Map::new();
    if let Some(items) = trace.as_array() {
        for item in items {
            if let Some(id) = item.get("step").and_then(Value::as_str) {
                steps.insert(
                    id.to_string(),
                    serde_json::json!({"output": item.get("output").cloned().unwrap_or(Value::Null)}),
                );
            }
        }
    }
    serde_json::json!({"trigger": trigger, "steps": steps})
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{Keys, Nip19Profile, ToBech32};
    use serde_json::json;

    #[test]
    fn parses_and_renders() {
        let t = Template::parse(
            "Hi {{trigger.author}}: {{ trigger.text }} #{{trigger.body.n}} {{steps.a.output.x}}!",
        )
        .unwrap();
        let ctx = json!({"trigger": {"author": "bob", "text": "yo", "body": {"n": 5}}, "steps": {"a": {"output": {"x": {"k": true}}}}});
        assert_eq!(t.render(&ctx), "Hi bob: yo #5 {\"k\":true}!");
        // Missing values render empty, deterministically.
        assert_eq!(t.render(&json!({})), "Hi :  # !");
        assert!(t.check(&["a"]).is_ok());
        assert!(t.check(&[]).is_err());
    }

    #[test]
    fn bounded_rendering_stops_at_the_bound() {
        let t = Template::parse(&"{{trigger.body.x}}".repeat(64)).unwrap();
        let ctx = json!({"trigger": {"body": {"x": "y".repeat(8 * 1024)}}});
        assert_eq!(t.render(&ctx).len(), 64 * 8 * 1024);
        let err = t.render_bounded(&ctx, 128 * 1024).unwrap_err();
        assert!(err.at_least > 128 * 1024 && err.at_least <= 136 * 1024, "{err:?}");
        assert_eq!(t.render_bounded(&ctx, 64 * 8 * 1024).unwrap(), t.render(&ctx));
    }

    #[test]
    fn rejects_bad_templates() {
        assert_eq!(Template::parse("a {{ b"), Err(TemplateError::Unclosed(2)));
        assert_eq!(Template::parse("{{ }}"), Err(TemplateError::Empty(0)));
        assert!(Template::parse("{{a b}}").is_err());
        assert!(Template::parse(&"x".repeat(MAX_TEMPLATE_BYTES + 1)).is_err());
        for bad in [
            "{{trigger}}",
            "{{trigger.body}}",
            "{{trigger.secret}}",
            "{{steps.a.x.y}}",
            "{{env.HOME}}",
            "{{trigger.text.x}}",
        ] {
            assert!(Template::parse(bad).unwrap().check(&["a"]).is_err(), "{bad}");
        }
    }

    #[test]
    fn mentions_come_only_from_the_template() {
        let a = Keys::generate().public_key();
        let b = Keys::generate().public_key();
        let npub = a.to_bech32().unwrap();
        let nprofile = Nip19Profile::new(b, Vec::<nostr::prelude::RelayUrl>::new())
            .to_bech32()
            .unwrap();
        let t = Template::parse(&format!(
            "ping nostr:{npub}, nostr:{nprofile} and nostr:{npub} about {{{{trigger.text}}}}"
        ))
        .unwrap();
        assert_eq!(mentions(&t), vec![a, b]);
        // A mention inside substituted trigger text is not a recipient.
        let c = Keys::generate().public_key().to_bech32().unwrap();
        let rendered = t.render(&json!({"trigger": {"text": format!("nostr:{c}")}}));
        assert!(rendered.contains(&c));
        assert_eq!(mentions(&t).len(), 2);
        // Garbage after nostr: is ignored.
        assert!(mentions(&Template::parse("nostr:npub1zzz nostr: nostr:note1x").unwrap()).is_empty());
    }

    #[test]
    fn context_from_snapshot() {
        let ctx = context(
            &json!({"text": "t"}),
            &json!([{"step": "a", "output": {"event_id": "e"}}]),
        );
        assert_eq!(ctx["steps"]["a"]["output"]["event_id"], "e");
        assert_eq!(ctx["trigger"]["text"], "t");
    }
}
