//! Real deployments and the network in front of the relay: slow and silent
//! connections, connections per address, orchestrator environments,
//! listen addresses, where the store is and who may create it, and
//! community keys kept out of the database.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;
use tests::relay::{run_cli_env, run_relay, Store};
use tests::workflow::relay_pubkey;
use tests::{backend_tests, event, Backend, Client, Relay, RelayOptions};

backend_tests!(
    community_keys_can_live_in_files,
    commands_other_than_serve_need_a_store
);

fn opts(toml: &str) -> RelayOptions {
    RelayOptions {
        config_toml: toml.into(),
        ..Default::default()
    }
}

/// Waits up to `within` for the relay to close `s` (EOF or reset).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // an answer (408) before the close
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn slow_and_silent_connections_are_closed() {
    let relay = Relay::start_opts(
        &Backend::Sqlite,
        opts("[limits]\nheader_read_timeout_ms = 1000\nbody_read_timeout_ms = 1000\n"),
    );
    let addr = relay.addr;
    let mut silent: Vec<TcpStream> = (0..100).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut half: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                .unwrap();
            s
        })
        .collect();
    // A body that never finishes.
    let mut slow_body = TcpStream::connect(addr).unwrap();
    slow_body
        .write_all(b"POST /hooks/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"a\":")
        .unwrap();
    let started = Instant::now();
    for s in silent.iter_mut().chain(half.iter_mut()) {
        assert!(
            closed_within(s, Duration::from_secs(10)),
            "a connection was left open"
        );
    }
    let mut answer = String::new();
    slow_body.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = slow_body.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"body_timeout\""), "{answer}");
    // The relay still serves (and a well-behaved client is not hurried).
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = Client::connect(&relay.ws_url()).await;
        let k = nostr::prelude::Keys::generate();
        c.publish_ok(&event(&k, 1, "still serving", &[])).await;
    });
    eprintln!("closed 200 stalled connections within {:?}", started.elapsed());
}

#[test]
fn connections_per_address_are_capped() {
    let relay = Relay::start_opts(
        &Backend::Sqlite,
        opts("[limits]\nmax_connections_per_ip = 5\nconnection_cap_exempt = []\n"),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut open = Vec::new();
        for _ in 0..5 {
            open.push(Client::connect(&relay.ws_url()).await);
        }
        assert!(Client::connect_host(&relay.ws_url(), None).await.is_err());
        let mut raw = tokio::net::TcpStream::connect(relay.addr).await.unwrap();
        let mut answer = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut raw, &mut answer)
            .await
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
        assert!(answer.contains("\"too_many_connections\""), "{answer}");
        // A closed connection frees its place (after its socket lingers).
        open.pop().unwrap().close().await;
        let mut again = None;
        for _ in 0..50 {
            if let Ok(c) = Client::connect_host(&relay.ws_url(), None).await {
                again = Some(c);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(again.is_some(), "the freed place was not given back");
    });
}

#[test]
fn orchestrator_variables_do_not_stop_the_relay_typos_do() {
    // What a Kubernetes Service named `relay` (and one named `relay-db`)
    // injects into every pod.
    let injected = [
        ("RELAY_PORT", "tcp://10.0.0.7:7777"),
        ("RELAY_PORT_7777_TCP", "tcp://10.0.0.7:7777"),
        ("RELAY_PORT_7777_TCP_ADDR", "10.0.0.7"),
        ("RELAY_PORT_7777_TCP_PORT", "7777"),
        ("RELAY_PORT_7777_TCP_PROTO", "tcp"),
        ("RELAY_SERVICE_HOST", "10.0.0.7"),
        ("RELAY_SERVICE_PORT", "7777"),
        ("RELAY_SERVICE_PORT_WS", "7777"),
        ("RELAY_DB_SERVICE_HOST", "10.0.0.8"),
        ("RELAY_DB_PORT", "tcp://10.0.0.8:5432"),
    ];
    let relay = Relay::start_opts(
        &Backend::Sqlite,
        RelayOptions {
            env: injected
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        },
    );
    // It started (its first line was read) and serves.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = Client::connect(&relay.ws_url()).await;
        let k = nostr::prelude::Keys::generate();
        c.publish_ok(&event(&k, 1, "in a pod", &[])).await;
    });
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("r.db").display());
    let typo = run_relay(
        &["--listen", "127.0.0.1:0", "--database-url", &db],
        &[("RELAY_LIMITS__MAX_LIMT", "5")],
        dir.path(),
        Duration::from_secs(20),
    );
    assert!(typo.code.is_some_and(|c| c != 0), "{typo:?}");
    assert!(typo.stderr.contains("max_limt"), "{typo:?}");
}

#[test]
fn a_sqlite_path_in_a_missing_directory_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/dir/relay.db");
    let url = format!("sqlite://{}", path.display());
    let out = run_relay(
        &["--listen", "127.0.0.1:0", "--database-url", &url],
        &[],
        dir.path(),
        Duration::from_secs(20),
    );
    assert!(out.code.is_some_and(|c| c != 0), "{out:?}");
    assert!(out.ran < Duration::from_secs(10), "took {:?}", out.ran);
    assert!(out.stderr.contains(&path.display().to_string()), "{out:?}");
    assert!(out.stderr.contains("does not exist"), "{out:?}");
}

#[test]
fn an_unreachable_postgres_is_named_with_its_cause() {
    // A port where nothing listens: the start waits (1 s here), then stops
    // naming the server and why, not only "pool timed out".
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("postgres://relay:secret@127.0.0.1:{port}/relay");
    let out = run_relay(
        &["--listen", "127.0.0.1:0", "--database-url", &url],
        &[
            ("RELAY_STARTUP_DB_WAIT_SECS", "1"),
            ("RELAY_POSTGRES__ACQUIRE_TIMEOUT_MS", "500"),
        ],
        dir.path(),
        Duration::from_secs(30),
    );
    assert!(out.code.is_some_and(|c| c != 0), "{out:?}");
    let named = format!("cannot reach PostgreSQL at postgres://relay:***@127.0.0.1:{port}/relay");
    assert!(out.stderr.contains(&named), "{out:?}");
    assert!(out.stderr.contains("refused"), "{out:?}");
    assert!(
        !out.stderr.contains("secret"),
        "the password is not shown: {out:?}"
    );
}

#[test]
fn listen_takes_host_port_ipv6_and_several_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_relay(&["--listen", "7778"], &[], dir.path(), Duration::from_secs(20));
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("host:port"), "{out:?}");
    assert!(
        !dir.path().join("relay.db").exists(),
        "a refused start created a store"
    );
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("this machine has no IPv6 loopback: the IPv6 half is not checked");
        return;
    }
    let relay = Relay::start_listening(
        Store::new(&Backend::Sqlite),
        RelayOptions::default(),
        "127.0.0.1:0,[::1]:0",
    );
    assert!(relay.addr.is_ipv4());
    let v6 = *relay
        .addrs
        .iter()
        .find(|a| a.is_ipv6())
        .expect("an IPv6 listen address");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = Client::connect(&format!("ws://{v6}")).await;
        let k = nostr::prelude::Keys::generate();
        c.publish_ok(&event(&k, 1, "over IPv6", &[])).await;
        let mut v4 = Client::connect(&relay.ws_url()).await;
        assert_eq!(
            v4.req("x", vec![json!({"authors": [k.public_key().to_hex()]})])
                .await
                .events()
                .len(),
            1
        );
    });
}

async fn commands_other_than_serve_need_a_store(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = match &backend {
        Backend::Sqlite => format!("sqlite://{}", dir.path().join("relay.db").display()),
        Backend::Postgres(server) => server.create_database(),
    };
    for args in [
        vec!["deliveries", "list"],
        vec!["runs", "list"],
        vec!["community", "list"],
    ] {
        let mut all = vec!["--database-url", url.as_str()];
        all.extend(args.iter().copied());
        let out = run_relay(&all, &[], dir.path(), Duration::from_secs(30));
        assert!(out.code.is_some_and(|c| c != 0), "{args:?}: {out:?}");
        assert!(out.stderr.contains("relay serve"), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
    }
    assert!(
        !dir.path().join("relay.db").exists(),
        "a command created the store"
    );
    // Once `serve` made it, they read it and say which database that is.
    let store = std::sync::Arc::new(Store {
        dir,
        database_url: url.clone(),
        backend: backend.clone(),
    });
    let relay = Relay::start_with(store, RelayOptions::default());
    let out = run_relay(
        &["--database-url", &url, "community", "list"],
        &[],
        relay.store.dir.path(),
        Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.starts_with("default\t"), "{out:?}");
    assert!(out.stderr.contains("relay: database "), "{out:?}");
}

async fn community_keys_can_live_in_files(backend: Backend) {
    let keys = tempfile::tempdir().unwrap();
    let keys_dir = keys.path().display().to_string();
    // A relay that starts with keys_dir keeps new communities' keys there.
    let relay = Relay::start_opts(&backend, opts(&format!("keys_dir = \"{keys_dir}\"\n")));
    let file = keys.path().join("default.key");
    let secret = std::fs::read_to_string(&file).expect("the default community's key file");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let from_file = nostr::prelude::Keys::parse(secret.trim())
        .unwrap()
        .public_key()
        .to_hex();
    assert_eq!(relay_pubkey(&relay, &relay.addr.to_string()).await, from_file);
    let stored = relay
        .store
        .sql("SELECT secret_key_hex FROM communities WHERE id = 'default'");
    assert_eq!(stored, format!("file:{from_file}"));
    let mut c = Client::connect(&relay.ws_url()).await;
    let k = nostr::prelude::Keys::generate();
    c.auth(&k).await;
    c.publish_ok(&event(&k, 9007, "", &[&["h", "kf"]])).await;
    let meta = c
        .req("m", vec![json!({"kinds": [39000], "#d": ["kf"]})])
        .await
        .events();
    assert_eq!(
        meta[0].pubkey.to_hex(),
        from_file,
        "metadata not signed with the file's key"
    );
    drop(relay);

    // An existing store: keys-out moves the keys; the relay then needs them.
    let keys = tempfile::tempdir().unwrap();
    let keys_dir = keys.path().display().to_string();
    let relay = Relay::start(&backend);
    let before = relay_pubkey(&relay, &relay.addr.to_string()).await;
    let in_db = relay
        .store
        .sql("SELECT secret_key_hex FROM communities WHERE id = 'default'");
    assert_eq!(in_db.len(), 64, "{in_db}");
    let moved = run_cli_env(
        &relay.store.database_url,
        &["community", "keys-out"],
        &[("RELAY_KEYS_DIR", &keys_dir)],
    );
    assert!(moved.contains("\tfile"), "{moved}");
    let stored = relay
        .store
        .sql("SELECT secret_key_hex FROM communities WHERE id = 'default'");
    assert_eq!(stored, format!("file:{before}"));
    let listed = relay.cli(&["community", "list"]);
    assert!(listed.contains(&before), "{listed}");
    let store = relay.store.clone();
    drop(relay);
    // Without the key directory it refuses to start, naming why.
    let out = run_relay(
        &["--listen", "127.0.0.1:0", "--database-url", &store.database_url],
        &[],
        store.dir.path(),
        Duration::from_secs(30),
    );
    assert!(out.code.is_some_and(|c| c != 0), "{out:?}");
    assert!(out.stderr.contains("keys_dir"), "{out:?}");
    let relay = Relay::start_with(store, opts(&format!("keys_dir = \"{keys_dir}\"\n")));
    assert_eq!(relay_pubkey(&relay, &relay.addr.to_string()).await, before);
}
