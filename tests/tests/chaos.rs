//! A short crash campaign per backend (the long one is documented in
//! docs/reliability.md): real relay and agent processes killed at every
//! chosen point and at random times; the checker must find nothing lost,
//! duplicated or stuck.

use std::process::Command;

use tests::workspace_bin;

fn campaign(args: &[&str]) {
    let out = Command::new(workspace_bin("chaos"))
        .args(args)
        .output()
        .expect("run chaos");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("chaos "))
        .unwrap_or_default()
        .to_string();
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "campaign failed: {summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for bad in [
        "lost=0",
        "duplicate_side_effects=0",
        "duplicate_replies=0",
        "replies_without_delivered=0",
        "delivered_without_reply=0",
        "stuck=0",
        "runs_stuck=0",
        "runs_advanced_twice=0",
        "runs_without_final=0",
        "webhook_calls_twice=0",
        "approvals_decided_twice=0",
    ] {
        assert!(summary.contains(&format!(" {bad} ")), "{summary}");
    }
    // Every chosen kill point was reached.
    let reached = stdout
        .lines()
        .find(|l| l.starts_with("kill points reached:"))
        .unwrap_or_default();
    for item in reached.split_whitespace().skip(3) {
        let (point, ratio) = item.split_once(':').unwrap();
        let (hit, of) = ratio.split_once('/').unwrap();
        assert_eq!(hit, of, "kill point {point} not always reached: {reached}");
    }
}

#[test]
fn short_campaign_sqlite() {
    campaign(&[
        "--trials",
        "24",
        "--backend",
        "sqlite",
        "--parallel",
        "2",
        "--seed",
        "7",
    ]);
}

#[test]
fn short_campaign_postgres() {
    if tests::pg::bin_dir().is_none() {
        assert!(std::env::var("CI").is_err(), "PostgreSQL is required under CI");
        eprintln!("\n!!! SKIPPING PostgreSQL campaign: no PostgreSQL binaries !!!\n");
        return;
    }
    campaign(&[
        "--trials",
        "24",
        "--backend",
        "postgres",
        "--parallel",
        "2",
        "--pg-faults",
        "--seed",
        "7",
    ]);
}
