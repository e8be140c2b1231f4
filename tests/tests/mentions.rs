//! Mentions as durable work (docs/protocol.md, "Mentions"), with real
//! relay and agent processes on every backend: an agent's owner turns its
//! mentions on (NIP-86 `setmentions`, `relayctl mentions`); a member's
//! kind 9 that p-tags it then makes a delivery in the transaction that
//! stores it, which waits for the agent and is answered once.

use std::time::Duration;

use nostr::prelude::{Event, Keys};
use serde_json::{json, Value};
use tests::agent::AgentProc;
use tests::workflow::{deliveries, ok, refused, relayctl, rpc, Fixture};
use tests::{backend_tests, event, Backend, Client, Relay, RelayOptions};

backend_tests!(
    a_mention_waits_for_its_agent_and_is_answered_once,
    mentions_are_turned_on_by_the_agents_owner_or_an_admin,
    a_deleted_mention_takes_its_work_with_it,
    removing_a_member_cancels_its_open_mentions,
    a_mention_over_a_cap_is_refused_with_a_notice,
    a_nostr_tools_client_asks_an_agent,
    a_mention_the_agent_refuses_fails_visibly_to_its_sender,
    the_sender_sees_its_mention_queued_then_worked_on,
    mentions_said_together_are_one_turn_and_threads_are_their_own,
    two_processes_of_one_agent_answer_a_turn_once,
    a_conversation_that_never_goes_quiet_is_answered_within_its_longest_wait,
);

const FAST_DELIVERIES: &str =
    "[deliveries]\nretry_base_secs = 1\nretry_cap_secs = 2\nsweep_interval_ms = 200\n";
const FAST_WORKFLOWS: &str = "[workflows]\nrun_poll_interval_ms = 200\n";

/// A relay whose community has one admin.
fn start(backend: &Backend, admin: &Keys) -> Relay {
    start_with(backend, admin, "")
}

/// [`start`], with more `[deliveries]` settings.
fn start_with(backend: &Backend, admin: &Keys, deliveries: &str) -> Relay {
    let admin = admin.public_key().to_hex();
    let config_toml = format!(
        "metrics_listen = \"127.0.0.1:0\"\nadmins = [\"{admin}\"]\n{FAST_DELIVERIES}{deliveries}{FAST_WORKFLOWS}"
    );
    Relay::start_opts(
        backend,
        RelayOptions {
            config_toml,
            ..Default::default()
        },
    )
}

/// A relay with channel `ops`, its one agent's mentions on everywhere,
/// and a person who joined the channel (connected, authenticated).
async fn one_agent_asked(backend: &Backend) -> (Relay, Fixture, Keys, (Keys, Client)) {
    let relay = start(backend, &Keys::generate());
    let fx = Fixture::new(&relay, "ops", 1).await;
    let agent = fx.agents[0].clone();
    mentions_on(&relay, &fx.owner, &agent).await;
    let person = member(&relay, "ops").await;
    (relay, fx, agent, person)
}

/// A connection authenticated as `keys`.
async fn connected(relay: &Relay, keys: &Keys) -> Client {
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(keys).await;
    c
}

/// `person`'s connection subscribed (`chan`) to what `agent` says in `ops`
/// from now on.
async fn watching(relay: &Relay, person: &Keys, agent: &Keys) -> Client {
    let mut c = connected(relay, person).await;
    let filter = json!({"kinds": [9], "#h": ["ops"], "authors": [agent.public_key().to_hex()], "limit": 0});
    c.req("chan", vec![filter]).await.events();
    c
}

/// Turns `agent`'s mentions on in every channel, as its owner.
async fn mentions_on(relay: &Relay, owner: &Keys, agent: &Keys) {
    ok(rpc(
        relay,
        owner,
        "setmentions",
        json!([agent.public_key().to_hex(), true]),
    )
    .await);
}

/// A person who joined the (open) channel, connected and authenticated.
async fn member(relay: &Relay, channel: &str) -> (Keys, Client) {
    let keys = Keys::generate();
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(&keys).await;
    c.publish_ok(&event(&keys, 9021, "", &[&["h", channel]])).await;
    (keys, c)
}

/// A kind 9 in `channel` by `author` p-tagging each of `agents`.
fn mention(author: &Keys, channel: &str, text: &str, agents: &[&Keys]) -> Event {
    let hexes: Vec<String> = agents.iter().map(|a| a.public_key().to_hex()).collect();
    let mut tags: Vec<Vec<&str>> = vec![vec!["h", channel]];
    tags.extend(hexes.iter().map(|h| vec!["p", h.as_str()]));
    let tags: Vec<&[&str]> = tags.iter().map(Vec::as_slice).collect();
    event(author, 9, text, &tags)
}

/// An echo agent that polls every second.
fn echo_agent(relay: &Relay, agent: &Keys, owner: &Keys) -> AgentProc {
    AgentProc::start(relay, agent, owner, "type = \"echo\"", "poll_interval_secs = 1")
}

/// The delivery rows made by `message`.
fn rows_of(relay: &Relay, message: &Event) -> Vec<Value> {
    let id = message.id.to_hex();
    deliveries(relay)
        .into_iter()
        .filter(|r| r["message_event_id"] == json!(id))
        .collect()
}

/// Waits until `message` made `n` rows that all satisfy `pick`.
async fn rows_until(relay: &Relay, message: &Event, n: usize, pick: impl Fn(&Value) -> bool) -> Vec<Value> {
    for _ in 0..300 {
        let rows = rows_of(relay, message);
        if rows.len() == n && rows.iter().all(&pick) {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "message {} did not make {n} such rows: {:?}",
        message.id,
        rows_of(relay, message)
    );
}

async fn a_mention_waits_for_its_agent_and_is_answered_once(backend: Backend) {
    let admin = Keys::generate();
    let relay = start(&backend, &admin);
    let fx = Fixture::new(&relay, "ops", 2).await;
    let (agent, other) = (fx.agents[0].clone(), fx.agents[1].clone());
    let (person, mut c) = member(&relay, "ops").await;

    // Before the owner turns mentions on, a mention makes nothing; the
    // barrier: the same message's replay after, which does.
    let early = mention(&person, "ops", "@agent are you there?", &[&agent]);
    c.publish_ok(&early).await;
    let on = relayctl(
        &relay,
        &fx.owner,
        &["mentions", "on", &agent.public_key().to_hex(), "--channel", "ops"],
    );
    assert!(on.contains("on in channel ops"), "{on}");

    // The agent is offline: the mention waits. It names the other agent
    // too, whose mentions are off; its author is not an agent.
    let asked = mention(
        &person,
        "ops",
        "@agent can you check the build?",
        &[&agent, &other],
    );
    c.publish_ok(&asked).await;
    let rows = rows_until(&relay, &asked, 1, |r| r["status"] == "pending").await;
    let row = &rows[0];
    assert_eq!(row["source"], "mention", "{row}");
    assert_eq!(row["target_pubkey"], json!(agent.public_key().to_hex()));
    assert_eq!(
        row["run_id"],
        json!(asked.id.to_hex()),
        "the message id is the request key"
    );
    assert_eq!(row["workflow_id"], "", "{row}");
    assert!(rows_of(&relay, &early).is_empty(), "made before mentions were on");

    // Sent again, the message makes no second row (the barrier: a later
    // mention's row exists, so the replay was written before it).
    let (dup, _) = c.publish(&asked).await;
    assert!(dup, "a duplicate is accepted");
    let later = mention(&person, "ops", "@agent and the docs?", &[&agent]);
    c.publish_ok(&later).await;
    rows_until(&relay, &later, 1, |r| r["status"] == "pending").await;
    assert_eq!(rows_of(&relay, &asked).len(), 1, "a replay made a second row");
    // A managed agent's mention of another agent makes no work (no chains).
    let by_agent = mention(&other, "ops", "@agent ping", &[&agent]);
    let mut oc = Client::connect(&relay.ws_url()).await;
    oc.auth(&other).await;
    oc.publish_ok(&by_agent).await;

    let mut watcher = watching(&relay, &person, &agent).await;
    // A third while it is still offline: the three wait as one turn.
    let third = mention(&person, "ops", "@agent and the changelog?", &[&agent]);
    c.publish_ok(&third).await;
    rows_until(&relay, &third, 1, |r| r["status"] == "pending").await;
    let _agent = echo_agent(&relay, &agent, &fx.owner);
    let reply = watcher.next_event("chan").await;
    let turn = [&asked, &later, &third];
    let last = turn.iter().max_by_key(|m| (m.created_at, m.id)).expect("three");
    for m in turn {
        let r = rows_until(&relay, m, 1, |r| r["status"] == "delivered").await;
        assert_eq!(
            r[0]["reply_event_id"],
            json!(reply.id.to_hex()),
            "one reply answers the turn"
        );
        assert!(
            reply.content.contains(&m.content),
            "the echo answers {}: {}",
            m.content,
            reply.content
        );
    }
    assert_eq!(
        e_tags(&reply),
        vec![last.id.to_hex()],
        "threaded under the turn's last message"
    );
    // Answered once: the next reply is the answer to the next mention.
    let next = mention(&person, "ops", "@agent thanks!", &[&agent]);
    c.publish_ok(&next).await;
    let answer = watcher.next_event("chan").await;
    assert_eq!(
        answer.content,
        format!("echo: {}", next.content),
        "a second reply to the turn"
    );
    assert!(
        rows_of(&relay, &by_agent).is_empty(),
        "an agent's mention made work"
    );
    assert_eq!(
        deliveries(&relay).len(),
        4,
        "one row per mention: {:?}",
        deliveries(&relay)
    );
}

/// The event ids a message's `e` tags name.
fn e_tags(e: &Event) -> Vec<String> {
    e.tags
        .iter()
        .map(|t| t.as_slice())
        .filter(|t| t.len() >= 2 && t[0] == "e")
        .map(|t| t[1].clone())
        .collect()
}

async fn mentions_are_turned_on_by_the_agents_owner_or_an_admin(backend: Backend) {
    let admin = Keys::generate();
    let relay = start(&backend, &admin);
    let fx = Fixture::new(&relay, "ops", 1).await;
    let agent = fx.agents[0].public_key().to_hex();
    let stranger = Keys::generate();

    refused(
        rpc(&relay, &stranger, "setmentions", json!([agent, true])).await,
        403,
        "restricted:",
    );
    // An owner of another agent is an owner, not this agent's.
    let other = Fixture::new(&relay, "dev", 1).await;
    refused(
        rpc(&relay, &other.owner, "setmentions", json!([agent, true])).await,
        403,
        "not_owner:",
    );
    refused(
        rpc(
            &relay,
            &fx.owner,
            "setmentions",
            json!([Keys::generate().public_key().to_hex(), true]),
        )
        .await,
        404,
        "unknown_agent:",
    );
    refused(
        rpc(&relay, &fx.owner, "setmentions", json!([agent, true, "nowhere"])).await,
        404,
        "unknown_channel:",
    );
    refused(
        rpc(&relay, &fx.owner, "setmentions", json!([agent, "yes"])).await,
        400,
        "invalid:",
    );

    // Every channel, by the owner; one channel, by an admin.
    let set = ok(rpc(&relay, &fx.owner, "setmentions", json!([agent, true])).await);
    assert_eq!(set["channel"], Value::Null, "{set}");
    assert_eq!(set["on"], true);
    ok(rpc(&relay, &admin, "setmentions", json!([agent, true, "ops"])).await);
    let listed = ok(rpc(&relay, &fx.owner, "listmentions", json!([])).await);
    let places: Vec<&Value> = listed.as_array().unwrap().iter().map(|m| &m["channel"]).collect();
    assert_eq!(places, vec![&Value::Null, &json!("ops")], "{listed}");
    // The other owner sees none of this agent's.
    assert_eq!(
        ok(rpc(&relay, &other.owner, "listmentions", json!([])).await),
        json!([])
    );

    // Off: community-wide first; the channel's stays until turned off.
    ok(rpc(&relay, &fx.owner, "setmentions", json!([agent, false])).await);
    let listed = relayctl(&relay, &fx.owner, &["mentions", "list"]);
    assert_eq!(listed.lines().count(), 1, "{listed}");
    assert!(listed.contains(" ops "), "{listed}");
    relayctl(
        &relay,
        &fx.owner,
        &["mentions", "off", &agent, "--channel", "ops"],
    );
    assert_eq!(
        ok(rpc(&relay, &admin, "listmentions", json!([])).await),
        json!([])
    );

    // Each change was announced: a label for every channel, a kind 9 in the channel.
    let mut c = Client::connect(&relay.ws_url()).await;
    c.auth(&fx.owner).await;
    let notices = c
        .req(
            "n",
            vec![json!({"kinds": [9], "#h": ["ops"], "authors": [fx.relay_pk]})],
        )
        .await
        .events();
    let said: Vec<&str> = notices
        .iter()
        .filter(|e| e.tags.iter().any(|t| t.as_slice() == ["nip86", "setmentions"]))
        .map(|e| e.content.as_str())
        .collect();
    assert_eq!(said.len(), 2, "{said:?}");
    let labels = c
        .req(
            "l",
            vec![json!({"kinds": [1985], "#l": ["setmentions"], "authors": [fx.relay_pk]})],
        )
        .await
        .events();
    assert_eq!(labels.len(), 2, "{labels:?}");
}

async fn a_deleted_mention_takes_its_work_with_it(backend: Backend) {
    let admin = Keys::generate();
    let relay = start(&backend, &admin);
    let fx = Fixture::new(&relay, "ops", 1).await;
    let agent = fx.agents[0].clone();
    let (person, mut c) = member(&relay, "ops").await;
    mentions_on(&relay, &fx.owner, &agent).await;

    // Two mentions wait for the offline agent; the author deletes the
    // first (NIP-09), and the second is answered.
    let withdrawn = mention(&person, "ops", "@agent never mind this", &[&agent]);
    c.publish_ok(&withdrawn).await;
    rows_until(&relay, &withdrawn, 1, |r| r["status"] == "pending").await;
    let id = withdrawn.id.to_hex();
    c.publish_ok(&event(&person, 5, "", &[&["e", &id]])).await;
    assert!(
        rows_of(&relay, &withdrawn).is_empty(),
        "the deletion left its row"
    );
    let gone = c.req("gone", vec![json!({"ids": [id]})]).await.events();
    assert!(gone.is_empty(), "the deleted mention is still served");

    let kept = mention(&person, "ops", "@agent this one stands", &[&agent]);
    c.publish_ok(&kept).await;
    let _agent = echo_agent(&relay, &agent, &fx.owner);
    rows_until(&relay, &kept, 1, |r| r["status"] == "delivered").await;
    assert_eq!(deliveries(&relay).len(), 1, "{:?}", deliveries(&relay));
}

async fn removing_a_member_cancels_its_open_mentions(backend: Backend) {
    let admin = Keys::generate();
    let relay = start(&backend, &admin);
    let mut fx = Fixture::new(&relay, "ops", 2).await;
    let (agent, other) = (fx.agents[0].clone(), fx.agents[1].clone());
    for a in [&agent, &other] {
        ok(rpc(
            &relay,
            &fx.owner,
            "setmentions",
            json!([a.public_key().to_hex(), true, "ops"]),
        )
        .await);
    }
    let (alice, mut ac) = member(&relay, "ops").await;
    let (bob, mut bc) = member(&relay, "ops").await;
    let by_alice = mention(&alice, "ops", "@agent from alice", &[&agent]);
    ac.publish_ok(&by_alice).await;
    let by_bob = mention(&bob, "ops", "@agent from bob", &[&agent, &other]);
    bc.publish_ok(&by_bob).await;
    rows_until(&relay, &by_bob, 2, |r| r["status"] == "pending").await;

    // The admin removes alice: her open mention is cancelled in the
    // transaction of the removal (acknowledged before we look).
    let owner_hex = alice.public_key().to_hex();
    let remove = |who: &str| event(&fx.owner, 9001, "", &[&["h", "ops"], &["p", who]]);
    fx.owner_client.publish_ok(&remove(&owner_hex)).await;
    let rows = rows_of(&relay, &by_alice);
    assert_eq!(rows[0]["status"], "cancelled", "{rows:?}");
    assert_eq!(rows[0]["failure_code"], "member_removed", "{rows:?}");
    // The other agent is removed: bob's row for it is cancelled, his row
    // for the agent stays pending.
    fx.owner_client
        .publish_ok(&remove(&other.public_key().to_hex()))
        .await;
    let rows = rows_of(&relay, &by_bob);
    let status_for = |who: &Keys| {
        let row = rows
            .iter()
            .find(|r| r["target_pubkey"] == json!(who.public_key().to_hex()))
            .expect("a row per agent");
        row["status"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(
        (status_for(&other), status_for(&agent)),
        ("cancelled".into(), "pending".into())
    );

    // The agent answers what is left, and only that.
    let _agent = echo_agent(&relay, &agent, &fx.owner);
    rows_until(&relay, &by_bob, 2, |r| {
        r["status"] == "delivered" || r["status"] == "cancelled"
    })
    .await;
    let delivered: Vec<Value> = deliveries(&relay)
        .into_iter()
        .filter(|r| r["status"] == "delivered")
        .collect();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0]["message_event_id"], json!(by_bob.id.to_hex()));
}

async fn a_mention_over_a_cap_is_refused_with_a_notice(backend: Backend) {
    let admin = Keys::generate();
    let caps = "mentions_per_hour = 2\nmentions_per_day = 2\nmentions_per_sender_per_hour = 1\n";
    let relay = start_with(&backend, &admin, caps);
    let fx = Fixture::new(&relay, "ops", 1).await;
    let agent = fx.agents[0].clone();
    mentions_on(&relay, &fx.owner, &agent).await;
    let (alice, mut ac) = member(&relay, "ops").await;
    let (bob, mut bc) = member(&relay, "ops").await;
    let mut watcher = Client::connect(&relay.ws_url()).await;
    watcher.auth(&alice).await;
    let refusals = json!({"kinds": [9], "#h": ["ops"], "authors": [fx.relay_pk], "limit": 0});
    watcher.req("refusals", vec![refusals]).await.events();

    // Alice's second mention is over her own cap; Bob's second, over the
    // agent's cap for the hour (two rows made: Alice's first, Bob's first).
    let mut sent = Vec::new();
    for (by_alice, text) in [(true, "one"), (true, "two"), (false, "three"), (false, "four")] {
        let (who, c) = if by_alice {
            (&alice, &mut ac)
        } else {
            (&bob, &mut bc)
        };
        let m = mention(who, "ops", &format!("@agent {text}"), &[&agent]);
        c.publish_ok(&m).await;
        sent.push(m);
    }
    let made: Vec<usize> = (0..4).filter(|&i| rows_of(&relay, &sent[i]).len() == 1).collect();
    assert_eq!(made, vec![0, 2], "{:?}", deliveries(&relay));
    for (i, cap) in [(1, "per_sender_per_hour"), (3, "per_hour")] {
        let notice = watcher.next_event("refusals").await;
        let tags: Vec<&[String]> = notice.tags.iter().map(|t| t.as_slice()).collect();
        let m = &sent[i];
        assert!(
            tags.contains(&&[String::from("e"), m.id.to_hex(), String::new(), "root".into()][..]),
            "{tags:?}"
        );
        assert!(
            tags.contains(&&[String::from("p"), m.pubkey.to_hex()][..]),
            "{tags:?}"
        );
        let refused = [
            String::from("mention-refused"),
            agent.public_key().to_hex(),
            cap.into(),
        ];
        assert!(tags.contains(&&refused[..]), "{tags:?}");
    }
    let scrape = tests::metrics::scrape(&relay).await;
    for cap in ["per_hour", "per_sender_per_hour"] {
        let n = tests::metrics::value(&scrape, "relay_mentions_refused_total", &[("cap", cap)]);
        assert_eq!(n, 1.0, "{cap}");
    }
}

/// A person on nostr-tools (`tests/js/mention.mjs`): a mention answered
/// by the agent, one over the sender cap answered by the relay's notice.
async fn a_nostr_tools_client_asks_an_agent(backend: Backend) {
    if !tests::node::available() {
        eprintln!("SKIPPED: node and npm are not installed");
        return;
    }
    let admin = Keys::generate();
    let relay = start_with(&backend, &admin, "mentions_per_sender_per_hour = 1\n");
    let fx = Fixture::new(&relay, "ops", 1).await;
    let agent = fx.agents[0].clone();
    mentions_on(&relay, &fx.owner, &agent).await;
    let bot = echo_agent(&relay, &agent, &fx.owner);
    bot.wait_subscribed().await;
    let url = format!("{}/", relay.ws_url());
    let args = [url.as_str(), "ops", &agent.public_key().to_hex(), &fx.relay_pk];
    let out = tests::node::run("mention.mjs", &args, Duration::from_secs(120)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("mention client: 3 of 3 checks passed"),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An agent run with `mentions = false` fails each mention
/// `mentions_off`: the row ends `failed`, and the relay's failure notice
/// in the channel names the mention and p-tags its sender.
async fn a_mention_the_agent_refuses_fails_visibly_to_its_sender(backend: Backend) {
    let (relay, fx, agent, (person, mut c)) = one_agent_asked(&backend).await;
    let mut watcher = connected(&relay, &person).await;
    let notices = json!({"kinds": [9], "#h": ["ops"], "#p": [person.public_key().to_hex()], "limit": 0});
    watcher.req("notices", vec![notices]).await.events();
    let _bot = AgentProc::start(
        &relay,
        &agent,
        &fx.owner,
        "type = \"echo\"",
        "mentions = false\npoll_interval_secs = 1",
    );
    let asked = mention(&person, "ops", "@agent hello?", &[&agent]);
    c.publish_ok(&asked).await;
    let notice = watcher.next_event("notices").await;
    assert_eq!(notice.pubkey.to_hex(), fx.relay_pk, "{notice:?}");
    let tags: Vec<&[String]> = notice.tags.iter().map(|t| t.as_slice()).collect();
    assert!(
        tags.iter().any(|t| t[0] == "e" && t[1] == asked.id.to_hex()),
        "{tags:?}"
    );
    assert!(
        tags.iter()
            .any(|t| t[0] == "workflow-delivery-failed"
                && t.get(2).map(String::as_str) == Some("mentions_off")),
        "{tags:?}"
    );
    assert!(
        notice.content.contains("could not answer this mention"),
        "{}",
        notice.content
    );
    let rows = rows_of(&relay, &asked);
    assert_eq!(
        (rows[0]["status"].as_str(), rows[0]["failure_code"].as_str()),
        (Some("failed"), Some("mentions_off"))
    );
}

/// The sender's signal (kind 24621, p-gated): `queued` when the row is
/// made (the agent is offline), `working` when the agent claims it, then
/// the agent's reply.
async fn the_sender_sees_its_mention_queued_then_worked_on(backend: Backend) {
    let (relay, fx, agent, (person, mut c)) = one_agent_asked(&backend).await;
    let mut sc = connected(&relay, &person).await;
    let me = person.public_key().to_hex();
    sc.req("status", vec![json!({"kinds": [24621], "#p": [me], "limit": 0})])
        .await
        .events();
    let asked = mention(&person, "ops", "@agent how are we doing?", &[&agent]);
    c.publish_ok(&asked).await;
    let row = rows_until(&relay, &asked, 1, |r| r["status"] == "pending").await;
    let expect = |e: &Event, status: &str| {
        let tags: Vec<&[String]> = e.tags.iter().map(|t| t.as_slice()).collect();
        assert_eq!(e.pubkey.to_hex(), fx.relay_pk);
        for (name, value) in [
            ("e", asked.id.to_hex()),
            ("agent", agent.public_key().to_hex()),
            ("status", status.to_string()),
            ("delivery", row[0]["id"].as_str().unwrap_or_default().to_string()),
            ("h", "ops".to_string()),
        ] {
            assert!(
                tags.iter().any(|t| t[0] == name && t[1] == value),
                "{name}={value}: {tags:?}"
            );
        }
    };
    expect(&sc.next_event("status").await, "queued");
    let _agent = echo_agent(&relay, &agent, &fx.owner);
    expect(&sc.next_event("status").await, "working");
    rows_until(&relay, &asked, 1, |r| r["status"] == "delivered").await;
}

/// With the agent online, mentions said within the debounce are one turn
/// (one reply), and a thread is a conversation of its own (its own turn,
/// its reply in the thread).
async fn mentions_said_together_are_one_turn_and_threads_are_their_own(backend: Backend) {
    let (relay, fx, agent, (person, mut c)) = one_agent_asked(&backend).await;
    let mut watcher = watching(&relay, &person, &agent).await;
    let _agent = echo_agent(&relay, &agent, &fx.owner);
    // A message that starts a thread (no mention: no work).
    let topic = event(&person, 9, "release notes", &[&["h", "ops"]]);
    c.publish_ok(&topic).await;
    let first = mention(&person, "ops", "@agent is the build green?", &[&agent]);
    let second = mention(&person, "ops", "@agent and the tests?", &[&agent]);
    let agent_hex = agent.public_key().to_hex();
    let topic_hex = topic.id.to_hex();
    let in_thread = event(
        &person,
        9,
        "@agent summarise this thread",
        &[&["h", "ops"], &["e", &topic_hex, "", "root"], &["p", &agent_hex]],
    );
    for m in [&first, &second, &in_thread] {
        c.publish_ok(m).await;
    }
    let replies = [watcher.next_event("chan").await, watcher.next_event("chan").await];
    let channel_reply = replies
        .iter()
        .find(|r| r.content.contains(&first.content))
        .unwrap_or_else(|| panic!("no reply to the channel's turn: {replies:?}"));
    assert!(
        channel_reply.content.contains(&second.content),
        "one turn: {}",
        channel_reply.content
    );
    assert!(
        !channel_reply.content.contains(&in_thread.content),
        "the thread is its own turn"
    );
    let last = [&first, &second]
        .into_iter()
        .max_by_key(|m| (m.created_at, m.id))
        .expect("two");
    assert_eq!(e_tags(channel_reply), vec![last.id.to_hex()]);
    let thread_reply = replies
        .iter()
        .find(|r| r.content == format!("echo: {}", in_thread.content))
        .unwrap_or_else(|| panic!("no reply in the thread: {replies:?}"));
    assert_eq!(
        e_tags(thread_reply),
        vec![topic_hex, in_thread.id.to_hex()],
        "answered in its thread (root, then reply)"
    );
    for m in [&first, &second, &in_thread] {
        rows_until(&relay, m, 1, |r| r["status"] == "delivered").await;
    }
}

/// Two processes of one agent key (both woken, both polling): a
/// conversation's mentions are one turn, claimed by one of them, answered
/// once.
async fn two_processes_of_one_agent_answer_a_turn_once(backend: Backend) {
    let (relay, fx, agent, (person, mut c)) = one_agent_asked(&backend).await;
    let mut watcher = watching(&relay, &person, &agent).await;
    let _one = echo_agent(&relay, &agent, &fx.owner);
    let _two = echo_agent(&relay, &agent, &fx.owner);
    let said: Vec<Event> = ["@agent deploy?", "@agent which branch?", "@agent main, please"]
        .iter()
        .map(|text| mention(&person, "ops", text, &[&agent]))
        .collect();
    for m in &said {
        c.publish_ok(m).await;
    }
    let reply = watcher.next_event("chan").await;
    for m in &said {
        let r = rows_until(&relay, m, 1, |r| r["status"] == "delivered").await;
        assert_eq!(
            r[0]["reply_event_id"],
            json!(reply.id.to_hex()),
            "one turn: {}",
            reply.content
        );
    }
    // Answered once: the next reply is the answer to the next mention.
    let next = mention(&person, "ops", "@agent thanks", &[&agent]);
    c.publish_ok(&next).await;
    let answer = watcher.next_event("chan").await;
    assert_eq!(
        answer.content,
        format!("echo: {}", next.content),
        "the turn was answered twice"
    );
}

/// A conversation mentioned every second never goes quiet for the 2 s
/// debounce: once its oldest mention has waited `mention_max_wait_secs`
/// (3 here), the agent takes the turn anyway, while the mentions go on.
async fn a_conversation_that_never_goes_quiet_is_answered_within_its_longest_wait(backend: Backend) {
    let relay = start_with(&backend, &Keys::generate(), "mention_max_wait_secs = 3\n");
    let fx = Fixture::new(&relay, "ops", 1).await;
    let agent = fx.agents[0].clone();
    mentions_on(&relay, &fx.owner, &agent).await;
    let (person, mut c) = member(&relay, "ops").await;
    let mut watcher = watching(&relay, &person, &agent).await;
    let _agent = echo_agent(&relay, &agent, &fx.owner);
    let mut said = Vec::new();
    let reply = loop {
        assert!(
            said.len() < 30,
            "no answer while the conversation went on (30 mentions, a second apart)"
        );
        let m = mention(&person, "ops", &format!("@agent and {}", said.len()), &[&agent]);
        c.publish_ok(&m).await;
        said.push(m);
        if let Ok(reply) = tokio::time::timeout(Duration::from_secs(1), watcher.next_event("chan")).await {
            break reply;
        }
    };
    let first = rows_until(&relay, &said[0], 1, |r| r["status"] == "delivered").await;
    assert_eq!(
        first[0]["reply_event_id"],
        json!(reply.id.to_hex()),
        "{}",
        reply.content
    );
}
