//! The call writer's calls (`group.rs` runs them): one type per call, each
//! with its arguments, its locks and its reply. The work itself is in
//! `deliveries.rs` and `channels.rs`.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use nostr::prelude::{Event, Keys, PublicKey};
use protocol::api::{ClaimRequest, FinishRequest, OperationRequest, Outcome, RenewRequest};

use crate::channels::rules as channels;
use crate::config::{ChannelPolicy, DeliveryConfig};
use crate::delivery::claim::{NamedClaim, Turn};
use crate::delivery::deliveries;
use crate::delivery::deliveries::Finished;
use crate::events::rules::author_lock_key;
use crate::events::InsertOutcome;
use crate::persistence::db::Tx;
use crate::refusal::Answer;
use crate::store::group::{ClaimsTogether, WriteCall};

/// Nothing but the job's auth record (a NIP-98 request that writes nothing
/// else): submitted with `Calls::run_spending`. Its record is written
/// before the calls run (`spend_all`): a replay never gets to `run`.
pub(crate) struct HttpAuth {
    pub community: String,
}

impl WriteCall for HttpAuth {
    type Reply = ();

    fn community(&self) -> &str {
        &self.community
    }

    fn caller(&self) -> Option<&PublicKey> {
        None
    }

    fn refuses_before_writing(&self) -> bool {
        true
    }

    fn run<'a>(&'a self, _tx: &'a mut Tx<'_>, _cfg: &'a DeliveryConfig) -> BoxFuture<'a, Answer<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// `POST /deliveries/claim`.
pub(crate) struct Claim {
    pub community: String,
    pub caller: PublicKey,
    pub req: ClaimRequest,
    /// The community's key: a mention's `working` status is signed with it.
    pub keys: Keys,
}

/// A claim's answer: the rows claimed (a turn), if any, and for a
/// mention's the status each sender is sent (announced in the claim's
/// transaction).
pub type Claimed = (Option<Turn>, Vec<(Event, String)>);

impl WriteCall for Claim {
    type Reply = Claimed;

    fn community(&self) -> &str {
        &self.community
    }

    fn caller(&self) -> Option<&PublicKey> {
        Some(&self.caller)
    }

    fn refuses_before_writing(&self) -> bool {
        true
    }

    /// A claim (one cheap statement) starts an agent's work.
    fn starts_work(&self) -> bool {
        true
    }

    fn run<'a>(&'a self, tx: &'a mut Tx<'_>, cfg: &'a DeliveryConfig) -> BoxFuture<'a, Answer<Self::Reply>> {
        Box::pin(async move {
            let claimed =
                crate::delivery::claim::claim(tx, &self.community, &self.caller, &self.req, cfg).await?;
            Ok(self.reply(claimed))
        })
    }

    fn claims_together(&self) -> Option<&dyn ClaimsTogether<Claimed>> {
        Some(self)
    }

    fn announced((_, statuses): &Self::Reply) -> Vec<&str> {
        statuses.iter().map(|(_, raw)| raw.as_str()).collect()
    }
}

impl Claim {
    /// The answer to a claim that took `claimed`.
    fn reply(&self, claimed: Option<Turn>) -> Claimed {
        let now = crate::clock::unix_now() as i64;
        let statuses = claimed
            .iter()
            .flat_map(Turn::rows)
            .filter_map(|d| crate::channels::mentions::working(&self.keys, d, now))
            .collect();
        (claimed, statuses)
    }
}

impl ClaimsTogether<Claimed> for Claim {
    fn named_claim(&self) -> Option<NamedClaim<'_>> {
        self.req.delivery_id.as_ref()?;
        Some(NamedClaim {
            community: &self.community,
            caller: &self.caller,
            req: &self.req,
        })
    }

    fn claimed(&self, turn: Turn) -> Answer<Claimed> {
        Ok(self.reply(Some(turn)))
    }
}

/// `POST /deliveries/<id>/renew`: the new end of the lease.
pub(crate) struct Renew {
    pub community: String,
    pub caller: PublicKey,
    pub id: String,
    pub req: RenewRequest,
}

impl WriteCall for Renew {
    type Reply = i64;

    fn community(&self) -> &str {
        &self.community
    }

    fn caller(&self) -> Option<&PublicKey> {
        Some(&self.caller)
    }

    fn refuses_before_writing(&self) -> bool {
        true
    }

    fn run<'a>(&'a self, tx: &'a mut Tx<'_>, cfg: &'a DeliveryConfig) -> BoxFuture<'a, Answer<i64>> {
        Box::pin(deliveries::renew(
            tx,
            &self.community,
            &self.caller,
            &self.id,
            &self.req,
            cfg,
        ))
    }
}

/// `POST /deliveries/<id>/operations`.
pub(crate) struct Operation {
    pub community: String,
    pub caller: PublicKey,
    pub id: String,
    pub req: OperationRequest,
}

impl WriteCall for Operation {
    type Reply = ();

    fn community(&self) -> &str {
        &self.community
    }

    fn caller(&self) -> Option<&PublicKey> {
        Some(&self.caller)
    }

    fn refuses_before_writing(&self) -> bool {
        true
    }

    fn run<'a>(&'a self, tx: &'a mut Tx<'_>, cfg: &'a DeliveryConfig) -> BoxFuture<'a, Answer<()>> {
        Box::pin(deliveries::record_operation(
            tx,
            &self.community,
            &self.caller,
            &self.id,
            &self.req,
            cfg,
        ))
    }
}

/// `POST /deliveries/<id>/finish`.
pub(crate) struct Finish {
    pub community: String,
    pub keys: Keys,
    pub caller: PublicKey,
    pub id: String,
    pub req: FinishRequest,
}

impl WriteCall for Finish {
    type Reply = Finished;

    fn community(&self) -> &str {
        &self.community
    }

    fn caller(&self) -> Option<&PublicKey> {
        Some(&self.caller)
    }

    /// The author of its reply and, unless the outcome is `delivered`, the
    /// community key (a failure is announced by a relay-signed notice).
    fn lock_keys(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .req
            .reply
            .iter()
            .map(|r| author_lock_key(&self.community, &r.pubkey))
            .collect();
        if self.req.outcome != Outcome::Delivered {
            out.push(author_lock_key(&self.community, &self.keys.public_key()));
        }
        out
    }

    // `refuses_before_writing` stays false: every refusal of a finish does
    // come before its first write, but without a savepoint a failure after
    // its reply was written would be run again in the batch's second run,
    // and one that does not recur would never be answered (measured
    // without it: about 0.3 ms less relay and PostgreSQL CPU a delivery,
    // within one run's noise; `workflows::concurrent_finishes_fail_alone`).

    fn run<'a>(&'a self, tx: &'a mut Tx<'_>, cfg: &'a DeliveryConfig) -> BoxFuture<'a, Answer<Finished>> {
        Box::pin(deliveries::finish(
            tx,
            &self.community,
            &self.keys,
            &self.caller,
            &self.id,
            &self.req,
            cfg,
        ))
    }

    fn announced(reply: &Finished) -> Vec<&str> {
        reply.published.iter().map(|(_, raw)| raw.as_str()).collect()
    }
}

/// A channel event (NIP-29 kinds, and channel messages that may start
/// workflow runs): stored with its channel's rules.
pub(crate) struct ChannelEvent {
    pub community: String,
    pub keys: Keys,
    pub policy: ChannelPolicy,
    pub event: Arc<Event>,
    pub raw: Arc<str>,
}

impl WriteCall for ChannelEvent {
    type Reply = channels::Applied;

    fn community(&self) -> &str {
        &self.community
    }

    fn caller(&self) -> Option<&PublicKey> {
        Some(&self.event.pubkey)
    }

    /// A channel message may start workflow runs (and is what people in the
    /// channel wait to see).
    fn starts_work(&self) -> bool {
        true
    }

    /// Its channel, its author and, for the kinds that make the relay
    /// re-sign the channel's metadata, the community key (as the author of
    /// those events).
    fn lock_keys(&self) -> Vec<String> {
        let mut out = vec![author_lock_key(&self.community, &self.event.pubkey)];
        if let Some(channel) = channels::h_tag(&self.event) {
            out.push(crate::channels::state::lock_key(&self.community, channel));
        }
        if crate::channels::metadata::republishes(self.event.kind.as_u16()) {
            out.push(author_lock_key(&self.community, &self.keys.public_key()));
        }
        out
    }

    fn run<'a>(&'a self, tx: &'a mut Tx<'_>, cfg: &'a DeliveryConfig) -> BoxFuture<'a, Answer<Self::Reply>> {
        Box::pin(async move {
            let applied = channels::apply(
                tx,
                &self.community,
                &self.keys,
                &self.policy,
                &self.event,
                &self.raw,
                cfg,
            );
            Ok(applied.await?)
        })
    }

    /// An event not stored is rolled back: it must leave no trace.
    fn keeps(applied: &Self::Reply) -> bool {
        applied.outcome == InsertOutcome::Stored
    }

    fn announced(applied: &Self::Reply) -> Vec<&str> {
        match applied.outcome {
            InsertOutcome::Stored => applied.published.iter().map(|(_, raw)| raw.as_str()).collect(),
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind};
    use protocol::api::{FinishRequest, Outcome};

    use super::{ChannelEvent, Claim, Finish, HttpAuth, WriteCall};

    #[test]
    fn claims_and_channel_messages_start_work_finishes_do_not() {
        let keys = Keys::generate();
        let community = "c".to_string();
        let event = EventBuilder::new(Kind::from_u16(9), "hi")
            .finalize(&keys)
            .expect("sign");
        let message = ChannelEvent {
            community: community.clone(),
            keys: keys.clone(),
            policy: Default::default(),
            raw: Arc::from(serde_json::to_string(&event).expect("json")),
            event: Arc::new(event),
        };
        let claim = Claim {
            community: community.clone(),
            caller: keys.public_key(),
            req: Default::default(),
            keys: keys.clone(),
        };
        let finish = |outcome| Finish {
            community: community.clone(),
            keys: keys.clone(),
            caller: keys.public_key(),
            id: "d".into(),
            req: FinishRequest {
                claim_token: "t".into(),
                outcome,
                failure_code: None,
                failure_message: None,
                reply: None,
                turn: Vec::new(),
            },
        };
        assert!(claim.starts_work() && message.starts_work());
        assert!(!finish(Outcome::Delivered).starts_work());
        assert!(!HttpAuth {
            community: community.clone()
        }
        .starts_work());
        // A failure is announced by a relay-signed notice: the community
        // key is locked up front; a delivered finish without a reply locks
        // nothing.
        assert!(finish(Outcome::Delivered).lock_keys().is_empty());
        assert_eq!(finish(Outcome::Failed).lock_keys().len(), 1);
        // A message without an `h` tag locks its author only; a claim
        // locks rows only.
        assert_eq!(message.lock_keys().len(), 1);
        assert!(claim.lock_keys().is_empty());
    }
}
