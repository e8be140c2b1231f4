//! A short crash campaign per backend, of workflows and of mentions (the
//! long one is documented in docs/reliability.md): real relay and agent
//! processes killed at every
//! chosen point and at random times; the checker must find nothing lost,
//! duplicated, stuck or unreadable, every kill point reached, and no point
//! with more visible failures than its bound. And the checker itself: a
//! campaign whose work is broken on purpose (`--sabotage`) must fail.

use std::process::{Command, Output};

use tests::workspace_bin;

fn run(args: &[&str]) -> (Output, String) {
    let out = Command::new(workspace_bin("chaos"))
        .args(args)
        .output()
        .expect("run chaos");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}");
    (out, stdout)
}

/// The campaign's summary line; a campaign without one fails.
fn summary(stdout: &str) -> String {
    stdout
        .lines()
        .find(|l| l.starts_with("chaos "))
        .unwrap_or_else(|| panic!("no summary line (\"chaos …\"):\n{stdout}"))
        .to_string()
}

/// Runs a campaign that must pass with every counter of bad outcomes at
/// 0; its summary line.
fn campaign(args: &[&str]) -> String {
    let (out, stdout) = run(args);
    let summary = summary(&stdout);
    assert!(
        out.status.success(),
        "campaign failed: {summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for bad in [
        "unreadable=0",
        "acked_without_run=0",
        "delivered_without_effect=0",
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
        "reruns_missing=0",
        "reruns_twice=0",
    ] {
        assert!(summary.contains(&format!(" {bad} ")), "{summary}");
    }
    assert!(
        !summary.contains(" acked=0 "),
        "nothing was acknowledged: {summary}"
    );
    if !args.contains(&"--mentions") {
        assert!(!summary.contains(" reruns=0 "), "nothing was rerun: {summary}");
    }
    // Every chosen kill point was reached.
    let reached = stdout
        .lines()
        .find(|l| l.starts_with("kill points reached:"))
        .unwrap_or_else(|| panic!("no \"kill points reached:\" line:\n{stdout}"));
    let points: Vec<&str> = reached.split_whitespace().skip(3).collect();
    assert!(!points.is_empty(), "no kill point named: {reached}");
    for item in points {
        let (point, ratio) = item.split_once(':').unwrap();
        let (hit, of) = ratio.split_once('/').unwrap();
        assert_eq!(hit, of, "kill point {point} not always reached: {reached}");
    }
    summary
}

/// A short SQLite campaign broken by `sabotage`: it must exit non-zero;
/// its output.
fn sabotaged(sabotage: &str, trials: &str) -> String {
    sabotaged_with(sabotage, trials, &[])
}

/// [`sabotaged`] with more arguments (`--mentions`).
fn sabotaged_with(sabotage: &str, trials: &str, more: &[&str]) -> String {
    let mut args = vec![
        "--trials",
        trials,
        "--backend",
        "sqlite",
        "--parallel",
        "1",
        "--seed",
        "3",
        "--sabotage",
        sabotage,
    ];
    args.extend(more);
    let (out, stdout) = run(&args);
    assert!(
        !out.status.success(),
        "--sabotage {sabotage}: the campaign passed\n{stdout}"
    );
    stdout
}

#[test]
fn the_checker_fails_sabotaged_campaigns() {
    // Trials 0 and 1 kill the agent before and after its claim.
    for (sabotage, trials, failed) in [
        ("handler-fails", "2", "failed visibly"),
        ("unreachable-point", "1", "not reached"),
    ] {
        let stdout = sabotaged(sabotage, trials);
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("FAILED:") && l.contains(failed)),
            "--sabotage {sabotage}: no FAILED line naming {failed:?}\n{stdout}"
        );
    }
    for (sabotage, counter, more) in [
        ("delete-messages", "unreadable=", &[][..]),
        ("no-runs", "acked_without_run=", &[]),
        ("forget-side-effects", "delivered_without_effect=", &[]),
        // A mention lane's checker too.
        (
            "forget-side-effects",
            "delivered_without_effect=",
            &["--mentions"],
        ),
    ] {
        let summary = summary(&sabotaged_with(sabotage, "1", more));
        let n: usize = summary
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(counter))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(n > 0, "--sabotage {sabotage}: {counter}0\n{summary}");
    }
}

#[test]
fn short_campaign_sqlite() {
    let _ = campaign(&[
        "--trials",
        "48",
        "--backend",
        "sqlite",
        "--parallel",
        "2",
        "--seed",
        "7",
    ]);
}

#[test]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
fn short_campaign_postgres() {
    let _ = campaign(&[
        "--trials",
        "48",
        "--backend",
        "postgres",
        "--parallel",
        "2",
        "--pg-faults",
        "--seed",
        "7",
    ]);
}

/// The primary SIGKILLed and its synchronous standby promoted, again and
/// again, under the campaign: nothing acknowledged is lost. 36 trials,
/// two per kill point: with one, a point whose trial had 3 items failed
/// the campaign's share rule (2 of 3) on a single lease that lapsed
/// while no primary was up (the delivery and its run, each counted).
#[test]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
fn short_campaign_postgres_failover() {
    let summary = campaign(&[
        "--trials",
        "36",
        "--backend",
        "postgres",
        "--parallel",
        "2",
        "--pg-failover",
        "--seed",
        "5",
    ]);
    assert!(!summary.contains(" pg_failovers=0 "), "no failover: {summary}");
}

/// Mention lanes (`--mentions`): kills before the claim, during the
/// handler, after a recorded write, before and after a turn's final
/// commit, in the sweep of a lapsed turn, at random: nothing lost, no turn
/// run or answered twice.
#[test]
fn short_mention_campaign_sqlite() {
    let summary = campaign(&[
        "--trials",
        "18",
        "--backend",
        "sqlite",
        "--parallel",
        "2",
        "--mentions",
        "--seed",
        "11",
    ]);
    assert!(!summary.contains(" delivered=0 "), "nothing delivered: {summary}");
}

/// [`short_mention_campaign_sqlite`] on PostgreSQL, two relay processes
/// per lane, with database restarts and terminated backends.
#[test]
#[cfg_attr(not(postgres_tests), ignore = "PostgreSQL is not installed (tests/build.rs)")]
fn short_mention_campaign_postgres() {
    let summary = campaign(&[
        "--trials",
        "18",
        "--backend",
        "postgres",
        "--parallel",
        "2",
        "--pg-faults",
        "--mentions",
        "--seed",
        "11",
    ]);
    assert!(!summary.contains(" delivered=0 "), "nothing delivered: {summary}");
}
