//! A connection's reads: REQ and COUNT under the limits and read rules,
//! live matching of the community's events, NIP-77 sync sessions.

use std::sync::Arc;

use nostr::prelude::{Filter, PublicKey, SingleLetterTag, Timestamp};
use serde_json::json;

use super::{is_complete, Conn, Stop, Subscription, LIVE_MATCH};
use crate::clock::unix_now;
use crate::community::Community;
use crate::hub::Published;
use crate::outbound::Overflow;
use crate::persistence::standbys::Replica;
use crate::req::{Stopped, STORED_RESULTS_DEADLINE};
use crate::state::AppState;
use crate::store::ReadScope;

/// Whether one of `filters` (with its NIP-50 search) matches `p`.
fn matches(filters: &[Filter], searches: &[Option<protocol::search::Query>], p: &Published) -> bool {
    filters.iter().zip(searches).any(|(f, search)| {
        f.match_event(&p.event, LIVE_MATCH) && search.as_ref().is_none_or(|q| q.matches_words(p.words()))
    })
}

/// Whether storing `event` only added it: no deletion, no replaced
/// version, no channel membership or metadata changed (what a standby
/// behind it would still serve the old way).
fn only_adds(event: &nostr::prelude::Event) -> bool {
    let kind = event.kind;
    kind.is_ephemeral()
        || !(kind.is_replaceable()
            || kind.is_addressable()
            || kind.as_u16() == protocol::kinds::DELETION
            || protocol::nip29::changes_channel(kind.as_u16()))
}

/// Whether a reader authenticated as `authed` may read a published event:
/// a p-gated kind only its author and those it names, an expired one
/// nobody, a channel's only while the channel is visible to it.
async fn visible(state: &AppState, community: &Community, authed: Option<PublicKey>, p: &Published) -> bool {
    let gated = state.cfg.p_gated_kinds.contains(&p.event.kind.as_u16());
    if gated {
        let Some(me) = authed else { return false };
        if p.event.pubkey != me && !p.event.tags.public_keys().any(|pk| pk == me) {
            return false;
        }
    }
    if p.event.is_expired_at(Timestamp::from_secs(unix_now())) {
        return false;
    }
    let Some(channel) = crate::state::channel_of(&p.event) else {
        return true;
    };
    let view = state.channels.get(state.store.as_ref(), community, channel).await;
    view.is_some_and(|v| !v.deleted && (!v.private || authed.is_some_and(|me| v.is_member(&me))))
}

/// Counts a read by where it goes (`relay_reads_total`).
fn count_read(scope: &ReadScope) {
    let from = if scope.from.is_some() {
        "standby"
    } else {
        "primary"
    };
    metrics::counter!(crate::telemetry::READS, "from" => from).increment(1);
}

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

    /// The read rules of this connection, reading from the primary.
    pub(super) fn scope(&self) -> ReadScope {
        ReadScope {
            viewer: self.authed,
            gated_kinds: self.state.cfg.p_gated_kinds.clone(),
            now: unix_now(),
            from: None,
        }
    }

    /// A standby that replayed past this connection's last acknowledged
    /// write (read your writes), if one may serve a read now.
    fn replica(&self) -> Option<Replica> {
        let r = self.state.store.replica()?;
        self.wrote_at.is_none_or(|w| r.replayed_through > w).then_some(r)
    }

    /// The scope of a read with no live part (COUNT, NIP-77): from a
    /// standby only when nothing was published in the community since it
    /// replayed, so that it answers as the primary would.
    pub(super) fn settled_scope(&self) -> ReadScope {
        let mut scope = self.scope();
        scope.from = self.replica().filter(|r| {
            self.state
                .hub
                .since(&self.community.id, r.replayed_through)
                .is_some_and(|recent| recent.is_empty())
        });
        count_read(&scope);
        scope
    }

    /// The scope of a REQ whose live events are those after `seq_floor`,
    /// and what it must add to a standby's results: the events published
    /// since the standby replayed, up to the floor (it may not have them
    /// yet, and live matching starts after them). From the primary when
    /// one of those events removes or replaces others (a deletion, a
    /// replaceable event, a channel's membership or metadata: a standby
    /// would still serve what it removed), or the hub cannot tell.
    fn req_scope(&self, seq_floor: u64) -> (ReadScope, Vec<Arc<Published>>) {
        let mut scope = self.scope();
        let recent = self
            .replica()
            .and_then(|r| Some((r, self.state.hub.since(&self.community.id, r.replayed_through)?)));
        if let Some((r, recent)) = recent.filter(|(_, recent)| recent.iter().all(|p| only_adds(&p.event))) {
            scope.from = Some(r);
            count_read(&scope);
            let missed = recent.into_iter().filter(|p| p.seq <= seq_floor).collect();
            return (scope, missed);
        }
        count_read(&scope);
        (scope, Vec::new())
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
        self.listen(Some(&filters));
        let seq_floor = self.state.hub.current_seq();
        let started = std::time::Instant::now();
        let (scope, missed) = self.req_scope(seq_floor);
        let community = self.community.id.clone();
        let watch = missed.iter().map(|p| p.event.id.to_bytes()).collect();
        let sent = crate::req::send_stored(
            &self.state,
            &community,
            &self.out,
            &sub_id,
            &filters,
            &scope,
            &watch,
        )
        .await;
        let mut sent = match sent {
            Ok(sent) => sent,
            Err(Stopped::Overflow) => return Err(Stop::Overflow),
            Err(Stopped::Store(e)) => {
                tracing::error!(community = %community, error = %e, "query failed");
                self.subs.remove(&sub_id);
                return Ok(self.closed(&sub_id, "error: the query failed; try again")?);
            }
        };
        self.send_missed(&sub_id, &filters, &searches, missed, &mut sent)
            .await?;
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
        let scope = self.settled_scope();
        match self.state.store.count(&self.community.id, &filters, &scope).await {
            Ok(n) => self.send(json!(["COUNT", sub_id, {"count": n}]))?,
            Err(e) => {
                tracing::error!(community = %self.community.id, error = %e, "count failed");
                self.closed(&sub_id, "error: the count failed; try again")?;
            }
        }
        Ok(())
    }

    /// Sends the events a standby's results may lack (see
    /// [`Conn::req_scope`]) that match the REQ and were not among its
    /// stored results (`sent`, which they join), oldest first.
    async fn send_missed(
        &mut self,
        sub_id: &str,
        filters: &[Filter],
        searches: &[Option<protocol::search::Query>],
        missed: Vec<Arc<Published>>,
        sent: &mut std::collections::HashSet<[u8; 32]>,
    ) -> Result<(), Overflow> {
        for p in missed {
            let id = p.event.id.to_bytes();
            if p.event.kind.is_ephemeral() || sent.contains(&id) || !matches(filters, searches, &p) {
                continue;
            }
            if visible(&self.state, &self.community, self.authed, &p).await {
                self.out.live(format!("[\"EVENT\",{},", json!(sub_id)), p)?;
                sent.insert(id);
            }
        }
        Ok(())
    }

    /// Hands the hub the keys of every live filter, and of `adding` (a
    /// REQ's, before its subscription is stored); joins the community's
    /// fan-out the first time.
    pub(super) fn listen(&mut self, adding: Option<&[Filter]>) {
        let filters = self.subs.values().flat_map(|s| &s.filters);
        let keys = self
            .state
            .hub
            .keys_of(filters.chain(adding.into_iter().flatten()));
        match &self.live {
            Some(live) => live.set_keys(keys),
            None => self.live = Some(self.state.hub.listen(&self.community.id, keys)),
        }
    }

    pub(super) async fn on_live(&mut self, p: &Arc<Published>) -> Result<(), Stop> {
        if self.subs.is_empty() {
            return Ok(());
        }
        // Matching first: most live events match none of a connection's
        // subscriptions (an agent's wake subscription sees every reply and
        // every other agent's wake), and matching is cheaper than the
        // visibility below.
        let matching: Vec<&String> = self
            .subs
            .iter()
            .filter(|(_, sub)| p.seq > sub.seq_floor && matches(&sub.filters, &sub.searches, p))
            .map(|(id, _)| id)
            .collect();
        if matching.is_empty() || !visible(&self.state, &self.community, self.authed, p).await {
            return Ok(());
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
        let scope = self.settled_scope();
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
