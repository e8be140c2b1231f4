//! A connection's reads: REQ and COUNT under the limits and read rules,
//! live matching of the community's events, NIP-77 sync sessions.

use std::sync::Arc;

use nostr::prelude::{Filter, SingleLetterTag, Timestamp};
use serde_json::json;

use super::{is_complete, Conn, Stop, Subscription, LIVE_MATCH};
use crate::clock::unix_now;
use crate::hub::Published;
use crate::outbound::Overflow;
use crate::req::{Stopped, STORED_RESULTS_DEADLINE};
use crate::store::ReadScope;

impl Conn {
    /// Checks a REQ/COUNT against limits and read rules; `Err` is the CLOSED message.
    pub(super) fn check_filters(&self, filters: &[Filter]) -> Result<(), String> {
        let l = self.limits();
        if filters.len() > l.max_filters {
            return Err(format!(
                "invalid: {} filters exceed max_filters {}",
                filters.len(),
                l.max_filters
            ));
        }
        if self.state.cfg.access(&self.community.id).auth_required_for_reads && self.authed.is_none() {
            return Err("auth-required: this community serves authenticated clients only".into());
        }
        let gated = &self.state.cfg.p_gated_kinds;
        let p = SingleLetterTag::LOWERCASE_P;
        for f in filters {
            let widest = [
                f.ids.as_ref().map_or(0, |s| s.len()),
                f.authors.as_ref().map_or(0, |s| s.len()),
                f.kinds.as_ref().map_or(0, |s| s.len()),
                f.generic_tags.values().map(|s| s.len()).max().unwrap_or(0),
            ]
            .into_iter()
            .max()
            .unwrap_or(0);
            if widest > l.max_filter_values {
                return Err(format!(
                    "invalid: a filter field with {widest} values exceeds max_filter_values {}",
                    l.max_filter_values
                ));
            }
            let Some(kinds) = &f.kinds else { continue };
            let Some(k) = kinds.iter().find(|k| gated.contains(&k.as_u16())) else {
                continue;
            };
            let Some(me) = self.authed else {
                return Err(format!(
                    "auth-required: kind {} is only delivered to authenticated recipients",
                    k.as_u16()
                ));
            };
            // Asking for others' `p` is asking for what only they may read,
            // unless every author asked for is oneself (one's sent DMs).
            let own_only = f
                .authors
                .as_ref()
                .is_some_and(|a| !a.is_empty() && a.iter().all(|pk| *pk == me));
            if let Some(ps) = f.generic_tags.get(&p).filter(|_| !own_only) {
                let mine = me.to_hex();
                if ps.iter().any(|v| *v != mine) {
                    return Err(format!(
                        "restricted: kind {} is only delivered to the pubkey it names in #p",
                        k.as_u16()
                    ));
                }
            }
        }
        Ok(())
    }

    pub(super) fn scope(&self) -> ReadScope {
        ReadScope {
            viewer: self.authed,
            gated_kinds: self.state.cfg.p_gated_kinds.clone(),
            now: unix_now(),
        }
    }

    pub(super) async fn on_req(&mut self, sub_id: String, filters: Vec<Filter>) -> Result<(), Stop> {
        if let Err(msg) = self.check_filters(&filters) {
            self.subs.remove(&sub_id);
            return Ok(self.closed(&sub_id, &msg)?);
        }
        let max_subs = self.limits().max_subscriptions;
        if !self.subs.contains_key(&sub_id) && self.subs.len() >= max_subs {
            return Ok(self.closed(
                &sub_id,
                &format!("blocked: at most {max_subs} subscriptions per connection"),
            )?);
        }
        // A REQ replaces the subscription of its id, and its share of work.
        self.subs.remove(&sub_id);
        let searches = crate::livesearch::searches_of(&filters);
        let searching = match self.hold_searches(&searches) {
            Ok(hold) => hold,
            Err(msg) => return Ok(self.closed(&sub_id, &msg)?),
        };
        // Receive live events before taking the floor: every event
        // published after the floor is then received, and every one at or
        // below it was committed before the stored query below.
        if self.live.is_none() {
            self.live = Some(self.state.hub.subscribe(&self.community.id));
        }
        let seq_floor = self.state.hub.current_seq();
        let started = std::time::Instant::now();
        let scope = self.scope();
        let community = self.community.id.clone();
        let sent =
            crate::req::send_stored(&self.state, &community, &self.out, &sub_id, &filters, &scope).await;
        let sent = match sent {
            Ok(sent) => sent,
            Err(Stopped::Overflow) => return Err(Stop::Overflow),
            Err(Stopped::Store(e)) => {
                tracing::error!(community = %community, error = %e, "query failed");
                self.subs.remove(&sub_id);
                return Ok(self.closed(&sub_id, "error: the query failed; try again")?);
            }
        };
        self.out
            .text_wait(json!(["EOSE", sub_id]).to_string(), STORED_RESULTS_DEADLINE)
            .await?;
        metrics::histogram!(crate::telemetry::REQ_DURATION).record(started.elapsed().as_secs_f64());
        if is_complete(&filters, &sent) {
            // Every filter names its events by id, and each was found:
            // as NIP-01 allows, the relay ends it, which frees the slot.
            self.subs.remove(&sub_id);
            return Ok(self.closed(&sub_id, "")?);
        }
        self.subs.insert(
            sub_id,
            Subscription {
                filters,
                searches,
                seq_floor,
                searching,
            },
        );
        Ok(())
    }

    /// Takes the share of live search work a REQ's `searches` need, within
    /// this connection's bound and the relay's; `Err` is the CLOSED reason.
    pub(super) fn hold_searches(
        &self,
        searches: &[Option<protocol::search::Query>],
    ) -> Result<Option<crate::livesearch::Hold>, String> {
        let (filters, words) = crate::livesearch::weight(searches);
        if filters == 0 {
            return Ok(None);
        }
        let l = self.limits();
        let (held_filters, held_words) = self
            .subs
            .values()
            .filter_map(|s| s.searching.as_ref())
            .fold((0, 0), |(f, w), h| (f + h.filters, w + h.words));
        let (max_filters, max_words) = (
            l.max_live_search_filters_per_connection,
            l.max_live_search_words_per_connection,
        );
        if held_filters + filters > max_filters || held_words + words > max_words {
            return Err(format!(
                "blocked: at most {max_filters} search filters ({max_words} search words) \
                 per connection"
            ));
        }
        match self.state.live_searches.hold(filters, words) {
            Some(hold) => Ok(Some(hold)),
            None => Err(
                "rate-limited: the relay holds as many live searches as it serves; try again later".into(),
            ),
        }
    }

    pub(super) async fn on_count(&mut self, sub_id: String, filters: Vec<Filter>) -> Result<(), Stop> {
        if let Err(msg) = self.check_filters(&filters) {
            return Ok(self.closed(&sub_id, &msg)?);
        }
        let scope = self.scope();
        match self.state.store.count(&self.community.id, &filters, &scope).await {
            Ok(n) => self.send(json!(["COUNT", sub_id, {"count": n}]))?,
            Err(e) => {
                tracing::error!(community = %self.community.id, error = %e, "count failed");
                self.closed(&sub_id, "error: the count failed; try again")?;
            }
        }
        Ok(())
    }

    pub(super) async fn on_live(&mut self, p: &Arc<Published>) -> Result<(), Stop> {
        if self.subs.is_empty() {
            return Ok(());
        }
        let gated = self.state.cfg.p_gated_kinds.contains(&p.event.kind.as_u16());
        if gated {
            let Some(me) = self.authed else { return Ok(()) };
            if p.event.pubkey != me && !p.event.tags.public_keys().any(|pk| pk == me) {
                return Ok(());
            }
        }
        if p.event.is_expired_at(Timestamp::from_secs(unix_now())) {
            return Ok(());
        }
        // Matching first: most live events match none of a connection's
        // subscriptions (an agent's wake subscription sees every reply and
        // every other agent's wake), and matching is cheaper than the
        // channel's visibility below.
        let matching: Vec<&String> = self
            .subs
            .iter()
            .filter(|(_, sub)| {
                p.seq > sub.seq_floor
                    && sub.filters.iter().zip(&sub.searches).any(|(f, search)| {
                        f.match_event(&p.event, LIVE_MATCH)
                            && search.as_ref().is_none_or(|q| q.matches_words(p.words()))
                    })
            })
            .map(|(id, _)| id)
            .collect();
        if matching.is_empty() {
            return Ok(());
        }
        if let Some(channel) = crate::state::channel_of(&p.event) {
            let view = self
                .state
                .channels
                .get(self.state.store.as_ref(), &self.community, channel)
                .await;
            let visible = view.is_some_and(|v| {
                !v.deleted && (!v.private || self.authed.is_some_and(|me| v.is_member(&me)))
            });
            if !visible {
                return Ok(());
            }
        }
        for sub_id in matching {
            // The event's JSON is shared with every other subscriber's queue.
            self.out
                .live(format!("[\"EVENT\",{},", json!(sub_id)), p.clone())?;
        }
        Ok(())
    }
    /// NIP-77 `NEG-OPEN`: the filter passes the REQ rules, then a session
    /// answers the first message (an open one of the same id is replaced).
    pub(super) async fn on_neg_open(
        &mut self,
        sub_id: String,
        filter: Filter,
        message: Vec<u8>,
    ) -> Result<(), Stop> {
        self.syncs.remove(&sub_id);
        if let Err(msg) = self.check_filters(std::slice::from_ref(&filter)) {
            return Ok(self.neg_err(&sub_id, &msg)?);
        }
        let max = self.limits().max_sync_sessions;
        if self.syncs.len() >= max {
            return Ok(self.neg_err(
                &sub_id,
                &format!("blocked: at most {max} syncs per connection (max_sync_sessions)"),
            )?);
        }
        let scope = self.scope();
        let community = self.community.id.clone();
        let answered = crate::neg::open(&self.state, &community, &filter, &scope, message).await;
        Ok(self.neg_answer(sub_id, answered)?)
    }

    /// NIP-77 `NEG-MSG`: the next round of an open session.
    pub(super) async fn on_neg_msg(&mut self, sub_id: String, message: Vec<u8>) -> Result<(), Stop> {
        let Some(session) = self.syncs.remove(&sub_id) else {
            return Ok(self.neg_err(&sub_id, "closed: no open sync with this id")?);
        };
        let answered = crate::neg::step(session, message).await;
        Ok(self.neg_answer(sub_id, answered)?)
    }

    /// Sends a session's reply and keeps it open, or its refusal (and it
    /// is gone).
    pub(super) fn neg_answer(
        &mut self,
        sub_id: String,
        answered: Result<(Box<crate::neg::Session>, Vec<u8>), crate::neg::Refused>,
    ) -> Result<(), Overflow> {
        match answered {
            Ok((session, reply)) => {
                self.send(json!(["NEG-MSG", sub_id, hex::encode(reply)]))?;
                self.syncs.insert(sub_id, session);
                Ok(())
            }
            Err(why) => self.neg_err(&sub_id, &why),
        }
    }

    pub(super) fn neg_err(&self, sub_id: &str, why: &str) -> Result<(), Overflow> {
        self.send(json!(["NEG-ERR", sub_id, why]))
    }
}
