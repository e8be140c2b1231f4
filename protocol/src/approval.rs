//! Approvals by people (`request_approval`): what a NIP-25 reaction
//! decides, and the tags of the relay's request and decision messages.

use nostr::prelude::{Event, Tag};
use serde::{Deserialize, Serialize};

/// Name of the tag that marks approval messages.
pub const TAG: &str = "workflow-approval";
/// NIP-25 reaction kind.
pub const REACTION_KIND: u16 = 7;

/// How an approval step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approved,
    Denied,
    TimedOut,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approved => "approved",
            Decision::Denied => "denied",
            Decision::TimedOut => "timed_out",
        }
    }

    pub fn parse(s: &str) -> Option<Decision> {
        Some(match s {
            "approved" => Decision::Approved,
            "denied" => Decision::Denied,
            "timed_out" => Decision::TimedOut,
            _ => return None,
        })
    }

    /// What a reaction's content decides: `+` or an emoji starting with 👍
    /// approves, `-` or one starting with 👎 denies; anything else
    /// (another emoji, and the empty content NIP-25 reads as a like) is an
    /// ordinary reaction, so that no approval is given by accident.
    pub fn of_reaction(content: &str) -> Option<Decision> {
        if content == "+" || content.starts_with('\u{1F44D}') {
            Some(Decision::Approved)
        } else if content == "-" || content.starts_with('\u{1F44E}') {
            Some(Decision::Denied)
        } else {
            None
        }
    }
}

/// The event a reaction reacts to: its last `e` tag (NIP-25).
pub fn reacted_to(reaction: &Event) -> Option<&str> {
    reaction
        .tags
        .iter()
        .rev()
        .find(|t| t.kind() == "e")
        .and_then(|t| t.content())
}

/// The tag that marks a relay-signed approval request.
pub fn request_tag() -> Tag {
    Tag::custom(TAG, ["request"])
}

/// Whether an event is an approval request (it carries the request tag).
pub fn is_request(event: &Event) -> bool {
    event
        .tags
        .iter()
        .any(|t| t.kind() == TAG && t.content() == Some("request"))
}

/// Tags of the relay's decision message, threaded under the request
/// (NIP-10 root).
pub fn decision_tags(channel: &str, request_id: &str, run_id: &str, step_id: &str, d: Decision) -> Vec<Tag> {
    vec![
        Tag::custom("h", [channel]),
        Tag::custom("e", [request_id, "", "root"]),
        Tag::custom(TAG, [d.as_str()]),
        Tag::custom("workflow-run", [run_id]),
        Tag::custom("workflow-step", [step_id]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reactions_decide_as_the_contract_says() {
        assert_eq!(Decision::of_reaction("+"), Some(Decision::Approved));
        assert_eq!(Decision::of_reaction("👍"), Some(Decision::Approved));
        assert_eq!(Decision::of_reaction("👍🏽"), Some(Decision::Approved));
        assert_eq!(Decision::of_reaction("-"), Some(Decision::Denied));
        assert_eq!(Decision::of_reaction("👎🏿"), Some(Decision::Denied));
        for other in ["", "❤️", "++", "ok", " +", ":+1:"] {
            assert_eq!(Decision::of_reaction(other), None, "{other:?}");
        }
        for d in [Decision::Approved, Decision::Denied, Decision::TimedOut] {
            assert_eq!(Decision::parse(d.as_str()), Some(d));
        }
    }
}
