//! A batch's claims by name in one statement: which calls' claims go
//! into it (`claim_together`), and what a call that claims by name gives
//! the writer (`ClaimsTogether`). The statement is
//! `delivery::claim::claim_together`'s.

use std::collections::HashMap;

use super::Queued;
use crate::config::DeliveryConfig;
use crate::delivery::claim::{NamedClaim, Turn};
use crate::persistence::db::Tx;
use crate::persistence::StoreError;
use crate::refusal::Answer;

/// A call whose claim by name its batch may make with other callers' in
/// one statement (`delivery::claim::claim_together`), before the calls run.
pub(crate) trait ClaimsTogether<R> {
    /// The claim, if it names its row as a wake said.
    fn named_claim(&self) -> Option<NamedClaim<'_>>;

    /// The call's answer when its batch's statement claimed `turn` for it.
    fn claimed(&self, turn: Turn) -> Answer<R>;
}

/// Makes the claims by name of `batch` in one statement
/// (`delivery::claim::claim_together`): those whose auth event was fresh,
/// each of a caller with no other call in the batch (a caller's calls run
/// in order: its finish before its next claim, which then has room under
/// its agent's cap). Returns what each job's claim took, in batch order.
/// The claims are made before the batch's other calls run: they were all
/// queued at once, so either order is one they could have had.
pub(super) async fn claim_together(
    tx: &mut Tx<'_>,
    cfg: &DeliveryConfig,
    batch: &[Box<dyn Queued>],
    spent: &[Option<bool>],
) -> Result<Vec<Option<Turn>>, StoreError> {
    let mut calls_of: HashMap<[u8; 32], usize> = HashMap::new();
    for pk in batch.iter().filter_map(|j| j.caller()) {
        *calls_of.entry(pk.to_bytes()).or_default() += 1;
    }
    let mut picked = Vec::new();
    let mut claims = Vec::new();
    for (i, (job, fresh)) in batch.iter().zip(spent).enumerate() {
        let alone = job
            .caller()
            .is_some_and(|pk| calls_of.get(&pk.to_bytes()) == Some(&1));
        if *fresh == Some(false) || !alone {
            continue;
        }
        if let Some(claim) = job.named_claim() {
            picked.push(i);
            claims.push(claim);
        }
    }
    let mut together: Vec<Option<Turn>> = batch.iter().map(|_| None).collect();
    if claims.len() < 2 {
        // One claim is made by its call, as it would be on its own.
        return Ok(together);
    }
    let now = tx.now().await?;
    let claimed = crate::delivery::claim::claim_together(tx, &claims, cfg, now).await?;
    for (i, turn) in picked.into_iter().zip(claimed) {
        together[i] = turn;
    }
    Ok(together)
}
