//! Published JavaScript client libraries against the relay, on every
//! backend: nostr-tools' NIP-29 helpers (`tests/js/nip29.mjs`) create a
//! closed channel, load it back, invite, join, put and remove users, check
//! `previous`, delete an event and leave, each answer checked by the script;
//! nostr-tools' subscribe-by-id-then-publish pattern (`tests/js/ids.mjs`),
//! in both orders.

use std::time::Duration;

use tests::{backend_tests, Backend, Relay};

backend_tests!(nostr_tools_nip29_client, nostr_tools_subscribe_by_id);

async fn nostr_tools_nip29_client(backend: Backend) {
    script(&backend, "nip29.mjs", "nip29 client: 6 of 6 checks passed").await;
}

/// A REQ by an id not stored yet stays live: the event published after it
/// arrives (the relay closes a REQ by ids only when it found every id).
async fn nostr_tools_subscribe_by_id(backend: Backend) {
    script(&backend, "ids.mjs", "ids client: 3 of 3 checks passed").await;
}

/// Runs `name` against a fresh relay; it must exit 0 and print `summary`.
async fn script(backend: &Backend, name: &str, summary: &str) {
    if !tests::node::available() {
        eprintln!("SKIPPED: node and npm are not installed");
        return;
    }
    let relay = Relay::start(backend);
    let url = format!("{}/", relay.ws_url());
    let out = tests::node::run(name, &[&url], Duration::from_secs(120)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(summary), "{stdout}");
}
