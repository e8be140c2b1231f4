//! A connection's EVENTs: the cheap checks, verification off the
//! executor, the write rules, storing (channel events on their own path),
//! and the OK in arrival order.

use std::sync::Arc;

use futures_util::StreamExt;
use nostr::prelude::Event;
use protocol::kinds::{self, Storage};
use protocol::message::Incoming;

use super::{Conn, Stop, Stored, Verified};
use crate::admin::manage::Moderation;
use crate::admission;
use crate::channels::rules::{self as channels, Applied};
use crate::clock::unix_now;
use crate::store::InsertOutcome;
use crate::verify;
use protocol::nip_oa;

impl Conn {
    /// The admission rules for this connection's community, now.
    pub(super) fn rules<'a>(&'a self, bans: &'a admission::Bans) -> admission::Rules<'a> {
        admission::Rules {
            limits: self.limits(),
            community_key: self.community.pubkey(),
            now: unix_now(),
            bans: Some(bans),
        }
    }

    /// An EVENT: cheap checks now, then verification (off the executor,
    /// concurrently with later events), then [`Conn::after_verify`] in
    /// arrival order.
    pub(super) async fn on_event(&mut self, incoming: Incoming) -> Result<(), Stop> {
        let raw: Arc<str> = Arc::from(incoming.json());
        let id_check = match &incoming.verbatim {
            Some(v) => verify::IdCheck::Verbatim { id_ok: v.id_ok },
            None => verify::IdCheck::Recompute,
        };
        let event = Arc::new(incoming.event);
        let id = event.id.to_hex();
        if !self.bucket.try_take() {
            let msg = format!(
                "rate-limited: more than {} events per second",
                self.limits().events_per_second
            );
            return Ok(self.ok(&id, false, &msg)?);
        }
        let moderation = self.state.moderation.get(&self.community).await;
        if let Err(why) = self.may_write(&event, &moderation) {
            return Ok(self.ok(&id, false, why)?);
        }
        if let Err(refusal) = admission::check(&event, raw.len(), &self.rules(&moderation.bans)) {
            return Ok(self.ok(&id, false, &refusal.to_string())?);
        }
        self.verifying.push_back(Box::pin(async move {
            let r = verify::verify(event.clone(), id_check).await;
            (event, raw, r)
        }));
        Ok(())
    }

    /// The community's access rules for publishing (`[access]`): the
    /// refusal when this connection may not publish `event`.
    pub(super) fn may_write(&self, event: &Event, moderation: &Moderation) -> Result<(), &'static str> {
        let access = self.state.cfg.access(&self.community.id);
        if access.auth_required_for_writes && self.authed.is_none() {
            return Err("auth-required: this community accepts events from authenticated clients only");
        }
        if access.writers_allowlist
            && !moderation.allowed.contains(&event.pubkey.to_bytes())
            && !self
                .state
                .cfg
                .is_admin(&self.community.id, &event.pubkey.to_hex())
        {
            return Err("restricted: only pubkeys on this community's allow list may publish here");
        }
        Ok(())
    }

    /// Waits for every queued store of this connection to be answered, so
    /// that what comes next is decided after them (arrival order).
    pub(super) async fn drain_storing(&mut self) -> Result<(), Stop> {
        while let Some(done) = self.storing.next().await {
            self.after_store(done)?;
        }
        Ok(())
    }

    /// Answers a stored (or refused) event and announces it.
    pub(super) fn after_store(&mut self, (event, raw, result): Stored) -> Result<(), Stop> {
        let id = event.id.to_hex();
        let community = self.community.id.clone();
        match result {
            Ok(InsertOutcome::Stored) => {
                self.state.publish(&community, event, raw);
                self.ok(&id, true, "")?;
            }
            Ok(InsertOutcome::Duplicate) => self.ok(&id, true, "duplicate: already have this event")?,
            Ok(InsertOutcome::Rejected(msg)) => self.ok(&id, false, &msg)?,
            Err(e) => {
                tracing::error!(community = %community, error = %e, "storing event failed");
                self.ok(&id, false, "error: the event could not be stored; try again")?;
            }
        }
        Ok(())
    }

    /// The rest of an EVENT, once verified, in arrival order.
    pub(super) async fn after_verify(&mut self, (event, raw, verified): Verified) -> Result<(), Stop> {
        let id = event.id.to_hex();
        if let Err(e) = verified {
            return Ok(self.ok(&id, false, e.message())?);
        }
        if event.is_protected() {
            match self.authed {
                None => {
                    return Ok(self.ok(
                        &id,
                        false,
                        "auth-required: this event is protected (NIP-70); authenticate as its author",
                    )?)
                }
                Some(pk) if pk != event.pubkey => {
                    return Ok(self.ok(
                        &id,
                        false,
                        "restricted: a protected event (NIP-70) may only be published by its author",
                    )?)
                }
                Some(_) => {}
            }
        }
        let plain = channels::h_tag(&event).is_none()
            && event.kind.as_u16() != channels::CREATE_GROUP
            && kinds::storage_of(event.kind.as_u16()) != Storage::Ephemeral
            && !(event.kind.as_u16() == 0 && event.tags.iter().any(|t| t.kind() == protocol::nip_oa::TAG));
        if plain {
            let rx = self
                .state
                .store
                .enqueue_insert(&self.community.id, event.clone(), raw.clone())
                .await;
            self.storing.push_back(Box::pin(async move {
                let r = rx
                    .await
                    .unwrap_or_else(|_| Err(crate::store::StoreError::Stopped("event writer")));
                (event, raw, r)
            }));
            return Ok(());
        }
        // Boxed: the other paths' futures (channel rules, registrations,
        // the ephemeral forward) are large, and this one is part of every
        // connection's task, idle or not.
        Box::pin(self.after_verify_other(id, event, raw)).await
    }

    /// An event other than a plain one (channel, ephemeral, a registration,
    /// a replaceable or deletion), once verified; `id` is its id in hex.
    async fn after_verify_other(&mut self, id: String, event: Arc<Event>, raw: Arc<str>) -> Result<(), Stop> {
        // Everything else is decided after this connection's earlier events.
        self.drain_storing().await?;
        if channels::h_tag(&event).is_some() || event.kind.as_u16() == channels::CREATE_GROUP {
            return self.on_channel_event(event, raw).await;
        }
        let community = self.community.id.clone();
        if kinds::storage_of(event.kind.as_u16()) == Storage::Ephemeral {
            self.state.publish(&community, event, raw.clone());
            let raws = [raw.to_string()];
            if let Err(e) = self.state.store.publish_ephemeral(&community, &raws).await {
                tracing::warn!(community = %community, error = %e, "ephemeral event not forwarded to other relay processes");
                return Ok(self.ok(
                    &id,
                    false,
                    "error: delivered to this relay process only; other processes are unreachable",
                )?);
            }
            return Ok(self.ok(&id, true, "")?);
        }
        let stored = match nip_oa::from_event(&event) {
            Err(e) => return Ok(self.ok(&id, false, &format!("invalid: NIP-OA attestation: {e}"))?),
            Ok(Some(att)) if event.kind.as_u16() == 0 => {
                self.state
                    .store
                    .register_agent(&community, &event, &raw, &att)
                    .await
            }
            Ok(_) => self.state.store.insert_event(&community, &event, &raw).await,
        };
        self.after_store((event, raw, stored))
    }

    /// An `h`-tagged event, or a channel creation (NIP-29).
    pub(super) async fn on_channel_event(&mut self, event: Arc<Event>, raw: Arc<str>) -> Result<(), Stop> {
        let id = event.id.to_hex();
        let community = self.community.id.clone();
        let policy = self.state.cfg.channel_policy(&community);
        let kind = event.kind.as_u16();
        if kind == channels::CREATE_GROUP {
            if channels::h_tag(&event).is_none() {
                return Ok(self.ok(
                    &id,
                    false,
                    "invalid: a channel is created with an h tag naming it",
                )?);
            }
            match self.authed {
                None => {
                    return Ok(self.ok(
                        &id,
                        false,
                        "auth-required: authenticate (NIP-42) to create a channel",
                    )?);
                }
                Some(pk) if pk != event.pubkey => {
                    return Ok(self.ok(
                        &id,
                        false,
                        "restricted: a channel is created by the authenticated author",
                    )?);
                }
                Some(pk) if !policy.may_create(&pk.to_hex()) => {
                    return Ok(self.ok(
                        &id,
                        false,
                        "restricted: channel creation is limited to an allowlist",
                    )?);
                }
                Some(_) => {}
            }
        }
        if kinds::storage_of(kind) == Storage::Ephemeral {
            // Not stored: only the membership rule applies.
            let channel = channels::h_tag(&event).unwrap_or_default();
            let view = self
                .state
                .channels
                .get(self.state.store.as_ref(), &self.community, channel)
                .await;
            let allowed = view.is_some_and(|v| {
                !v.deleted && (!policy.requires_membership(kind) || v.is_member(&event.pubkey))
            });
            if !allowed {
                return Ok(self.ok(
                    &id,
                    false,
                    &format!("restricted: only members of channel {channel} may post in it"),
                )?);
            }
            self.state.publish(&community, event, raw);
            return Ok(self.ok(&id, true, "")?);
        }
        let keys = self.community.keys.clone();
        match self
            .state
            .store
            .apply_channel_event(&community, &keys, policy, &event, &raw)
            .await
        {
            Ok(Applied {
                outcome: InsertOutcome::Stored,
                published,
                runs_moved,
            }) => {
                for (ev, ev_raw) in published {
                    self.state.publish(&community, Arc::new(ev), Arc::from(ev_raw));
                }
                // A message or reaction that started runs, or decided an
                // approval a run waits for: the engine goes on now. Most
                // start nothing, and an engine pass is three reads.
                if runs_moved {
                    self.state.kick.kick();
                }

                self.ok(&id, true, "")?;
            }
            Ok(Applied {
                outcome: InsertOutcome::Duplicate,
                ..
            }) => self.ok(&id, true, "duplicate: already applied")?,
            Ok(Applied {
                outcome: InsertOutcome::Rejected(msg),
                ..
            }) => self.ok(&id, false, &msg)?,
            Err(e) => {
                tracing::error!(community = %community, error = %e, "storing channel event failed");
                self.ok(&id, false, "error: the event could not be stored; try again")?;
            }
        }
        Ok(())
    }
}
