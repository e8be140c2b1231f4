//! What a `call_webhook` step sends, as pure rules shared by publish-time
//! checks and the relay's engine: the URL's shape, the body template (a
//! JSON value whose strings are templates), its rendering with a bound, and
//! the request's signature.

use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

use crate::template::Template;
use crate::workflow::MAX_URL_BYTES;

/// Largest rendered request body, and largest answer body kept.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Deepest nesting of a body template.
pub const MAX_BODY_DEPTH: usize = 16;
/// Most strings (templates) in one body template.
pub const MAX_BODY_STRINGS: usize = 256;
/// Header carrying the body's HMAC-SHA256 when the step names a secret.
pub const SIGNATURE_HEADER: &str = "X-Workflow-Signature";

/// Checks a step's URL as written: `http` or `https`, a host, no user
/// name or password, no placeholder (the URL is fixed in the definition,
/// so trigger data can never choose where a run's data goes). Whether an
/// `http` URL or a private address is allowed is the community's to say
/// at run time.
pub fn check_url(src: &str) -> Result<url::Url, String> {
    if src.len() > MAX_URL_BYTES {
        return Err(format!("longer than {MAX_URL_BYTES} bytes"));
    }
    if src.contains("{{") {
        return Err("is fixed: placeholders are not allowed in a URL".into());
    }
    let url = url::Url::parse(src).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("must be an http or https URL".into());
    }
    if url.host().is_none() {
        return Err("needs a host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry a user name or password (use a secret)".into());
    }
    Ok(url)
}

/// Checks a body template: every string parses as a template naming
/// known values of earlier steps; bounded depth and size.
pub fn check_body(body: &Value, earlier_steps: &[&str]) -> Result<(), String> {
    let mut strings = 0usize;
    walk_check(body, earlier_steps, 0, &mut strings)
}

fn walk_check(v: &Value, earlier: &[&str], depth: usize, strings: &mut usize) -> Result<(), String> {
    if depth > MAX_BODY_DEPTH {
        return Err(format!("nested deeper than {MAX_BODY_DEPTH}"));
    }
    match v {
        Value::String(s) => {
            *strings += 1;
            if *strings > MAX_BODY_STRINGS {
                return Err(format!("more than {MAX_BODY_STRINGS} strings"));
            }
            Template::parse(s)
                .and_then(|t| t.check(earlier))
                .map_err(|e| e.to_string())
        }
        Value::Array(items) => items
            .iter()
            .try_for_each(|x| walk_check(x, earlier, depth + 1, strings)),
        Value::Object(map) => map
            .values()
            .try_for_each(|x| walk_check(x, earlier, depth + 1, strings)),
        _ => Ok(()),
    }
}

/// Why a body could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("the request body would be more than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error("the body template does not render to JSON: {0}")]
    NotJson(String),
    #[error("the body template does not parse: {0}")]
    Template(String),
}

/// Renders a body template against a run's context to the bytes sent.
/// A string that is one placeholder alone (`"{{trigger.body}}"`) becomes
/// the JSON value it names; other strings render as text. A body that is
/// one string must render to JSON. `None` sends `{}`.
pub fn render_body(body: Option<&Value>, ctx: &Value) -> Result<String, BodyError> {
    let Some(body) = body else {
        return Ok("{}".into());
    };
    let mut budget = MAX_BODY_BYTES;
    let rendered = match body {
        Value::String(s) => {
            let text = render_text(s, ctx, &mut budget)?;
            serde_json::from_str::<Value>(&text).map_err(|e| BodyError::NotJson(e.to_string()))?
        }
        other => render_value(other, ctx, &mut budget)?,
    };
    let out = rendered.to_string();
    if out.len() > MAX_BODY_BYTES {
        return Err(BodyError::TooLarge);
    }
    Ok(out)
}

fn render_text(src: &str, ctx: &Value, budget: &mut usize) -> Result<String, BodyError> {
    let t = Template::parse(src).map_err(|e| BodyError::Template(e.to_string()))?;
    let text = t.render_bounded(ctx, *budget).map_err(|_| BodyError::TooLarge)?;
    *budget -= text.len();
    Ok(text)
}

fn render_value(v: &Value, ctx: &Value, budget: &mut usize) -> Result<Value, BodyError> {
    Ok(match v {
        Value::String(s) => match lone_placeholder(s) {
            Some(path) => {
                let found = lookup(ctx, &path).clone();
                let bytes = found.to_string().len();
                *budget = budget.checked_sub(bytes).ok_or(BodyError::TooLarge)?;
                found
            }
            None => Value::String(render_text(s, ctx, budget)?),
        },
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|x| render_value(x, ctx, budget))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, x)| Ok((k.clone(), render_value(x, ctx, budget)?)))
                .collect::<Result<_, BodyError>>()?,
        ),
        other => other.clone(),
    })
}

/// The path of a string that is exactly one placeholder, `{{ a.b }}`.
fn lone_placeholder(s: &str) -> Option<Vec<String>> {
    let t = Template::parse(s).ok()?;
    let mut vars = t.variables();
    let path = vars.next()?.to_vec();
    let trimmed = s.trim();
    let alone = vars.next().is_none()
        && trimmed.starts_with("{{")
        && trimmed.ends_with("}}")
        && trimmed[2..trimmed.len() - 2].trim() == path.join(".");
    alone.then_some(path)
}

fn lookup<'v>(ctx: &'v Value, path: &[String]) -> &'v Value {
    path.iter().fold(ctx, |v, seg| v.get(seg).unwrap_or(&Value::Null))
}

/// `sha256=<hex HMAC-SHA256 of body keyed by secret>`, the value of
/// [`SIGNATURE_HEADER`].
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The `Idempotency-Key` of a step's call: the same for every attempt.
pub fn idempotency_key(run_id: &str, step_id: &str) -> String {
    format!("{run_id}:{step_id}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx() -> Value {
        json!({"trigger": {"text": "say \"hi\"", "body": {"n": 3, "tags": ["a", "b"]}},
               "steps": {"ask": {"output": {"reply": "ok"}}}})
    }

    #[test]
    fn urls_are_fixed_http_or_https_without_credentials() {
        assert!(check_url("https://hooks.example.com/x?y=1").is_ok());
        assert!(check_url("http://10.0.0.1:8080/x").is_ok());
        for (bad, why) in [
            ("ftp://example.com/", "http or https"),
            ("https://u:p@example.com/", "user name"),
            ("https://example.com/{{trigger.text}}", "placeholders"),
            ("not a url", "not a URL"),
        ] {
            let got = check_url(bad).unwrap_err();
            assert!(got.contains(why), "{bad}: {got}");
        }
        assert!(check_url(&format!("https://e.com/{}", "a".repeat(MAX_URL_BYTES))).is_err());
    }

    #[test]
    fn bodies_render_values_and_escape_text() {
        let body = json!({"n": "{{trigger.body.n}}", "tags": "{{ trigger.body.tags }}",
                          "text": "got: {{trigger.text}}", "fixed": [1, true, null], "reply": "{{steps.ask.output.reply}}"});
        check_body(&body, &["ask"]).unwrap();
        let out: Value = serde_json::from_str(&render_body(Some(&body), &ctx()).unwrap()).unwrap();
        assert_eq!(
            out,
            json!({"n": 3, "tags": ["a", "b"], "text": "got: say \"hi\"", "fixed": [1, true, null], "reply": "ok"})
        );
        assert_eq!(render_body(None, &ctx()).unwrap(), "{}");
        // One string: its rendering must be JSON.
        let raw = json!("{\"n\": {{trigger.body.n}}}");
        assert_eq!(render_body(Some(&raw), &ctx()).unwrap(), "{\"n\":3}");
        let broken = json!("{\"t\": {{trigger.text}}}");
        assert!(matches!(
            render_body(Some(&broken), &ctx()),
            Err(BodyError::NotJson(_))
        ));
    }

    #[test]
    fn bodies_are_checked_and_bounded() {
        assert!(check_body(&json!({"x": "{{steps.later.output.x}}"}), &["ask"]).is_err());
        assert!(check_body(&json!({"x": "{{nope}}"}), &[]).is_err());
        let mut deep = json!("x");
        for _ in 0..=MAX_BODY_DEPTH {
            deep = json!([deep]);
        }
        assert!(check_body(&deep, &[]).unwrap_err().contains("deeper"));
        let many: Vec<Value> = (0..=MAX_BODY_STRINGS).map(|_| json!("s")).collect();
        assert!(check_body(&Value::Array(many), &[]).is_err());
        // Rendering multiplies trigger data: bounded.
        let big = json!({"trigger": {"body": {"x": "y".repeat(40_000)}}});
        let twice = json!({"a": "{{trigger.body.x}}", "b": "{{trigger.body.x}}"});
        assert_eq!(render_body(Some(&twice), &big), Err(BodyError::TooLarge));
        let text_twice = json!({"a": "1{{trigger.body.x}}", "b": "2{{trigger.body.x}}"});
        assert_eq!(render_body(Some(&text_twice), &big), Err(BodyError::TooLarge));
    }

    #[test]
    fn signature_is_hex_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(idempotency_key("r1", "call"), "r1:call");
    }
}
