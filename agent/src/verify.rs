//! Everything the agent checks before it dispatches a delivery
//! (docs/agent.md, "`agent run`", step 3). Pure: the events are fetched by the caller.
//! Any failure has a stable code and the delivery is finished `failed`
//! with it; nothing is dispatched.

use nostr::prelude::{Event, PublicKey};
use protocol::template::{self, Template};
use protocol::workflow;

use crate::api::Delivery;

/// A verification failure: code and explanation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: &'static str,
    pub message: String,
}

fn fail<T>(code: &'static str, message: impl Into<String>) -> Result<T, Failure> {
    Err(Failure {
        code,
        message: message.into(),
    })
}

/// Who the agent trusts.
#[derive(Debug, Clone)]
pub struct Trust {
    /// The agent itself.
    pub me: PublicKey,
    /// The community's relay key (NIP-11 `self`).
    pub relay: PublicKey,
    /// The agent's NIP-OA owner.
    pub owner: PublicKey,
    /// Other pubkeys whose definitions are accepted.
    pub allowed: Vec<PublicKey>,
}

/// The bindings a wake hint names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wake {
    pub delivery_id: String,
    pub channel: String,
    pub definition_event_id: String,
    pub run_id: String,
    pub step_id: String,
    pub message_event_id: String,
    /// How long until its row is due (a mention waits out the
    /// conversation's debounce), at most [`MAX_DUE_IN_SECS`].
    pub due_in_secs: u64,
}

/// The longest wait a wake's `due-in` may ask for before its claim.
pub const MAX_DUE_IN_SECS: u64 = 60;

impl Wake {
    /// The `expected` bindings of a claim by id.
    pub fn expected(&self) -> protocol::api::Expected {
        protocol::api::Expected {
            run_id: self.run_id.clone(),
            step_id: self.step_id.clone(),
            definition_event_id: self.definition_event_id.clone(),
            message_event_id: self.message_event_id.clone(),
            channel: self.channel.clone(),
        }
    }
}

fn single<'e>(e: &'e Event, name: &str) -> Option<&'e str> {
    let values = workflow::tag_values(e, name);
    (values.len() == 1).then(|| values[0])
}

/// Checks a wake hint: a valid event signed by the relay, kind 24620, exactly
/// one `p` (this agent) and one `h`, and every binding tag present.
pub fn check_wake(ev: &Event, trust: &Trust) -> Result<Wake, Failure> {
    if ev.kind.as_u16() != protocol::kinds::WAKE_HINT || ev.pubkey != trust.relay || ev.verify().is_err() {
        return fail(
            "wake_invalid",
            "wake is not a kind 24620 validly signed by the relay",
        );
    }
    let me = trust.me.to_hex();
    if single(ev, "p") != Some(me.as_str()) {
        return fail("wake_invalid", "wake must name exactly one p: this agent");
    }
    let (Some(channel), Some(delivery), Some(def), Some(run), Some(step), Some(msg)) = (
        single(ev, "h"),
        single(ev, "delivery"),
        single(ev, "workflow-definition"),
        single(ev, "workflow-run"),
        single(ev, "workflow-step"),
        single(ev, "e"),
    ) else {
        return fail("wake_invalid", "wake lacks a binding tag or repeats one");
    };
    let due_in_secs = single(ev, "due-in")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0)
        .min(MAX_DUE_IN_SECS);
    Ok(Wake {
        delivery_id: delivery.into(),
        channel: channel.into(),
        definition_event_id: def.into(),
        run_id: run.into(),
        step_id: step.into(),
        message_event_id: msg.into(),
        due_in_secs,
    })
}

/// A delivery that passed every check.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The workflow definition (none for a mention).
    pub definition: Option<Event>,
    pub message: Event,
    /// The rendered text (equal to the message content).
    pub text: String,
}

/// The claimed delivery is the one its wake hint named.
fn check_wake_binding(d: &Delivery, wake: Option<&Wake>) -> Result<(), Failure> {
    let Some(w) = wake else { return Ok(()) };
    let same = w.delivery_id == d.id
        && w.channel == d.channel
        && w.run_id == d.run_id
        && w.step_id == d.step_id
        && w.definition_event_id.eq_ignore_ascii_case(&d.definition_event_id)
        && w.message_event_id.eq_ignore_ascii_case(&d.message_event_id);
    if !same {
        return fail(
            "wake_binding_mismatch",
            "the claimed delivery does not match its wake hint",
        );
    }
    Ok(())
}

/// Verifies a claimed delivery against its wake (if any), the definition and
/// the message fetched by id.
pub fn verify(
    d: &Delivery,
    wake: Option<&Wake>,
    definition: Option<&Event>,
    message: Option<&Event>,
    trust: &Trust,
) -> Result<Verified, Failure> {
    check_wake_binding(d, wake)?;
    if !d.target_pubkey.eq_ignore_ascii_case(&trust.me.to_hex()) {
        return fail("target_mismatch", "the delivery is not addressed to this agent");
    }

    // The exact definition revision.
    let Some(def) = definition else {
        return fail(
            "definition_unverifiable",
            "the definition revision could not be fetched",
        );
    };
    if def.id.to_hex() != d.definition_event_id.to_ascii_lowercase() || def.verify().is_err() {
        return fail(
            "definition_unverifiable",
            "the definition's id or signature is not valid",
        );
    }
    if def.kind.as_u16() != workflow::DEFINITION_KIND {
        return fail("definition_unverifiable", "the definition is not a kind 30620");
    }
    if single(def, "d") != Some(d.workflow_id.as_str()) || single(def, "h") != Some(d.channel.as_str()) {
        return fail(
            "definition_unverifiable",
            "the definition's d/h tags do not match the delivery",
        );
    }
    if def.pubkey != trust.owner && !trust.allowed.contains(&def.pubkey) {
        return fail(
            "owner_not_allowed",
            format!(
                "definition signed by {}, not this agent's owner",
                def.pubkey.to_hex()
            ),
        );
    }
    let parsed = match workflow::parse(&def.content) {
        Ok(p) => p,
        Err(e) => return fail("definition_unverifiable", e.to_string()),
    };

    // The exact message.
    let Some(msg) = message else {
        return fail(
            "message_unverifiable",
            "the workflow message could not be fetched",
        );
    };
    if msg.id.to_hex() != d.message_event_id.to_ascii_lowercase() || msg.verify().is_err() {
        return fail(
            "message_unverifiable",
            "the message's id or signature is not valid",
        );
    }
    if msg.kind.as_u16() != workflow::MESSAGE_KIND || msg.pubkey != trust.relay {
        return fail(
            "message_unverifiable",
            "the message is not a kind 9 signed by the relay",
        );
    }
    if single(msg, "h") != Some(d.channel.as_str()) {
        return fail("message_binding_mismatch", "the message is in another channel");
    }
    let me = trust.me.to_hex();
    if !workflow::tag_values(msg, "p").contains(&me.as_str()) {
        return fail("message_binding_mismatch", "the message does not name this agent");
    }
    let def_tag = workflow::tag_slice(msg, "workflow-definition");
    let def_ok = def_tag.is_some_and(|t| {
        t.len() >= 3 && t[1].eq_ignore_ascii_case(&d.definition_event_id) && t[2] == d.step_id
    });
    if !def_ok
        || single(msg, "workflow-run") != Some(d.run_id.as_str())
        || single(msg, "workflow-step") != Some(d.step_id.as_str())
        || single(msg, "workflow-owner") != Some(def.pubkey.to_hex().as_str())
    {
        return fail(
            "message_binding_mismatch",
            "the message's workflow tags do not match the delivery",
        );
    }
    // The cause, explicitly: the message's cause tag must be the snapshot's.
    let cause = &d.trigger_context["cause"];
    let cause_tag = workflow::tag_slice(msg, "workflow-cause");
    let cause_ok = cause_tag.is_some_and(|t| {
        t.len() >= 3
            && Some(t[1].as_str()) == cause["type"].as_str()
            && Some(t[2].as_str()) == cause["id"].as_str()
    });
    if !cause_ok {
        return fail(
            "cause_mismatch",
            "the message's cause is not the delivery's trigger",
        );
    }

    // The step, and the text rendered again from the snapshot.
    let Some(step) = parsed.steps.iter().find(|s| s.id() == d.step_id) else {
        return fail(
            "step_not_found",
            format!("step {} is not in the definition", d.step_id),
        );
    };
    // Only steps that post a message make deliveries; `ask_agent` messages
    // are checked exactly as `send_message` ones.
    let Some((text, _)) = step.message() else {
        return fail(
            "step_not_a_message",
            format!("step {} does not post a message", d.step_id),
        );
    };
    let Ok(tpl) = Template::parse(text) else {
        return fail("definition_unverifiable", "the step's template does not parse");
    };
    let rendered = tpl.render(&template::context(&d.trigger_context, &d.execution_trace));
    check_revision(d, msg, &rendered)?;
    if step.output() != d.output.as_ref() {
        return fail(
            "output_mismatch",
            "the delivery's output schema is not the step's",
        );
    }
    Ok(Verified {
        definition: Some(def.clone()),
        message: msg.clone(),
        text: msg.content.clone(),
    })
}

/// Verifies a claimed mention (docs/protocol.md, "Mentions"): no
/// workflow, so what is checked is the message itself (by id, signed by
/// its author, a kind 9 in the delivery's channel naming this agent, not
/// by this agent nor the relay), that the row is bound to it (its run and
/// definition are the message's id), and that the author is a member: on
/// the channel's member list (kind 39002, `d` the channel) signed by the
/// relay. `accept` is the agent's own `mentions` setting: when off, every
/// mention fails `mentions_off`.
pub fn verify_mention(
    d: &Delivery,
    wake: Option<&Wake>,
    message: Option<&Event>,
    members: Option<&Event>,
    trust: &Trust,
    accept: bool,
) -> Result<Verified, Failure> {
    if !accept {
        return fail(
            "mentions_off",
            "this agent takes no mentions (its `mentions` setting)",
        );
    }
    check_wake_binding(d, wake)?;
    let me = trust.me.to_hex();
    if !d.target_pubkey.eq_ignore_ascii_case(&me) {
        return fail("target_mismatch", "the delivery is not addressed to this agent");
    }
    let Some(msg) = message else {
        return fail("message_unverifiable", "the mention could not be fetched");
    };
    let id = msg.id.to_hex();
    if id != d.message_event_id.to_ascii_lowercase() || msg.verify().is_err() {
        return fail(
            "message_unverifiable",
            "the message's id or signature is not valid",
        );
    }
    if msg.kind.as_u16() != workflow::MESSAGE_KIND || msg.pubkey == trust.me || msg.pubkey == trust.relay {
        return fail(
            "message_unverifiable",
            "a mention is a kind 9 by someone other than this agent and the relay",
        );
    }
    if single(msg, "h") != Some(d.channel.as_str()) {
        return fail("message_binding_mismatch", "the message is in another channel");
    }
    if !workflow::tag_values(msg, "p").contains(&me.as_str()) {
        return fail("message_binding_mismatch", "the message does not name this agent");
    }
    let bound = d.run_id == id
        && d.definition_event_id.eq_ignore_ascii_case(&id)
        && d.step_id == protocol::api::MENTION_STEP;
    if !bound {
        return fail(
            "message_binding_mismatch",
            "the delivery is not bound to this message",
        );
    }
    check_member(msg, &d.channel, members, trust)?;
    Ok(Verified {
        definition: None,
        message: msg.clone(),
        text: msg.content.clone(),
    })
}

/// The message's author is on the channel's member list signed by the relay.
fn check_member(msg: &Event, channel: &str, members: Option<&Event>, trust: &Trust) -> Result<(), Failure> {
    let Some(list) = members else {
        return fail(
            "author_not_member",
            "the channel's member list could not be fetched",
        );
    };
    let valid = list.kind.as_u16() == protocol::nip29::GROUP_MEMBERS
        && list.pubkey == trust.relay
        && single(list, "d") == Some(channel)
        && list.verify().is_ok();
    if !valid {
        return fail(
            "author_not_member",
            "the member list is not the channel's kind 39002 signed by the relay",
        );
    }
    let author = msg.pubkey.to_hex();
    if !workflow::tag_values(list, "p").contains(&author.as_str()) {
        return fail(
            "author_not_member",
            "the mention's author is not a member of the channel",
        );
    }
    Ok(())
}

/// The message is the step's text rendered again: exactly, or (revision
/// n, as the claim says and its `workflow-revision` tag) followed by the
/// separator and the errors that refused the last answer.
fn check_revision(d: &Delivery, msg: &Event, rendered: &str) -> Result<(), Failure> {
    let tagged = workflow::tag_values(msg, workflow::REVISION_TAG);
    let fits = match (tagged.as_slice(), d.revision) {
        ([], 0) => msg.content == rendered,
        ([n], revision) if revision > 0 && n.parse::<u32>() == Ok(revision) => msg
            .content
            .strip_prefix(rendered)
            .is_some_and(|rest| rest.starts_with(workflow::REVISION_SEPARATOR)),
        _ => {
            return fail(
                "revision_mismatch",
                "the message's revision is not the delivery's",
            )
        }
    };
    if !fits {
        return fail(
            "render_mismatch",
            "rendering the template from the snapshot does not give the message",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind, Tag};
    use protocol::workflow::{Cause, MessageBinding};
    use serde_json::json;

    struct World {
        relay: Keys,
        owner: Keys,
        agent: Keys,
        def: Event,
        msg: Event,
        d: Delivery,
    }

    fn world() -> World {
        world_with(json!({"id": "s", "action": "send_message", "text": "hi {{trigger.text}}"}))
    }

    /// A world whose definition's one step is `step` (id `s`).
    fn world_with(step: serde_json::Value) -> World {
        let relay = Keys::generate();
        let owner = Keys::generate();
        let agent = Keys::generate();
        let content = json!({"name": "w", "trigger": {"on": "message_posted"}, "steps": [step]});
        let def = EventBuilder::new(Kind::from_u16(30620), content.to_string())
            .tags([Tag::identifier("w"), Tag::custom("h", ["ops"])])
            .finalize(&owner)
            .unwrap();
        let cause = Cause {
            kind: protocol::api::CauseKind::Event,
            id: "ab".repeat(32),
        };
        let tags = workflow::message_tags(&MessageBinding {
            channel: "ops",
            definition_event_id: &def.id.to_hex(),
            step_id: "s",
            run_id: "r1",
            owner: &owner.public_key(),
            cause: &cause,
            recipients: &[owner.public_key(), agent.public_key()],
            reply_to: None,
        });
        let msg = EventBuilder::new(Kind::from_u16(9), "hi there")
            .tags(tags)
            .finalize(&relay)
            .unwrap();
        let d = Delivery {
            id: "d1".into(),
            workflow_id: "w".into(),
            run_id: "r1".into(),
            step_id: "s".into(),
            definition_event_id: def.id.to_hex(),
            message_event_id: msg.id.to_hex(),
            channel: "ops".into(),
            target_pubkey: agent.public_key().to_hex(),
            attempt: 1,
            claim_token: "t".into(),
            claim_expires_at: 0,
            expires_at: 0,
            trigger_context: json!({"text": "there", "cause": {"type": "event", "id": "ab".repeat(32)}}),
            execution_trace: json!([]),
            output: None,
            revision: 0,
            traceparent: None,
            source: Default::default(),
            conversation: String::new(),
            turn: Vec::new(),
        };
        World {
            relay,
            owner,
            agent,
            def,
            msg,
            d,
        }
    }

    fn trust(w: &World) -> Trust {
        Trust {
            me: w.agent.public_key(),
            relay: w.relay.public_key(),
            owner: w.owner.public_key(),
            allowed: vec![],
        }
    }

    fn code(r: Result<Verified, Failure>) -> &'static str {
        r.map(|_| "ok").unwrap_or_else(|f| f.code)
    }

    #[test]
    fn a_good_delivery_verifies() {
        let w = world();
        let v = verify(&w.d, None, Some(&w.def), Some(&w.msg), &trust(&w)).unwrap();
        assert_eq!(v.text, "hi there");
    }

    #[test]
    fn ask_agent_messages_are_checked_like_send_message() {
        let w = world_with(
            json!({"id": "s", "action": "ask_agent", "text": "hi {{trigger.text}}", "wait": "any"}),
        );
        let v = verify(&w.d, None, Some(&w.def), Some(&w.msg), &trust(&w)).unwrap();
        assert_eq!(v.text, "hi there");
        let mut d = w.d.clone();
        d.trigger_context["text"] = json!("edited");
        assert_eq!(
            code(verify(&d, None, Some(&w.def), Some(&w.msg), &trust(&w))),
            "render_mismatch"
        );
        let w = world_with(json!({"id": "s", "action": "delay", "secs": 5}));
        assert_eq!(
            code(verify(&w.d, None, Some(&w.def), Some(&w.msg), &trust(&w))),
            "step_not_a_message"
        );
    }

    #[test]
    fn a_revision_is_the_step_text_then_the_errors_and_the_shape_must_be_the_steps() {
        let shape = json!({"type": "object", "properties": {"severity": {"type": "string"}}});
        let w = world_with(
            json!({"id": "s", "action": "ask_agent", "text": "hi {{trigger.text}}", "output": shape}),
        );
        let schema: workflow::OutputSchema = serde_json::from_value(shape.clone()).unwrap();
        let revised = |text: &str, n: &str| {
            let mut tags: Vec<Tag> = w.msg.tags.iter().cloned().collect();
            tags.push(Tag::custom(workflow::REVISION_TAG, [n]));
            EventBuilder::new(Kind::from_u16(9), text)
                .tags(tags)
                .finalize(&w.relay)
                .unwrap()
        };
        let on = |msg: &Event, revision: u32, output: Option<workflow::OutputSchema>| {
            let mut d = w.d.clone();
            d.message_event_id = msg.id.to_hex();
            d.revision = revision;
            d.output = output;
            code(verify(&d, None, Some(&w.def), Some(msg), &trust(&w)))
        };
        let text = workflow::revision_text("hi there", 1, 2, &["/severity: 3 is not a string"], &shape);
        let good = revised(&text, "1");
        assert_eq!(on(&good, 1, Some(schema.clone())), "ok");
        let mut d = w.d.clone();
        (d.message_event_id, d.revision, d.output) = (good.id.to_hex(), 1, Some(schema.clone()));
        let v = verify(&d, None, Some(&w.def), Some(&good), &trust(&w)).unwrap();
        assert!(
            v.text.contains("3 is not a string"),
            "the agent is shown the errors"
        );
        assert_eq!(on(&good, 2, Some(schema.clone())), "revision_mismatch");
        assert_eq!(on(&good, 0, Some(schema.clone())), "revision_mismatch");
        assert_eq!(on(&w.msg, 1, Some(schema.clone())), "revision_mismatch");
        let edited = revised(&text.replace("hi there", "hi elsewhere"), "1");
        assert_eq!(on(&edited, 1, Some(schema.clone())), "render_mismatch");
        assert_eq!(
            on(&revised("hi there and more", "1"), 1, Some(schema.clone())),
            "render_mismatch"
        );
        assert_eq!(on(&w.msg, 0, Some(schema)), "ok");
        assert_eq!(on(&w.msg, 0, None), "output_mismatch");
    }

    #[test]
    fn every_failure_has_its_code() {
        let w = world();
        let t = trust(&w);
        let v = |d: &Delivery, def: Option<&Event>, msg: Option<&Event>| code(verify(d, None, def, msg, &t));
        assert_eq!(v(&w.d, None, Some(&w.msg)), "definition_unverifiable");
        assert_eq!(v(&w.d, Some(&w.msg), Some(&w.msg)), "definition_unverifiable");
        assert_eq!(v(&w.d, Some(&w.def), None), "message_unverifiable");
        let mut d = w.d.clone();
        d.trigger_context["text"] = json!("edited");
        assert_eq!(v(&d, Some(&w.def), Some(&w.msg)), "render_mismatch");
        let mut d = w.d.clone();
        d.trigger_context["cause"]["id"] = json!("cd".repeat(32));
        assert_eq!(v(&d, Some(&w.def), Some(&w.msg)), "cause_mismatch");
        let mut d = w.d.clone();
        d.run_id = "r2".into();
        assert_eq!(v(&d, Some(&w.def), Some(&w.msg)), "message_binding_mismatch");
        let mut d = w.d.clone();
        d.workflow_id = "other".into();
        assert_eq!(v(&d, Some(&w.def), Some(&w.msg)), "definition_unverifiable");
        let mut d = w.d.clone();
        d.target_pubkey = Keys::generate().public_key().to_hex();
        assert_eq!(v(&d, Some(&w.def), Some(&w.msg)), "target_mismatch");
        // A definition signed by someone else.
        let stranger = Keys::generate();
        let def2 = EventBuilder::new(Kind::from_u16(30620), w.def.content.clone())
            .tags([Tag::identifier("w"), Tag::custom("h", ["ops"])])
            .finalize(&stranger)
            .unwrap();
        let mut d = w.d.clone();
        d.definition_event_id = def2.id.to_hex();
        assert_eq!(v(&d, Some(&def2), Some(&w.msg)), "owner_not_allowed");
        // A message not signed by the relay.
        let forged = EventBuilder::new(Kind::from_u16(9), "hi there")
            .tags(w.msg.tags.clone())
            .finalize(&stranger)
            .unwrap();
        let mut d = w.d.clone();
        d.message_event_id = forged.id.to_hex();
        assert_eq!(v(&d, Some(&w.def), Some(&forged)), "message_unverifiable");
        // A wake that names other bindings.
        let wake = Wake {
            delivery_id: "d1".into(),
            channel: "ops".into(),
            definition_event_id: w.d.definition_event_id.clone(),
            run_id: "r9".into(),
            step_id: "s".into(),
            message_event_id: w.d.message_event_id.clone(),
            due_in_secs: 0,
        };
        assert_eq!(
            code(verify(&w.d, Some(&wake), Some(&w.def), Some(&w.msg), &t)),
            "wake_binding_mismatch"
        );
    }

    #[test]
    fn wakes_are_checked() {
        let w = world();
        let t = trust(&w);
        let tags = workflow::wake_tags(
            &w.agent.public_key(),
            "ops",
            "d1",
            &w.d.definition_event_id,
            "r1",
            "s",
            &w.d.message_event_id,
        );
        let good = EventBuilder::new(Kind::from_u16(24620), "")
            .tags(tags.clone())
            .finalize(&w.relay)
            .unwrap();
        assert_eq!(check_wake(&good, &t).unwrap().delivery_id, "d1");
        let forged = EventBuilder::new(Kind::from_u16(24620), "")
            .tags(tags.clone())
            .finalize(&w.owner)
            .unwrap();
        assert_eq!(check_wake(&forged, &t).unwrap_err().code, "wake_invalid");
        let mut two_p = tags.clone();
        two_p.push(Tag::custom("p", [w.owner.public_key().to_hex()]));
        let ev = EventBuilder::new(Kind::from_u16(24620), "")
            .tags(two_p)
            .finalize(&w.relay)
            .unwrap();
        assert_eq!(check_wake(&ev, &t).unwrap_err().code, "wake_invalid");
        let no_h: Vec<Tag> = tags.into_iter().filter(|t| t.kind() != "h").collect();
        let ev = EventBuilder::new(Kind::from_u16(24620), "")
            .tags(no_h)
            .finalize(&w.relay)
            .unwrap();
        assert_eq!(check_wake(&ev, &t).unwrap_err().code, "wake_invalid");
    }

    /// A mention of the world's agent by `author` in `ops`, its row, and
    /// the channel's member list signed by `signer` listing `members`.
    fn mention(w: &World, author: &Keys, signer: &Keys, members: &[&Keys]) -> (Event, Delivery, Event) {
        let msg = EventBuilder::new(Kind::from_u16(9), "@agent can you check this?")
            .tags([
                Tag::custom("h", ["ops"]),
                Tag::custom("p", [w.agent.public_key().to_hex()]),
            ])
            .finalize(author)
            .unwrap();
        let id = msg.id.to_hex();
        let d = Delivery {
            workflow_id: String::new(),
            run_id: id.clone(),
            step_id: protocol::api::MENTION_STEP.into(),
            definition_event_id: id.clone(),
            message_event_id: id,
            source: protocol::api::DeliverySource::Mention,
            ..w.d.clone()
        };
        let mut tags = vec![Tag::identifier("ops")];
        tags.extend(
            members
                .iter()
                .map(|k| Tag::custom("p", [k.public_key().to_hex()])),
        );
        let list = EventBuilder::new(Kind::from_u16(protocol::nip29::GROUP_MEMBERS), "")
            .tags(tags)
            .finalize(signer)
            .unwrap();
        (msg, d, list)
    }

    #[test]
    fn a_mention_by_a_member_verifies_and_nothing_else_does() {
        let w = world();
        let t = trust(&w);
        let person = Keys::generate();
        let (msg, d, list) = mention(&w, &person, &w.relay, &[&person, &w.agent]);
        let check = |d: &Delivery, msg: &Event, list: &Event, accept: bool| {
            code(verify_mention(d, None, Some(msg), Some(list), &t, accept))
        };
        let v = verify_mention(&d, None, Some(&msg), Some(&list), &t, true).unwrap();
        assert_eq!(v.text, "@agent can you check this?");
        assert!(v.definition.is_none());
        assert_eq!(check(&d, &msg, &list, false), "mentions_off");
        // The author is not on the list; the list is not the relay's.
        let (_, _, others) = mention(&w, &person, &w.relay, &[&w.agent]);
        assert_eq!(check(&d, &msg, &others, true), "author_not_member");
        let (_, _, forged) = mention(&w, &person, &person, &[&person]);
        assert_eq!(check(&d, &msg, &forged, true), "author_not_member");
        assert_eq!(
            code(verify_mention(&d, None, Some(&msg), None, &t, true)),
            "author_not_member"
        );
        // A mention by the agent itself, or by the relay.
        let (own, own_d, own_list) = mention(&w, &w.agent, &w.relay, &[&w.agent]);
        assert_eq!(check(&own_d, &own, &own_list, true), "message_unverifiable");
        let (by_relay, relay_d, _) = mention(&w, &w.relay, &w.relay, &[]);
        assert_eq!(check(&relay_d, &by_relay, &list, true), "message_unverifiable");
        // A row bound to another message, or another step.
        let mut other = d.clone();
        other.run_id = "ab".repeat(32);
        assert_eq!(check(&other, &msg, &list, true), "message_binding_mismatch");
        let mut other = d.clone();
        other.step_id = "s".into();
        assert_eq!(check(&other, &msg, &list, true), "message_binding_mismatch");
        let mut other = d.clone();
        other.channel = "elsewhere".into();
        assert_eq!(check(&other, &msg, &list, true), "message_binding_mismatch");
        let mut other = d.clone();
        other.message_event_id = "cd".repeat(32);
        assert_eq!(check(&other, &msg, &list, true), "message_unverifiable");
    }
}
