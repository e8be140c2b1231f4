//! Every limit on what clients send and hold, with its unit in its name.

use serde::{Deserialize, Serialize};

/// Protocol limits. All are per connection unless the name says otherwise.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest WebSocket message answered with an error rather than a close.
    /// Messages up to twice this size get a NOTICE; larger ones close the
    /// connection with status 1009.
    pub max_message_bytes: usize,
    /// Largest serialised event.
    pub max_event_bytes: usize,
    /// Most tags in one event.
    pub max_tags_per_event: usize,
    /// Longest value (any element) of one tag.
    pub max_tag_value_bytes: usize,
    /// Most open subscriptions on one connection.
    pub max_subscriptions: usize,
    /// Most filters in one REQ or COUNT.
    pub max_filters: usize,
    /// Most values in one filter field (`ids`, `authors`, `kinds`, each `#x`).
    pub max_filter_values: usize,
    /// Largest `limit` honoured; larger ones (and a missing `limit`) are clamped.
    pub max_limit: usize,
    /// Sustained EVENT messages per second.
    pub events_per_second: u32,
    /// Burst of EVENT messages allowed above the sustained rate.
    pub events_burst: u32,
    /// EVENTs of one connection being verified or stored at once; beyond,
    /// the connection is not read until some are answered. A client that
    /// pipelines more waits (TCP backpressure). Bounds a connection's
    /// pending events to this × `max_event_bytes`.
    pub max_inflight_events: usize,
    /// Bytes queued for a connection before it is disconnected as a slow reader.
    pub max_outbound_bytes: usize,
    /// How far in the future `created_at` may be: 900 (the default, as
    /// strfry's and nostr-rs-relay's) refuses what is more than 15 minutes
    /// ahead, so that no event sorts first in every newest-first feed for
    /// years. NIP-01 sets no bound; a larger value lifts it.
    pub max_future_secs: u64,
    /// How old a NIP-42 AUTH event may be.
    pub auth_max_age_secs: u64,
    /// Largest HTTP request body (NIP-98 API calls).
    pub max_http_body_bytes: usize,
    /// Read buffer of each WebSocket, allocated when it opens (most of an
    /// idle connection's memory; larger messages still arrive, in more reads).
    pub ws_read_buffer_bytes: usize,
    /// Sustained HTTP API calls per second per (community, pubkey); beyond: 429.
    pub api_requests_per_second: u32,
    /// Burst of HTTP API calls above the sustained rate.
    pub api_burst: u32,
    /// Live events queued per connection (those that may match its
    /// subscriptions); a connection that falls this far behind is
    /// disconnected (it could not be served in order).
    pub fanout_buffer_events: usize,
    /// Bytes of stored events one REQ sends at most, over all its filters;
    /// past it the REQ ends with EOSE, as if its `limit` had been reached.
    pub max_req_bytes: usize,
    /// Most events one NIP-77 sync may reconcile (40 bytes of memory each
    /// while it is open); a filter matching more is refused with NEG-ERR.
    pub max_sync_events: usize,
    /// Most NIP-77 syncs open at once on one connection.
    pub max_sync_sessions: usize,
    /// Bytes queued for all connections together (relay-wide). Past it,
    /// stored results wait for room, and a connection that is behind
    /// (more than `outbound::KEEPING_UP_BYTES` queued) is disconnected rather than
    /// given more. A live event queued for many connections counts once.
    pub max_outbound_bytes_total: usize,
    /// Open TCP connections (HTTP and WebSocket) from one IP address; past
    /// it a connection is answered 429 and closed.
    pub max_connections_per_ip: u32,
    /// Addresses the per-IP cap does not apply to (by default loopback:
    /// a reverse proxy on the same machine brings every client from there).
    pub connection_cap_exempt: Vec<std::net::IpAddr>,
    /// Live subscription filters with a NIP-50 `search` one connection
    /// may hold, and the words of their searches together.
    pub max_live_search_filters_per_connection: usize,
    /// Words of those searches, together, on one connection.
    pub max_live_search_words_per_connection: usize,
    /// Live search filters of every connection of the relay process.
    pub max_live_search_filters: usize,
    /// Words of those searches, together, relay-wide.
    pub max_live_search_words: usize,
    /// Reverse proxies whose `X-Forwarded-For` names the caller (by
    /// default none: the connection's own address is the caller's).
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// How long a connection may take to send a complete request head,
    /// the first one or the next one on a kept-alive connection (so also
    /// the idle time before a WebSocket upgrade).
    pub header_read_timeout_ms: u64,
    /// How long an HTTP request body may take to arrive.
    pub body_read_timeout_ms: u64,
    /// Failed webhook calls (wrong or missing secret) per second to one
    /// hook from one caller address, sustained; beyond, that caller gets
    /// 429 for that hook before its secret is looked at. Other hooks, and
    /// other callers where their address is known, are not affected.
    pub webhook_failures_per_second: u32,
    /// Burst of failed webhook calls to one hook from one caller above the
    /// rate.
    pub webhook_failures_burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 256 * 1024,
            max_event_bytes: 128 * 1024,
            max_tags_per_event: 2_000,
            max_tag_value_bytes: 1_024,
            max_subscriptions: 64,
            max_filters: 16,
            max_filter_values: 1_000,
            max_limit: 1_000,
            events_per_second: 100,
            events_burst: 200,
            max_inflight_events: 256,
            max_outbound_bytes: 8 * 1024 * 1024,
            max_future_secs: 900,
            auth_max_age_secs: 600,
            fanout_buffer_events: 16_384,
            max_http_body_bytes: 1024 * 1024,
            ws_read_buffer_bytes: 4 * 1024,
            api_requests_per_second: 50,
            api_burst: 200,
            max_req_bytes: 16 * 1024 * 1024,
            max_sync_events: 1_000_000,
            max_sync_sessions: 2,
            max_outbound_bytes_total: 256 * 1024 * 1024,
            max_connections_per_ip: 256,
            connection_cap_exempt: vec![
                std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::Ipv6Addr::LOCALHOST.into(),
            ],
            trusted_proxies: Vec::new(),
            max_live_search_filters_per_connection: 8,
            max_live_search_words_per_connection: 64,
            max_live_search_filters: 1_024,
            max_live_search_words: 8_192,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            webhook_failures_per_second: 1,
            webhook_failures_burst: 20,
        }
    }
}
