//! Fixtures for workflow and delivery tests: a channel with an owner and
//! registered managed agents, definitions, and NIP-98 API calls.

use nostr::prelude::{Event, EventBuilder, FinalizeEvent, Keys, Kind, Tag, ToBech32};
use serde_json::{json, Value};

use crate::{client::event, http_nip98, Client, Relay};
use std::time::Duration;

/// An owner, a channel, and agents registered by the owner and added to it.
pub struct Fixture {
    pub owner: Keys,
    pub agents: Vec<Keys>,
    pub channel: String,
    /// Connected and authenticated as the owner.
    pub owner_client: Client,
    /// The community's relay pubkey (NIP-11 `self`).
    pub relay_pk: String,
    /// Whether the `barrier` workflow is defined ([`Fixture::barrier`]).
    barrier_defined: bool,
}

/// The relay's `self` pubkey for `host`.
pub async fn relay_pubkey(relay: &Relay, host: &str) -> String {
    nip11_self(&relay.http_url(), host).await
}

/// The `self` pubkey of the community served at `addr` (its NIP-11).
pub async fn relay_pubkey_at(addr: std::net::SocketAddr) -> String {
    nip11_self(&format!("http://{addr}"), &addr.to_string()).await
}

async fn nip11_self(url: &str, host: &str) -> String {
    let resp = reqwest::Client::new()
        .get(url)
        .header("Host", host)
        .header("Accept", "application/nostr+json")
        .send()
        .await
        .expect("nip11");
    let doc: Value = resp.json().await.expect("nip11 json");
    doc["self"].as_str().expect("self").to_string()
}

/// A kind 0 for `agent` attested by `owner`.
pub fn agent_profile(agent: &Keys, owner: &Keys) -> Event {
    let tag = protocol::nip_oa::sign(owner, &agent.public_key(), "").expect("attest");
    EventBuilder::new(Kind::Metadata, "{\"name\":\"agent\"}")
        .tags([tag])
        .finalize(agent)
        .expect("sign")
}

impl Fixture {
    /// Sets up `channel` with `n_agents` agents on the relay's default community.
    pub async fn new(relay: &Relay, channel: &str, n_agents: usize) -> Fixture {
        Fixture::new_on(relay.addr, channel, n_agents).await
    }

    /// Like [`Fixture::new`], in the community served at `addr` (one of
    /// the relay's addresses: its `Host` picks the community).
    pub async fn new_on(addr: std::net::SocketAddr, channel: &str, n_agents: usize) -> Fixture {
        let owner = Keys::generate();
        let mut c = Client::connect(&format!("ws://{addr}")).await;
        c.auth(&owner).await;
        c.publish_ok(&event(&owner, 9007, "", &[&["h", channel], &["name", channel]]))
            .await;
        let mut agents = Vec::new();
        for _ in 0..n_agents {
            let a = Keys::generate();
            c.publish_ok(&agent_profile(&a, &owner)).await;
            c.publish_ok(&event(
                &owner,
                9000,
                "",
                &[&["h", channel], &["p", &a.public_key().to_hex()]],
            ))
            .await;
            agents.push(a);
        }
        let relay_pk = relay_pubkey_at(addr).await;
        Fixture {
            owner,
            agents,
            channel: channel.to_string(),
            owner_client: c,
            relay_pk,
            barrier_defined: false,
        }
    }

    /// Publishes a definition (kind 30620) by the owner; returns it.
    pub async fn define(&mut self, id: &str, def: &Value) -> Event {
        let ev = definition(&self.owner, id, &self.channel, def);
        self.owner_client.publish_ok(&ev).await;
        ev
    }

    /// `nostr:npub…` of agent `i`, to mention in a template.
    pub fn mention(&self, i: usize) -> String {
        format!("nostr:{}", self.agents[i].public_key().to_bech32().expect("npub"))
    }

    /// The positive barrier of a "nothing happened" check: two runs of a
    /// manual workflow `barrier` (one step, skipped by its `if`: it posts
    /// nothing and creates no delivery), the second started after the
    /// first ended. The engine advances runs in rounds, one after another;
    /// a round takes a community's oldest due runs first (by creation), so
    /// one that took the first barrier run took every run due before it,
    /// and every run of a round ends before the next round begins; the
    /// second barrier run was created after the first ended, so a later
    /// round ran it. When it has ended, every run, wake and sweep that was
    /// due before this call has been done. Counts of runs should name their workflow
    /// (`runs list --workflow`), since these runs count too.
    pub async fn barrier(&mut self, relay: &Relay) {
        if !self.barrier_defined {
            let def = json!({"name": "barrier", "trigger": {"on": "manual"},
                "steps": [{"id": "pass", "action": "send_message", "text": "never", "if": "false"}]});
            self.define("barrier", &def).await;
            self.barrier_defined = true;
        }
        for _ in 0..2 {
            let run = start_run(relay, &self.owner, "barrier", json!({})).await;
            let done = run_until(relay, &self.owner, &run, 30, ended).await;
            assert_eq!(done["status"], "completed", "barrier: {done}");
        }
    }

    /// Posts a kind 9 in the channel as the owner.
    pub async fn post(&mut self, text: &str) -> Event {
        let ev = event(&self.owner, 9, text, &[&["h", &self.channel]]);
        self.owner_client.publish_ok(&ev).await;
        ev
    }
}

/// A signed definition event.
pub fn definition(owner: &Keys, id: &str, channel: &str, def: &Value) -> Event {
    EventBuilder::new(Kind::from_u16(30620), def.to_string())
        .tags([Tag::identifier(id), Tag::custom("h", [channel])])
        .finalize(owner)
        .expect("sign")
}

/// A one-step `message_posted` definition.
pub fn on_message(text: &str) -> Value {
    json!({"name": "test", "trigger": {"on": "message_posted"},
           "steps": [{"id": "notify", "action": "send_message", "text": text}]})
}

/// Calls the HTTP API as `keys` with a JSON body.
pub async fn api(relay: &Relay, keys: &Keys, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    http_nip98(
        &relay.http_url(),
        &relay.addr.to_string(),
        keys,
        method,
        path,
        &bytes,
    )
    .await
}

/// Finishes delivery `id` as `agent` with `body`.
pub async fn finish(relay: &Relay, agent: &Keys, id: &str, body: &Value) -> (u16, Value) {
    api(
        relay,
        agent,
        "POST",
        &format!("/deliveries/{id}/finish"),
        Some(body),
    )
    .await
}

/// Claims the oldest due delivery of `agent`.
pub async fn claim(relay: &Relay, agent: &Keys, body: Value) -> (u16, Value) {
    api(relay, agent, "POST", "/deliveries/claim", Some(&body)).await
}

/// Waits (up to 10 s) until `agent` has a delivery it can claim, and claims it.
pub async fn claim_when_due(relay: &Relay, agent: &Keys, body: Value) -> Value {
    for _ in 0..100 {
        let (status, v) = claim(relay, agent, body.clone()).await;
        assert_eq!(status, 200, "{v}");
        if !v["delivery"].is_null() {
            return v["delivery"].clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("no delivery became claimable");
}

/// The `relay deliveries list` lines for a community, parsed.
pub fn deliveries(relay: &Relay) -> Vec<Value> {
    relay
        .cli(&["deliveries", "list", "--limit", "1000"])
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// Polls `f` until it returns `Some` (10 s).
pub async fn eventually<T, F, Fut>(mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..100 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("condition not reached within 10 s");
}

/// Starts a manual run of `workflow` with `body`; returns its id.
pub async fn start_run(relay: &Relay, owner: &Keys, workflow: &str, body: Value) -> String {
    let (status, v) = api(
        relay,
        owner,
        "POST",
        &format!("/workflows/{workflow}/runs"),
        Some(&body),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v["run_id"].as_str().expect("run_id").to_string()
}

/// `GET /runs/<id>` as `who`.
pub async fn get_run(relay: &Relay, who: &Keys, run_id: &str) -> (u16, Value) {
    api(relay, who, "GET", &format!("/runs/{run_id}"), None).await
}

/// Polls the run (as its owner) until `done` holds, for up to `secs`.
pub async fn run_until(
    relay: &Relay,
    owner: &Keys,
    run_id: &str,
    secs: u64,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let mut last = Value::Null;
    for _ in 0..secs * 10 {
        let (status, run) = get_run(relay, owner, run_id).await;
        assert_eq!(status, 200, "{run}");
        if done(&run) {
            return run;
        }
        last = run;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("run did not get there within {secs} s: {last}");
}

/// Whether a run ended (any status but running and waiting).
pub fn ended(run: &Value) -> bool {
    !matches!(run["status"].as_str(), Some("running" | "waiting"))
}

/// The relay's kind 9s in the fixture's channel (its workflow messages).
pub async fn relay_messages(relay: &Relay, fx: &Fixture) -> Vec<Event> {
    let mut c = Client::connect(&relay.ws_url()).await;
    c.req(
        "m",
        vec![json!({"kinds": [9], "#h": [fx.channel], "authors": [fx.relay_pk]})],
    )
    .await
    .events()
}

/// A management answer's `result`, which must be there (200, no `error`).
pub fn ok(answer: (u16, Value)) -> Value {
    let (status, body) = answer;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("error").is_none(), "{body}");
    body["result"].clone()
}

/// A management answer's `error`, which must be there with this HTTP
/// status and start with `prefix` (its code).
pub fn refused(answer: (u16, Value), status: u16, prefix: &str) {
    let (got, body) = answer;
    assert_eq!(got, status, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with(prefix),
        "{error:?} should start with {prefix:?}: {body}"
    );
}

/// A management call (NIP-86): `POST /` with the RPC content type and a
/// NIP-98 header for `u` (`http://<host>/`, or the WebSocket form).
pub async fn rpc_as(relay: &Relay, keys: &Keys, u: &str, method: &str, params: Value) -> (u16, Value) {
    try_rpc_as(relay, keys, u, method, params)
        .await
        .expect("management call")
}

/// [`rpc_as`], `None` when no answer came (the relay died under the call).
pub async fn try_rpc_as(
    relay: &Relay,
    keys: &Keys,
    u: &str,
    method: &str,
    params: Value,
) -> Option<(u16, Value)> {
    let body = json!({"method": method, "params": params}).to_string();
    let auth = protocol::nip98::header(keys, "POST", u, body.as_bytes());
    let resp = reqwest::Client::new()
        .post(format!("{}/", relay.http_url()))
        .header("Host", relay.addr.to_string())
        .header("Content-Type", protocol::nip86::CONTENT_TYPE)
        .header("Authorization", auth)
        .body(body)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .ok()?;
    let status = resp.status().as_u16();
    let text = resp.text().await.ok()?;
    Some((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
}

/// A management call signed for `http://<relay address>/`.
pub async fn rpc(relay: &Relay, keys: &Keys, method: &str, params: Value) -> (u16, Value) {
    let u = format!("http://{}/", relay.addr);
    rpc_as(relay, keys, &u, method, params).await
}

/// [`rpc`], `None` when no answer came.
pub async fn try_rpc(relay: &Relay, keys: &Keys, method: &str, params: Value) -> Option<(u16, Value)> {
    let u = format!("http://{}/", relay.addr);
    try_rpc_as(relay, keys, &u, method, params).await
}

/// Runs `relayctl` as `keys` against `relay`; its standard output (the
/// command must succeed).
pub fn relayctl(relay: &Relay, keys: &Keys, args: &[&str]) -> String {
    let out = std::process::Command::new(crate::workspace_bin("relayctl"))
        .args(args)
        .env("RELAYCTL_URL", relay.http_url())
        .env("RELAYCTL_KEY", keys.secret_key().to_secret_hex())
        .env_remove("RELAYCTL_KEY_FILE")
        .output()
        .expect("run relayctl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "relayctl {args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
