//! `deliveries retry|cancel` and `runs cancel|rerun` on many rows: the
//! ids given, or (deliveries, reruns) those a filter selects, shown first
//! and changed only with `--yes`. Sent 100 ids per call (`nip86::MAX_BULK_IDS`); each
//! row changes as its single call would, and what was refused is listed.

use anyhow::{anyhow, bail};
use clap::Args;
use protocol::api::{DeliveryStatus, DeliveryView, RunStatus, RunView, RunsPage};
use protocol::nip86::{
    BulkChanged, DeliveryChanged, DeliveryQuery, RerunDefinition, RerunOptions, RunRerun, MAX_BULK_IDS,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;

use crate::client::Relay;
use crate::show::table;
use crate::Out;

/// Which rows: ids, or a filter.
#[derive(Args)]
pub struct Selection {
    /// Delivery ids (one or more); or none, with a filter below.
    pub ids: Vec<String>,
    /// Only deliveries of this status (retry: failed, expired or
    /// cancelled; cancel: pending or claimed; default: all of those).
    #[arg(long)]
    pub status: Option<String>,
    #[arg(long)]
    pub workflow: Option<String>,
    /// Only those created at least this many seconds ago.
    #[arg(long)]
    pub older_than: Option<u64>,
    /// Most rows a filter selects (1 to 500).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Change what the filter selects (without it: only show them).
    #[arg(long)]
    pub yes: bool,
}

impl Selection {
    fn filtered(&self) -> bool {
        self.status.is_some() || self.workflow.is_some() || self.older_than.is_some()
    }
}

/// Retries (`retry`) or cancels the selected deliveries.
pub async fn deliveries(relay: &Relay, out: Out, sel: Selection, retry: bool) -> anyhow::Result<()> {
    let (method, verb, from): (&str, &str, &[DeliveryStatus]) = if retry {
        let from = &[
            DeliveryStatus::Failed,
            DeliveryStatus::Expired,
            DeliveryStatus::Cancelled,
        ];
        ("retrydeliveries", "retried", from)
    } else {
        (
            "canceldeliveries",
            "cancelled",
            &[DeliveryStatus::Pending, DeliveryStatus::Claimed],
        )
    };
    let ids = if sel.filtered() {
        if !sel.ids.is_empty() {
            bail!("give delivery ids or a filter (--status, --workflow, --older-than), not both");
        }
        let selected = select(relay, &sel, from).await?;
        if !sel.yes {
            show_selected(out, &selected, verb);
            return Ok(());
        }
        selected.into_iter().map(|d| d.id).collect()
    } else if sel.ids.is_empty() {
        bail!("give delivery ids, or a filter (--status, --workflow, --older-than)");
    } else if let [id] = sel.ids.as_slice() {
        // One id: the single call, and its own refusal as the error.
        let (single, done) = if retry {
            ("retrydelivery", format!("delivery {id} is pending again"))
        } else {
            ("canceldelivery", format!("delivery {id} cancelled"))
        };
        relay.rpc::<DeliveryChanged>(single, json!([id])).await?;
        out.done(&done);
        return Ok(());
    } else {
        sel.ids
    };
    send::<DeliveryChanged>(relay, out, method, ids, verb).await
}

/// Cancels the runs `ids`.
pub async fn runs(relay: &Relay, out: Out, ids: Vec<String>) -> anyhow::Result<()> {
    send::<protocol::nip86::RunChanged>(relay, out, "cancelruns", ids, "cancelled").await
}

/// Which runs to rerun: ids, or a filter over one workflow's runs.
#[derive(Args)]
pub struct RunSelection {
    /// Run ids (one or more); or none, with `--workflow` and a filter below.
    pub ids: Vec<String>,
    /// The workflow whose runs the filter reads.
    #[arg(long)]
    pub workflow: Option<String>,
    /// Only runs of this status: failed or cancelled (default: both).
    #[arg(long)]
    pub status: Option<String>,
    /// Only runs whose error has this code (`webhook_failed`, ...).
    #[arg(long)]
    pub error_code: Option<String>,
    /// Only runs created at or after this unix time.
    #[arg(long)]
    pub since: Option<i64>,
    /// Only runs created before this unix time.
    #[arg(long)]
    pub until: Option<i64>,
    /// Most runs the filter reads, newest first (1 to 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
    /// Rerun with the workflow's latest definition, not the one each run ran with.
    #[arg(long)]
    pub latest: bool,
    /// Rerun what the filter selects (without it: only show them).
    #[arg(long)]
    pub yes: bool,
}

/// Reruns the selected runs from the step each ended at.
pub async fn reruns(relay: &Relay, out: Out, sel: RunSelection) -> anyhow::Result<()> {
    let options = RerunOptions {
        definition: if sel.latest {
            RerunDefinition::Latest
        } else {
            RerunDefinition::Kept
        },
    };
    let ids = match (&sel.workflow, sel.ids.as_slice()) {
        (Some(_), [_, ..]) => bail!("give run ids or a filter (--workflow ...), not both"),
        (None, []) => bail!("give run ids, or --workflow with a filter (--error-code, --since, --until)"),
        (None, [id]) => {
            // One id: the single call, and its own refusal as the error.
            let a: RunRerun = relay.rpc("rerunrun", json!([id, options])).await?;
            if out.json {
                out.json(&a);
            } else if a.created {
                println!("run {} reruns run {id} from step {}", a.rerun, a.from_step);
            } else {
                println!("run {id} was rerun before: run {}", a.rerun);
            }
            return Ok(());
        }
        (None, _) => sel.ids.clone(),
        (Some(workflow), []) => {
            let selected = select_runs(relay, workflow, &sel).await?;
            if !sel.yes {
                show_selected_runs(out, &selected);
                return Ok(());
            }
            selected.into_iter().map(|r| r.id).collect()
        }
    };
    send_with::<RunRerun>(relay, out, "rerunruns", ids, "rerun", json!(options)).await
}

/// The workflow's runs the filter selects, newest first, reading at most
/// `--limit` runs (pages of 100).
async fn select_runs(relay: &Relay, workflow: &str, sel: &RunSelection) -> anyhow::Result<Vec<RunView>> {
    let statuses: &[RunStatus] = match sel.status.as_deref() {
        None => &[RunStatus::Failed, RunStatus::Cancelled],
        Some("failed") => &[RunStatus::Failed],
        Some("cancelled") => &[RunStatus::Cancelled],
        Some(_) => bail!("--status: failed or cancelled"),
    };
    let mut before = sel.until.map(|t| (t, None::<String>));
    let mut read = 0u32;
    let mut selected = Vec::new();
    while read < sel.limit {
        let page_size = (sel.limit - read).min(100);
        let mut path = format!("/workflows/{workflow}/runs?limit={page_size}");
        if let Some((b, id)) = &before {
            path.push_str(&format!("&before={b}"));
            if let Some(id) = id {
                path.push_str(&format!("&before_id={id}"));
            }
        }
        let page: RunsPage = relay.call("GET", &path, None).await?;
        read += u32::try_from(page.runs.len()).unwrap_or(u32::MAX);
        let past_since = page
            .runs
            .last()
            .is_some_and(|r| sel.since.is_some_and(|s| r.created_at < s));
        selected.extend(page.runs.into_iter().filter(|r| {
            statuses.contains(&r.status)
                && sel.since.is_none_or(|s| r.created_at >= s)
                && (sel.error_code.is_none() || r.error.as_ref().map(|e| &e.code) == sel.error_code.as_ref())
        }));
        match page.next_before {
            Some(next) if !past_since => before = Some((next, page.next_before_id)),
            _ => break,
        }
    }
    Ok(selected)
}

fn show_selected_runs(out: Out, selected: &[RunView]) {
    if out.json {
        out.json(&json!({ "selected": selected.iter().map(|r| &r.id).collect::<Vec<_>>() }));
        return;
    }
    let rows: Vec<Vec<String>> = selected
        .iter()
        .map(|r| {
            let at = r.steps.get(usize::try_from(r.current_step).unwrap_or(usize::MAX));
            vec![
                r.id.clone(),
                r.status.as_str().into(),
                at.map_or("-".into(), |s| s.id.clone()),
                r.error.as_ref().map_or("-".into(), |e| e.code.clone()),
            ]
        })
        .collect();
    table(&["RUN", "STATUS", "FROM STEP", "ERROR"], &rows);
    println!(
        "{} runs selected; nothing rerun: run again with --yes to do it",
        selected.len()
    );
}

/// The deliveries the filter selects that the action can change.
async fn select(
    relay: &Relay,
    sel: &Selection,
    from: &[DeliveryStatus],
) -> anyhow::Result<Vec<DeliveryView>> {
    let status = sel
        .status
        .as_deref()
        .map(|s| {
            DeliveryStatus::parse(s)
                .filter(|st| from.contains(st))
                .ok_or_else(|| {
                    let names: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
                    anyhow!("--status: one of {}", names.join(", "))
                })
        })
        .transpose()?;
    let q = DeliveryQuery {
        status,
        workflow: sel.workflow.clone(),
        older_than_secs: sel.older_than,
        limit: Some(sel.limit),
        ..Default::default()
    };
    let list: Vec<DeliveryView> = relay.rpc("listdeliveries", json!([q])).await?;
    Ok(list.into_iter().filter(|d| from.contains(&d.status)).collect())
}

fn show_selected(out: Out, selected: &[DeliveryView], verb: &str) {
    if out.json {
        out.json(&json!({ "selected": selected.iter().map(|d| &d.id).collect::<Vec<_>>() }));
        return;
    }
    let rows: Vec<Vec<String>> = selected
        .iter()
        .map(|d| {
            vec![
                d.id.clone(),
                d.status.as_str().into(),
                format!("{}/{}", d.workflow_id, d.step_id),
            ]
        })
        .collect();
    table(&["DELIVERY", "STATUS", "WORKFLOW/STEP"], &rows);
    println!(
        "{} deliveries selected; nothing {verb}: run again with --yes to do it",
        selected.len()
    );
}

/// Sends `ids` 100 at a time; prints what changed and what was refused.
async fn send<T: DeserializeOwned + Serialize>(
    relay: &Relay,
    out: Out,
    method: &str,
    ids: Vec<String>,
    verb: &str,
) -> anyhow::Result<()> {
    send_with::<T>(relay, out, method, ids, verb, serde_json::Value::Null).await
}

/// As `send`, with `options` as each call's second parameter (unless null).
async fn send_with<T: DeserializeOwned + Serialize>(
    relay: &Relay,
    out: Out,
    method: &str,
    ids: Vec<String>,
    verb: &str,
    options: serde_json::Value,
) -> anyhow::Result<()> {
    let mut all = BulkChanged::<T> {
        changed: Vec::new(),
        refused: Vec::new(),
    };
    for chunk in ids.chunks(MAX_BULK_IDS) {
        let params = if options.is_null() {
            json!([chunk])
        } else {
            json!([chunk, options])
        };
        let answer: BulkChanged<T> = relay.rpc(method, params).await?;
        all.changed.extend(answer.changed);
        all.refused.extend(answer.refused);
    }
    if out.json {
        out.json(&all);
    } else {
        println!("{} of {} {verb}", all.changed.len(), ids.len());
        for r in &all.refused {
            println!("refused {}: {}", r.id, r.error);
        }
    }
    if all.refused.is_empty() {
        Ok(())
    } else {
        bail!("{} of {} refused", all.refused.len(), ids.len())
    }
}
