//! One WebSocket connection: NIP-01 messages in, answers and live events out.
//!
//! The connection task owns all per-connection state (auth, subscriptions,
//! rate bucket) and handles one client message at a time, so answers go out
//! in the order requests came in. Live events arrive on the community's
//! broadcast channel and are matched here; the socket is written by a
//! separate task (see [`crate::outbound`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesOrdered;
use futures_util::StreamExt;
use nostr::prelude::{Event, Filter, MatchEventOptions, PublicKey, SingleLetterTag, Timestamp};
use protocol::kinds::{self, Storage};
use protocol::message::{ClientMessage, Incoming, ParseError};
use serde_json::json;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use crate::admin::manage::Moderation;
use crate::admission;
use crate::channels::rules as channels;
use crate::clock::unix_now;
use crate::community::Community;
use crate::hub::Published;
use crate::outbound::{self, Outbound, Overflow};
use crate::ratelimit::TokenBucket;
use crate::req::{Stopped, STORED_RESULTS_DEADLINE};
use crate::state::AppState;
use crate::store::{InsertOutcome, ReadScope};
use crate::verify;
use protocol::nip_oa;

/// WebSocket close code for a message above the hard size cap.
const CLOSE_TOO_BIG: u16 = 1009;
/// WebSocket close code sent on shutdown.
const CLOSE_GOING_AWAY: u16 = 1001;
/// WebSocket close code for a policy violation (slow reader, lagging).
const CLOSE_POLICY: u16 = 1008;

struct Subscription {
    filters: Vec<Filter>,
    /// Each filter's NIP-50 query, parsed once (`None`: no words).
    searches: Vec<Option<protocol::search::Query>>,
    /// Hub sequence when the stored query began; live events at or below it
    /// were committed before the query and are not sent again.
    seq_floor: u64,
    /// Its share of the relay's live search work (`None`: no search).
    searching: Option<crate::livesearch::Hold>,
}

/// Live matching: every field of a filter but `search`, which is matched
/// as the stores read it ([`protocol::search::Query`]), not as a substring.
const LIVE_MATCH: MatchEventOptions = MatchEventOptions {
    nip50: false,
    ..MatchEventOptions::new()
};

/// Whether a REQ is complete at EOSE: every filter asks for events by id
/// and every id it asks for was `sent` (an event's id fixes its content,
/// so nothing published later can match). A REQ by ids whose event is not
/// stored yet stays live: clients subscribe to an id and then publish it.
fn is_complete(filters: &[Filter], sent: &HashSet<[u8; 32]>) -> bool {
    crate::req::names_ids(filters)
        && filters
            .iter()
            .flat_map(|f| f.ids.iter().flatten())
            .all(|id| sent.contains(id.as_bytes()))
}

struct Conn {
    state: Arc<AppState>,
    community: Arc<Community>,
    /// Normalised host this connection was made to.
    host: String,
    challenge: String,
    authed: Option<PublicKey>,
    subs: HashMap<String, Subscription>,
    /// Open NIP-77 syncs, at most `limits.max_sync_sessions`.
    syncs: HashMap<String, Box<crate::neg::Session>>,
    /// The community's live events, only while there is a subscription:
    /// every published event wakes every receiver, and a connection that
    /// only publishes (or idles) has nothing to do with them. Before, with
    /// 256 connections publishing, each accepted event woke all 256.
    live: Option<broadcast::Receiver<Arc<Published>>>,
    bucket: TokenBucket,
    out: Outbound,
    /// EVENTs being verified (concurrently), answered in arrival order.
    verifying: FuturesOrdered<BoxFuture<'static, Verified>>,
    /// Verified EVENTs queued for the store's batch writer, in arrival order.
    storing: FuturesOrdered<BoxFuture<'static, Stored>>,
}

type Verified = (Arc<Event>, Arc<str>, Result<(), verify::VerifyError>);
type Stored = (
    Arc<Event>,
    Arc<str>,
    Result<InsertOutcome, crate::store::StoreError>,
);

/// Why the connection loop stops.
enum Stop {
    Overflow,
}

impl From<Overflow> for Stop {
    fn from(_: Overflow) -> Self {
        Stop::Overflow
    }
}

/// Counts an open connection in `relay_connections` while it lives.
struct OpenConnection;

impl OpenConnection {
    fn new() -> OpenConnection {
        metrics::gauge!(crate::telemetry::CONNECTIONS).increment(1.0);
        OpenConnection
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics::gauge!(crate::telemetry::CONNECTIONS).decrement(1.0);
    }
}

/// Runs a connection to completion.
pub async fn run(socket: WebSocket, state: Arc<AppState>, community: Arc<Community>, host: String) {
    let limits = &state.cfg.limits;
    // Events of this connection verified or stored at once, at most.
    let max_inflight = limits.max_inflight_events;
    assert!(max_inflight > 0, "validated at load");
    let (sink, mut stream) = socket.split();
    let (out, writer) = outbound::spawn(sink, limits.max_outbound_bytes, state.output.clone());
    let mut conn = Conn {
        bucket: TokenBucket::new(limits.events_per_second, limits.events_burst),
        challenge: hex::encode(rand::random::<[u8; 16]>()),
        state: state.clone(),
        community,
        host,
        authed: None,
        subs: HashMap::new(),
        syncs: HashMap::new(),
        live: None,
        out,
        verifying: FuturesOrdered::new(),
        storing: FuturesOrdered::new(),
    };
    let shutdown = state.shutdown.clone();
    let _ = conn.out.text(json!(["AUTH", conn.challenge]).to_string());
    let _open = OpenConnection::new();

    loop {
        let step: Result<bool, Stop> = tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                conn.out.close(CLOSE_GOING_AWAY, "relay shutting down");
                break;
            }
            _ = conn.out.failed() => break,
            Some(done) = conn.storing.next(), if !conn.storing.is_empty() => conn.after_store(done).map(|_| true),
            Some(checked) = conn.verifying.next(), if !conn.verifying.is_empty() => {
                conn.after_verify(checked).await.map(|_| true)
            }
            // Live events before the socket: polling the socket costs a
            // read-buffer fill (tungstenite zeroes it) even when nothing
            // came, and a live event is the usual reason this task woke.
            // The socket still gets its turn whenever no live event waits,
            // and the live backlog is bounded by `fanout_buffer_events`.
            item = next_live(&mut conn.live) => match item {
                Ok(p) => conn.on_live(&p).await.map(|_| true),
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(community = %conn.community.id, missed = n, "subscriber fell behind live fan-out");
                    let _ = conn.notice("error: connection fell behind the live event stream and is closed");
                    conn.out.close(CLOSE_POLICY, "too slow");
                    break;
                }
                Err(RecvError::Closed) => Ok(false),
            },
            msg = stream.next(), if conn.verifying.len() + conn.storing.len() < max_inflight => match msg {
                None | Some(Ok(Message::Close(_))) => Ok(false),
                Some(Err(e)) => {
                    if is_capacity_error(&e) {
                        conn.out.close(CLOSE_TOO_BIG, "invalid: message exceeds the hard size limit");
                    }
                    Ok(false)
                }
                Some(Ok(Message::Text(text))) => conn.on_text(text.as_str()).await.map(|_| true),
                Some(Ok(Message::Binary(_))) => conn
                    .notice("invalid: binary messages are not supported")
                    .map(|_| true)
                    .map_err(Stop::from),
                Some(Ok(_)) => Ok(true), // ping/pong are answered by the library
            },
        };
        if conn.subs.is_empty() {
            conn.live = None;
        }
        match step {
            Ok(true) => {}
            Ok(false) => {
                conn.out.close(1000, "");
                break;
            }
            Err(Stop::Overflow) => {
                tracing::info!(community = %conn.community.id, "slow reader disconnected");
                writer.abort();
                return;
            }
        }
    }
    drop(conn);
    // Let the writer flush what is queued (ending with the close frame).
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
}

fn is_capacity_error(e: &axum::Error) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("capacity") || text.contains("too long") || text.contains("too big")
}

impl Conn {
    fn send(&self, v: serde_json::Value) -> Result<(), Overflow> {
        self.out.text(v.to_string())
    }

    fn notice(&self, msg: &str) -> Result<(), Overflow> {
        self.send(json!(["NOTICE", msg]))
    }

    /// The `OK` of an EVENT (counted in `relay_events_received_total`).
    fn ok(&self, id: &str, accepted: bool, msg: &str) -> Result<(), Overflow> {
        let outcome = crate::telemetry::outcome(accepted, msg);
        metrics::counter!(crate::telemetry::EVENTS_RECEIVED, "outcome" => outcome).increment(1);
        self.send(json!(["OK", id, accepted, msg]))
    }

    /// The `OK` of an AUTH (not an event received).
    fn auth_ok(&self, id: &str, accepted: bool, msg: &str) -> Result<(), Overflow> {
        self.send(json!(["OK", id, accepted, msg]))
    }

    fn closed(&self, sub_id: &str, msg: &str) -> Result<(), Overflow> {
        self.send(json!(["CLOSED", sub_id, msg]))
    }

    fn limits(&self) -> &crate::config::Limits {
        &self.state.cfg.limits
    }

    async fn on_text(&mut self, text: &str) -> Result<(), Stop> {
        let max = self.limits().max_message_bytes;
        let parsed = protocol::message::parse(text);
        if text.len() > max {
            let why = format!(
                "invalid: message of {} bytes exceeds max_message_bytes {max}",
                text.len()
            );
            match parsed {
                Ok(ClientMessage::Event(e)) => self.ok(&e.event.id.to_hex(), false, &why)?,
                Ok(ClientMessage::Auth(e)) => self.ok(&e.id.to_hex(), false, &why)?,
                Err(ParseError::Event { event_id, .. }) => self.ok(&event_id, false, &why)?,
                Ok(ClientMessage::Req { sub_id, .. }) | Ok(ClientMessage::Count { sub_id, .. }) => {
                    self.closed(&sub_id, &why)?
                }
                _ => self.notice(&why)?,
            }
            return Ok(());
        }
        match parsed {
            Err(ParseError::Envelope(reason)) => self.notice(&format!("invalid: {reason}"))?,
            Err(ParseError::Event { event_id, reason }) => {
                self.ok(&event_id, false, &format!("invalid: {reason}"))?
            }
            Err(ParseError::Subscription { sub_id, reason, verb }) if verb.starts_with("NEG-") => {
                self.syncs.remove(&sub_id);
                self.neg_err(&sub_id, &format!("invalid: {reason}"))?
            }
            Err(ParseError::Subscription { sub_id, reason, .. }) => {
                self.closed(&sub_id, &format!("invalid: {reason}"))?
            }
            Ok(ClientMessage::Event(incoming)) => self.on_event(*incoming).await?,
            Ok(ClientMessage::Req { sub_id, filters }) => self.on_req(sub_id, filters).await?,
            Ok(ClientMessage::Count { sub_id, filters }) => self.on_count(sub_id, filters).await?,
            Ok(ClientMessage::Close { sub_id }) => {
                self.subs.remove(&sub_id);
            }
            Ok(ClientMessage::Auth(event)) => self.on_auth(Arc::new(*event)).await?,
            Ok(ClientMessage::NegOpen {
                sub_id,
                filter,
                message,
            }) => self.on_neg_open(sub_id, *filter, message).await?,
            Ok(ClientMessage::NegMsg { sub_id, message }) => self.on_neg_msg(sub_id, message).await?,
            Ok(ClientMessage::NegClose { sub_id }) => {
                self.syncs.remove(&sub_id);
            }
        }
        Ok(())
    }

    /// NIP-77 `NEG-OPEN`: the filter passes the REQ rules, then a session
    /// answers the first message (an open one of the same id is replaced).
    async fn on_neg_open(&mut self, sub_id: String, filter: Filter, message: Vec<u8>) -> Result<(), Stop> {
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
    async fn on_neg_msg(&mut self, sub_id: String, message: Vec<u8>) -> Result<(), Stop> {
        let Some(session) = self.syncs.remove(&sub_id) else {
            return Ok(self.neg_err(&sub_id, "closed: no open sync with this id")?);
        };
        let answered = crate::neg::step(session, message).await;
        Ok(self.neg_answer(sub_id, answered)?)
    }

    /// Sends a session's reply and keeps it open, or its refusal (and it
    /// is gone).
    fn neg_answer(
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

    fn neg_err(&self, sub_id: &str, why: &str) -> Result<(), Overflow> {
        self.send(json!(["NEG-ERR", sub_id, why]))
    }

    /// The admission rules for this connection's community, now.
    fn rules<'a>(&'a self, bans: &'a admission::Bans) -> admission::Rules<'a> {
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
    async fn on_event(&mut self, incoming: Incoming) -> Result<(), Stop> {
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
    fn may_write(&self, event: &Event, moderation: &Moderation) -> Result<(), &'static str> {
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
    async fn drain_storing(&mut self) -> Result<(), Stop> {
        while let Some(done) = self.storing.next().await {
            self.after_store(done)?;
        }
        Ok(())
    }

    /// Answers a stored (or refused) event and announces it.
    fn after_store(&mut self, (event, raw, result): Stored) -> Result<(), Stop> {
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
    async fn after_verify(&mut self, (event, raw, verified): Verified) -> Result<(), Stop> {
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
    async fn on_channel_event(&mut self, event: Arc<Event>, raw: Arc<str>) -> Result<(), Stop> {
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
            Ok((InsertOutcome::Stored, published)) => {
                for (ev, ev_raw) in published {
                    self.state.publish(&community, Arc::new(ev), Arc::from(ev_raw));
                }
                // A message may have started runs; a reaction too, or
                // decided an approval a run waits for.
                if kind == protocol::workflow::MESSAGE_KIND || kind == protocol::approval::REACTION_KIND {
                    self.state.kick.kick();
                }

                self.ok(&id, true, "")?;
            }
            Ok((InsertOutcome::Duplicate, _)) => self.ok(&id, true, "duplicate: already applied")?,
            Ok((InsertOutcome::Rejected(msg), _)) => self.ok(&id, false, &msg)?,
            Err(e) => {
                tracing::error!(community = %community, error = %e, "storing channel event failed");
                self.ok(&id, false, "error: the event could not be stored; try again")?;
            }
        }
        Ok(())
    }

    /// Checks a REQ/COUNT against limits and read rules; `Err` is the CLOSED message.
    fn check_filters(&self, filters: &[Filter]) -> Result<(), String> {
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

    fn scope(&self) -> ReadScope {
        ReadScope {
            viewer: self.authed,
            gated_kinds: self.state.cfg.p_gated_kinds.clone(),
            now: unix_now(),
        }
    }

    async fn on_req(&mut self, sub_id: String, filters: Vec<Filter>) -> Result<(), Stop> {
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
    fn hold_searches(
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

    async fn on_count(&mut self, sub_id: String, filters: Vec<Filter>) -> Result<(), Stop> {
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

    async fn on_auth(&mut self, event: Arc<Event>) -> Result<(), Stop> {
        let id = event.id.to_hex();
        if event.kind.as_u16() != kinds::CLIENT_AUTH {
            return Ok(self.auth_ok(&id, false, "invalid: AUTH event must be kind 22242")?);
        }
        if let Err(e) = verify::verify(event.clone(), verify::IdCheck::Recompute).await {
            return Ok(self.auth_ok(&id, false, e.message())?);
        }
        let tag_value = |name: &str| {
            event
                .tags
                .iter()
                .find(|t| t.kind() == name)
                .and_then(|t| t.content())
                .map(str::to_string)
        };
        if tag_value("challenge").as_deref() != Some(self.challenge.as_str()) {
            return Ok(self.auth_ok(&id, false, "invalid: challenge does not match this connection's")?);
        }
        let expected = self.community.websocket_url(&self.host);
        let relay_ok = tag_value("relay").is_some_and(|r| same_relay_url(&r, &expected));
        if !relay_ok {
            return Ok(self.auth_ok(&id, false, &format!("invalid: relay tag must be {expected}"))?);
        }
        let now = unix_now();
        let age = now.abs_diff(event.created_at.as_secs());
        if age > self.limits().auth_max_age_secs {
            return Ok(self.auth_ok(&id, false, "invalid: AUTH event created_at is too far from now")?);
        }
        let moderation = self.state.moderation.get(&self.community).await;
        if moderation.bans.pubkeys.contains(&event.pubkey.to_bytes()) {
            return Ok(self.auth_ok(&id, false, "blocked: this pubkey is banned in this community")?);
        }
        self.authed = Some(event.pubkey);
        Ok(self.auth_ok(&id, true, "")?)
    }

    async fn on_live(&mut self, p: &Arc<Published>) -> Result<(), Stop> {
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
}

/// The next live event, or never when the connection has no receiver.
async fn next_live(
    live: &mut Option<broadcast::Receiver<Arc<Published>>>,
) -> Result<Arc<Published>, RecvError> {
    match live {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Compares relay URLs the way NIP-42 clients write them: scheme and host
/// case-insensitive, a trailing slash ignored, default ports ignored.
fn same_relay_url(given: &str, expected: &str) -> bool {
    let norm = |s: &str| -> Option<(String, String, String)> {
        let u = url::Url::parse(s.trim()).ok()?;
        let host = u.host_str()?.to_ascii_lowercase();
        let hostport = match u.port() {
            Some(p) => format!("{host}:{p}"),
            None => host,
        };
        let path = u.path().trim_end_matches('/').to_string();
        Some((u.scheme().to_string(), hostport, path))
    };
    matches!((norm(given), norm(expected)), (Some(a), Some(b)) if a == b)
}

#[cfg(test)]
mod tests {
    use super::same_relay_url;

    #[test]
    fn relay_urls() {
        assert!(same_relay_url("ws://127.0.0.1:7777", "ws://127.0.0.1:7777"));
        assert!(same_relay_url("ws://127.0.0.1:7777/", "ws://127.0.0.1:7777"));
        assert!(same_relay_url("WSS://Example.com", "wss://example.com"));
        assert!(same_relay_url("wss://example.com:443", "wss://example.com"));
        assert!(!same_relay_url("ws://example.com", "wss://example.com"));
        assert!(!same_relay_url("wss://other.com", "wss://example.com"));
        assert!(!same_relay_url("not a url", "wss://example.com"));
    }
}
