//! Published JavaScript client libraries against the relay, on every
//! backend: nostr-tools' NIP-29 helpers (`tests/js/nip29.mjs`) create a
//! closed channel, load it back, invite, join, put and remove users, check
//! `previous`, delete an event and leave, each answer checked by the script.

use std::time::Duration;

use tests::{backend_tests, Backend, Relay};

backend_tests!(nostr_tools_nip29_client);

async fn nostr_tools_nip29_client(backend: Backend) {
    if !tests::node::available() {
        eprintln!("SKIPPED: node and npm are not installed");
        return;
    }
    let relay = Relay::start(&backend);
    let url = format!("{}/", relay.ws_url());
    let out = tests::node::run("nip29.mjs", &[&url], Duration::from_secs(120)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "nip29.mjs: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("nip29 client: 6 of 6 checks passed"), "{stdout}");
}
