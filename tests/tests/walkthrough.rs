//! The five-minute walk-through of docs/agent.md: pasted whole into bash,
//! twice in a row, as the docs say; and command by command with more
//! checks (the relay on a free port instead of 7777).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tests::{workspace_bin, Backend, Relay, RelayOptions};

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

/// `relayctl` run in `dir` with `env`; (success, stdout, stderr).
fn relayctl_env(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let out = Command::new(workspace_bin("relayctl"))
        .args(args)
        .envs(env.iter().copied())
        .env_remove("RELAYCTL_KEY")
        .current_dir(dir)
        .output()
        .expect("run relayctl");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// `relayctl` as the owner (`RELAYCTL_KEY_FILE=owner.key`); its stdout.
fn relayctl(dir: &Path, url: &str, args: &[&str]) -> String {
    let env = [("RELAYCTL_KEY_FILE", "owner.key"), ("RELAYCTL_URL", url)];
    let (ok, out, err) = relayctl_env(dir, &env, args);
    assert!(ok, "relayctl {args:?}: {err}");
    out
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
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let owner = agent(d, &["keygen", "--out", "owner.key"]);
    let owner_hex = owner.lines().next().unwrap().to_string();
    // The owner also administers the community (docs: relay.toml).
    let relay = Relay::start_opts(
        &Backend::Sqlite,
        RelayOptions {
            config_toml: format!("[communities.default]\nadmins = [\"{owner_hex}\"]\n"),
            ..Default::default()
        },
    );
    let r = relay.ws_url();
    let url = relay.http_url();
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
        "name: triage\ntrigger:\n  on: message_posted\n  filter:\n    text_contains: help\n\
         steps:\n  - id: ask\n    action: send_message\n    \
         text: \"nostr:{bot_npub} can you look at: {{{{trigger.text}}}}\"\n"
    );
    std::fs::write(d.join("triage.yaml"), triage).unwrap();
    // A definition the relay would refuse is refused before it is sent,
    // with the relay's own words.
    std::fs::write(
        d.join("broken.yaml"),
        "name: broken\ntrigger: {on: manual}\nsteps:\n  - id: x\n    action: teleport\n",
    )
    .unwrap();
    let env = [("RELAYCTL_KEY_FILE", "owner.key"), ("RELAYCTL_URL", url.as_str())];
    let (ok, _, err) = relayctl_env(
        d,
        &env,
        &["workflow", "publish", "broken.yaml", "--channel", "ops"],
    );
    assert!(
        !ok && err.contains("invalid:") && err.contains("teleport"),
        "{err}"
    );
    let out = relayctl(
        d,
        &url,
        &["workflow", "publish", "triage.yaml", "--channel", "ops"],
    );
    assert!(out.contains("published workflow triage"), "{out}");
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

    // 7. The owner looks at runs and deliveries, pauses and resumes, bans.
    let runs = relayctl(d, &url, &["runs", "list", "triage"]);
    assert!(
        runs.starts_with("RUN")
            && runs.contains("completed")
            && runs.contains(" 1/1 ")
            && runs.contains(" ago)"),
        "{runs}"
    );
    let listed: serde_json::Value =
        serde_json::from_str(&relayctl(d, &url, &["--json", "deliveries", "list"])).unwrap();
    let id = listed["deliveries"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(listed["deliveries"][0]["status"], "delivered");
    let shown = relayctl(d, &url, &["deliveries", "show", &id]);
    assert!(
        shown.contains("ATTEMPT") && shown.contains("delivered"),
        "{shown}"
    );
    // The reply, read over the relay's WebSocket as the owner.
    let reply_line = format!("reply       {}", reply["content"].as_str().unwrap());
    assert!(shown.contains(&reply_line), "{shown}");
    // The workflows, listed and shown.
    let workflows = relayctl(d, &url, &["workflow", "list"]);
    assert!(
        workflows.starts_with("WORKFLOW") && workflows.contains("triage") && workflows.contains("enabled"),
        "{workflows}"
    );
    let shown = relayctl(d, &url, &["workflow", "show", "triage"]);
    assert!(shown.contains("\"text_contains\": \"help\""), "{shown}");
    let listed: serde_json::Value =
        serde_json::from_str(&relayctl(d, &url, &["--json", "workflow", "list"])).unwrap();
    assert_eq!(listed["workflows"][0]["id"], "triage", "{listed}");
    // A reader that stops early ends relayctl quietly (no panic, no error).
    let path = format!(
        "{}:{}",
        workspace_bin("relayctl").parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let piped = Command::new("bash")
        // `true` reads nothing and is gone before relayctl has its answer:
        // relayctl's writes meet a closed pipe.
        .args([
            "-c",
            "relayctl --json workflow list | true; relayctl runs list triage | true; \
             relayctl workflow list | head -n 1",
        ])
        .env("PATH", path)
        .envs(env.iter().copied())
        .current_dir(d)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(stderr.is_empty(), "{stderr}");
    let header = workflows.lines().next().unwrap();
    assert_eq!(String::from_utf8_lossy(&piped.stdout), format!("{header}\n"));
    // --json is the relay's own answer, read into its protocol type.
    let detail: protocol::api::DeliveryDetail =
        serde_json::from_str(&relayctl(d, &url, &["--json", "deliveries", "show", &id])).unwrap();
    assert_eq!(detail.delivery.id, id);
    assert_eq!(detail.attempts.len(), 1);
    let page: protocol::api::RunsPage =
        serde_json::from_str(&relayctl(d, &url, &["--json", "runs", "list", "triage"])).unwrap();
    let run_id = page.runs[0].id.clone();
    let run = relayctl(d, &url, &["runs", "show", &run_id]);
    assert!(
        run.contains(&run_id) && run.contains("completed") && run.contains("send_message"),
        "{run}"
    );
    let me: protocol::api::Me = serde_json::from_str(&relayctl(d, &url, &["--json", "whoami"])).unwrap();
    assert_eq!(me.channels, ["ops"]);
    assert!(relayctl(d, &url, &["workflow", "pause", "triage"]).contains("paused"));
    assert!(relayctl(d, &url, &["workflow", "resume", "triage"]).contains("resumed"));
    let (ok, _, err) = relayctl_env(d, &env, &["workflow", "run", "triage"]);
    assert!(!ok && err.contains("409 wrong_trigger"), "{err}");
    let stranger = relayctl(d, &url, &["keygen", "--out", "stranger.key"]);
    let stranger = stranger.trim();
    relayctl(d, &url, &["ban", "pubkey", stranger, "--reason", "spam"]);
    let bans = relayctl(d, &url, &["bans"]);
    assert!(bans.contains(stranger) && bans.contains("spam"), "{bans}");
    // Someone else's key may not retry the owner's delivery: a clear refusal.
    let other = agent(d, &["keygen", "--out", "other.key"]);
    let env = [("RELAYCTL_KEY_FILE", "other.key"), ("RELAYCTL_URL", url.as_str())];
    let (ok, _, err) = relayctl_env(d, &env, &["deliveries", "retry", &id]);
    assert!(
        !ok && err.contains("403") && err.contains("hint:"),
        "{other}: {err}"
    );
}

/// The walk-through's shell block in docs/agent.md, as written.
fn walkthrough_script() -> String {
    let doc = std::fs::read_to_string(tests::workspace_root().join("docs/agent.md")).unwrap();
    let section = doc
        .split("## Five-minute walk-through")
        .nth(1)
        .expect("docs/agent.md has the walk-through");
    let start = section.find("```sh\n").expect("its shell block") + "```sh\n".len();
    let len = section[start..].find("```").expect("the block ends");
    section[start..start + len].to_string()
}

/// docs/agent.md's walk-through pasted whole into bash (`-e`: every
/// command must succeed), twice in a row: the second run needs nothing
/// from the first to be cleaned up. The binaries are the ones the tests
/// built (the script's `cargo build --release` is left out, and its
/// `target/release` is looked for in an empty folder, so it finds
/// nothing there); the relay listens on 7777, as in the docs.
#[test]
fn the_walkthrough_script_runs_whole_twice() {
    let script = walkthrough_script();
    let build = "cargo build --release\n";
    assert!(script.starts_with(build), "{script}");
    let script = &script[build.len()..];
    let bins = workspace_bin("relay").parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bins.display(), std::env::var("PATH").unwrap_or_default());
    for round in 1..=2 {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("timeout")
            .args(["120", "bash", "-e", "-c", script])
            .env("PATH", &path)
            .env_remove("RELAYCTL_KEY")
            .current_dir(dir.path())
            .output()
            .expect("run bash");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success(),
            "round {round}: {:?}\n{stdout}\n{stderr}",
            out.status
        );
        // The agent's reply was read back (step 6), its delivery shown,
        // and the ban listed (step 7).
        assert!(stdout.contains("echo: "), "round {round}: {stdout}");
        assert!(stdout.contains("ATTEMPT"), "round {round}: {stdout}");
        assert!(stdout.contains("spam"), "round {round}: {stdout}");
    }
}
