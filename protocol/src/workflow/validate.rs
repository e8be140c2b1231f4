//! Validating a kind 30620 definition: its event (`d`, `h`), its JSON,
//! its trigger and each step (ids, bounds, templates, conditions,
//! webhook URLs and bodies), each error naming its field.

use nostr::prelude::{Event, PublicKey};
use serde_json::Value;

use super::{
    Checking, Definition, Step, Trigger, MAX_FILTER_VALUES, MAX_INTERVAL_SECS, MAX_STEPS, MIN_INTERVAL_SECS,
};
use crate::condition::{Condition, StepShape};
use crate::template::{Template, TemplateError};

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
    #[error("concurrency must be from 1 to {}", super::MAX_CONCURRENCY)]
    BadConcurrency,
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
    if !super::concurrency_fits(d.concurrency) {
        return Err(DefinitionError::BadConcurrency);
    }
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
    let ids: Vec<&str> = earlier.iter().map(|s| s.id).collect();
    if let Some(src) = step.condition() {
        Condition::compile(src, earlier).map_err(|e| DefinitionError::StepField {
            step: id.to_string(),
            field: "if",
            why: e.to_string(),
        })?;
    }
    let template = match step.text() {
        Some(text) => {
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
    step.check(&Checking {
        step: id,
        earlier: &ids,
        template: template.as_ref(),
    })?;
    Ok(template)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::{AskAgent, MessageFilter, OnFailure, Wait, DEFINITION_KIND};
    use nostr::prelude::Tag;
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
            Step::AskAgent(AskAgent {
                wait: Wait::Any,
                on_failure: OnFailure::Continue,
                ..
            })
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
    fn an_answer_shape_types_the_conditions_that_read_it() {
        let agent = Keys::generate().public_key();
        let npub = nostr::prelude::ToBech32::to_bech32(&agent).unwrap();
        let def = |output: serde_json::Value, revise: serde_json::Value, cond: &str| {
            let mut ask = json!({"id": "triage", "action": "ask_agent", "text": format!("nostr:{npub} triage"),
                                 "output": output});
            if !revise.is_null() {
                ask["revise"] = revise;
            }
            let d = json!({"name": "shaped", "trigger": {"on": "manual"}, "steps": [ask,
                {"id": "page", "action": "send_message", "text": "{{steps.triage.output.severity}}", "if": cond}]});
            validate(&def_event(&d, &[("d", "w"), ("h", "c")])).map_err(|e| e.to_string())
        };
        let shape = json!({"type": "object", "required": ["severity"],
            "properties": {"severity": {"type": "string", "enum": ["low", "high"]}, "score": {"type": "integer"}}});
        let v = def(
            shape.clone(),
            json!(3),
            "steps.triage.output.severity == 'high' && steps.triage.output.score > 2",
        )
        .unwrap();
        let Step::AskAgent(ask) = &v.definition.steps[0] else {
            panic!("an ask")
        };
        assert_eq!(ask.revisions(), 3);
        for (output, revise, cond, want) in [
            (
                shape.clone(),
                json!(null),
                "steps.triage.output.severity > 2",
                "step page: if:",
            ),
            (
                shape.clone(),
                json!(null),
                "steps.triage.output.colour == ''",
                "has no field colour",
            ),
            (
                shape.clone(),
                json!(6),
                "true",
                "step triage: revise: 6 is over 5",
            ),
            (
                json!({"type": "object", "properties": {"reply": {"type": "string"}}}),
                json!(null),
                "true",
                "step triage: output: property \"reply\"",
            ),
        ] {
            let got = def(output, revise, cond).unwrap_err();
            assert!(got.starts_with(want) || got.contains(want), "{cond}: {got}");
        }
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
