//! `deliveries retry|cancel` and `runs cancel` on many rows: the ids
//! given, or (deliveries) those a filter selects, shown first and changed
//! only with `--yes`. Sent 100 ids per call (`nip86::MAX_BULK_IDS`); each
//! row changes as its single call would, and what was refused is listed.

use anyhow::{anyhow, bail};
use clap::Args;
use protocol::api::{DeliveryStatus, DeliveryView};
use protocol::nip86::{BulkChanged, DeliveryChanged, DeliveryQuery, MAX_BULK_IDS};
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
    let mut all = BulkChanged::<T> {
        changed: Vec::new(),
        refused: Vec::new(),
    };
    for chunk in ids.chunks(MAX_BULK_IDS) {
        let answer: BulkChanged<T> = relay.rpc(method, json!([chunk])).await?;
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
