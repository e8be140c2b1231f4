//! Revisions of an `ask_agent` answer that did not fit the step's
//! `output`: the finish refused it and left its row waiting (its errors
//! kept, not claimable); the step, when it next looks, either posts a
//! revision message (the step's text, then the errors quoted, threaded
//! under the refused answer, tagged `["workflow-revision", "<n>"]`) and
//! reissues the row on it, or, with no revision left, fails the row
//! `output_invalid`. Both in the engine's transaction, which may sign
//! (the finish takes no lock on the community key).

use nostr::prelude::{Event, PublicKey, Tag};
use protocol::workflow::{self, AskAgent, REVISION_TAG};

use super::message::{sign_admitted, stored_message};
use super::step::{Failure, NewDelivery, StepCtx, StepOutcome};
use crate::delivery::deliveries;
use crate::delivery::rows::{load, Delivery};
use crate::events::rules as events;
use crate::events::InsertOutcome;
use crate::faults;
use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;

/// Revises every row of the current step whose answer was refused.
/// Returns whether there was one (the caller reads its rows again).
pub(crate) async fn revise_refused(
    tx: &mut Tx<'_>,
    c: &StepCtx<'_>,
    ask: &AskAgent,
    out: &mut StepOutcome,
) -> Result<bool, StoreError> {
    let ids = refused_rows(tx, c).await?;
    for id in &ids {
        let Some(d) = load(tx, c.community, id).await? else {
            continue;
        };
        let message = if d.revision < i64::from(ask.revisions()) {
            revision_message(tx, c, ask, &d).await?
        } else {
            None
        };
        let (_, notice) =
            deliveries::revise(tx, c.community, c.keys, &d, message.as_ref().map(|m| &m.0), c.now).await?;
        // Test-only: die in the transaction that revises (after the
        // refused finish committed and woke the run).
        faults::check("revision:after_reissue")?;
        out.published.extend(notice);
        if let Some((ev, raw)) = message {
            out.new_deliveries.push(NewDelivery {
                id: d.id.clone(),
                target: PublicKey::from_slice(&d.target).map_err(|e| StoreError::Corrupt(e.to_string()))?,
                channel: d.channel.clone(),
                definition_event_id: hex::encode(d.definition_event_id),
                run_id: d.run_id.clone(),
                step_id: d.step_id.clone(),
                message_event_id: ev.id.to_hex(),
            });
            out.published.push((ev, raw));
        }
    }
    Ok(!ids.is_empty())
}

/// The ids of the current step's rows waiting for a revision.
async fn refused_rows(tx: &mut Tx<'_>, c: &StepCtx<'_>) -> Result<Vec<String>, StoreError> {
    let rows = tx
        .all(
            Q::new(
                "SELECT id FROM workflow_agent_deliveries WHERE community_id = $1 AND run_id = $2 \
                 AND step_id = $3 AND status = 'pending' AND output_errors IS NOT NULL ORDER BY id",
            )
            .bind(c.community)
            .bind(c.run_id)
            .bind(c.step().id()),
        )
        .await?;
    rows.iter().map(|r| r.text("id")).collect()
}

/// Signs and stores the row's next revision message; `None` when it
/// cannot be posted (the step's message is gone, or the revision would
/// break the admission rule): the row then fails.
async fn revision_message(
    tx: &mut Tx<'_>,
    c: &StepCtx<'_>,
    ask: &AskAgent,
    d: &Delivery,
) -> Result<Option<(Event, String)>, StoreError> {
    let Some(original) = stored_message(tx, c.community, c.run_id, &d.step_id).await? else {
        return Ok(None);
    };
    let n = u32::try_from(d.revision + 1).unwrap_or(u32::MAX);
    let errors: Vec<&str> = d.output_errors.as_deref().unwrap_or_default().lines().collect();
    let schema = ask.output.as_ref().map(|o| o.to_value()).unwrap_or_default();
    let text = workflow::revision_text(&original.content, n, ask.revisions(), &errors, &schema);
    let tags = revision_tags(&original, d, n)?;
    let refused = |_: String| Failure::new("message_too_large", "");
    let Ok((ev, raw)) = sign_admitted(c.keys, text, tags, c.now, c.env.limits, refused)? else {
        return Ok(None);
    };
    match events::insert(tx, c.community, &ev, &raw, Some(&d.channel))
        .await?
        .of_no_deletion()
    {
        InsertOutcome::Stored | InsertOutcome::Duplicate => Ok(Some((ev, raw))),
        InsertOutcome::Rejected(_) => Ok(None),
    }
}

/// The revision's tags: the step message's workflow tags, addressed to
/// the owner and the row's agent, threaded (NIP-10) under the step's
/// thread and replying to the refused answer, and the revision's number.
fn revision_tags(original: &Event, d: &Delivery, n: u32) -> Result<Vec<Tag>, StoreError> {
    let mut tags: Vec<Tag> = original
        .tags
        .iter()
        .filter(|t| !matches!(t.kind(), "p" | "e"))
        .cloned()
        .collect();
    let owner = workflow::tag_values(original, "workflow-owner")
        .first()
        .map(|o| o.to_string());
    let owner = owner.ok_or_else(|| StoreError::Corrupt("a workflow message has no owner tag".into()))?;
    tags.push(Tag::custom("p", [owner.clone()]));
    let target = hex::encode(d.target);
    if target != owner {
        tags.push(Tag::custom("p", [target]));
    }
    let root = original
        .tags
        .iter()
        .map(|t| t.as_slice())
        .find(|s| s.len() >= 4 && s[0] == "e" && s[3] == "root")
        .map_or_else(|| original.id.to_hex(), |s| s[1].clone());
    let replied = d
        .reply_event_id
        .as_deref()
        .map(hex::encode)
        .unwrap_or_else(|| original.id.to_hex());
    let direct = replied == root;
    tags.push(Tag::custom("e", [root, String::new(), "root".into()]));
    if !direct {
        tags.push(Tag::custom("e", [replied, String::new(), "reply".into()]));
    }
    tags.push(Tag::custom(REVISION_TAG, [n.to_string()]));
    Ok(tags)
}
