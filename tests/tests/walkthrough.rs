//! The five-minute walk-through of docs/agent.md, command by command, with
//! the real binaries (the relay on a free port instead of 7777).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tests::{workspace_bin, Backend, Relay};

fn agent(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(workspace_bin("agent"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run agent");
    assert!(
        out.status.success(),
        "agent {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walkthrough_from_the_docs() {
    let relay = Relay::start(&Backend::Sqlite);
    let r = relay.ws_url();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let owner = agent(d, &["keygen", "--out", "owner.key"]);
    let owner_hex = owner.lines().next().unwrap().to_string();
    let bot = agent(d, &["keygen", "--out", "bot.key"]);
    let (bot_hex, bot_npub) = (
        bot.lines().next().unwrap().to_string(),
        bot.lines().nth(1).unwrap().to_string(),
    );
    assert!(bot_npub.starts_with("npub1"));
    // Keys never overwrite, and are private.
    assert!(!Command::new(workspace_bin("agent"))
        .args(["keygen", "--out", "bot.key"])
        .current_dir(d)
        .status()
        .unwrap()
        .success());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(d.join("bot.key")).unwrap().permissions().mode() & 0o777,
        0o600
    );

    agent(
        d,
        &[
            "event",
            "--key-file",
            "owner.key",
            "--relay",
            &r,
            "--kind",
            "9007",
            "--tag",
            "h,ops",
            "--tag",
            "name,Ops",
        ],
    );
    let attestation = agent(
        d,
        &["attest", "--owner-key-file", "owner.key", "--agent", &bot_hex],
    );
    agent(
        d,
        &[
            "register",
            "--key-file",
            "bot.key",
            "--attestation",
            attestation.trim(),
            "--relay",
            &r,
        ],
    );
    agent(
        d,
        &[
            "event",
            "--key-file",
            "owner.key",
            "--relay",
            &r,
            "--kind",
            "9000",
            "--tag",
            "h,ops",
            "--tag",
            &format!("p,{bot_hex}"),
        ],
    );
    let triage = format!(
        r#"{{"name": "triage", "trigger": {{"on": "message_posted", "filter": {{"text_contains": "help"}}}},
 "steps": [{{"id": "ask", "action": "send_message",
            "text": "nostr:{bot_npub} can you look at: {{{{trigger.text}}}}"}}]}}"#
    );
    std::fs::write(d.join("triage.json"), triage).unwrap();
    agent(
        d,
        &[
            "event",
            "--key-file",
            "owner.key",
            "--relay",
            &r,
            "--kind",
            "30620",
            "--tag",
            "d,triage",
            "--tag",
            "h,ops",
            "--content-file",
            "triage.json",
        ],
    );
    std::fs::write(
        d.join("bot.toml"),
        format!("relay_url = \"{r}\"\nkey_file = \"bot.key\"\nowner = \"{owner_hex}\"\n[handler]\ntype = \"echo\"\n"),
    )
    .unwrap();
    let _bot = Kill(
        Command::new(workspace_bin("agent"))
            .args(["run", "--config", "bot.toml"])
            .current_dir(d)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    agent(
        d,
        &[
            "event",
            "--key-file",
            "owner.key",
            "--relay",
            &r,
            "--kind",
            "9",
            "--tag",
            "h,ops",
            "--content",
            "help: the build is red",
        ],
    );
    let mut reply = None;
    for _ in 0..100 {
        let lines = agent(
            d,
            &[
                "req",
                "--key-file",
                "owner.key",
                "--relay",
                &r,
                "--filter",
                r##"{"kinds":[9],"#h":["ops"]}"##,
            ],
        );
        let events: Vec<serde_json::Value> =
            lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        if let Some(e) = events.iter().find(|e| e["pubkey"] == bot_hex.as_str()) {
            assert!(events.iter().any(|e| e["content"]
                .as_str()
                .unwrap()
                .contains("can you look at: help: the build is red")));
            reply = Some(e.clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reply = reply.expect("the agent replied");
    assert!(reply["content"].as_str().unwrap().starts_with("echo: "));
    let listed = relay.cli(&["deliveries", "list"]);
    assert!(listed.contains("\"status\":\"delivered\""), "{listed}");
}
