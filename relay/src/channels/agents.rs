//! Managed agents: agent -> owner from the first valid NIP-OA attestation.

use nostr::prelude::{Event, PublicKey};
use protocol::nip_oa::Attestation;

use crate::events::rules as events;
use crate::events::InsertOutcome;
use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;

/// Records the owner (first valid attestation wins, immutable) and stores
/// the kind 0, in `tx`.
pub async fn register(
    tx: &mut Tx<'_>,
    community: &str,
    event: &Event,
    raw: &str,
    att: &Attestation,
) -> Result<InsertOutcome, StoreError> {
    let agent = event.pubkey.to_bytes();
    tx.lock(&format!("{community}:agent:{}", event.pubkey.to_hex()))
        .await?;
    match owner_of(tx, community, &agent).await? {
        Some(owner) => {
            if owner != att.owner.to_bytes() {
                return Ok(InsertOutcome::Rejected(format!(
                    "invalid: this agent is already owned by {}; ownership is immutable",
                    hex::encode(owner)
                )));
            }
        }
        None => {
            let now = tx.now().await?;
            tx.exec(
                Q::new(
                    "INSERT INTO agents (community_id, pubkey, owner, conditions, attestation, registered_at) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(community)
                .bind(agent)
                .bind(att.owner.to_bytes())
                .bind(att.conditions_raw.as_str())
                .bind(att.sig.as_str())
                .bind(now),
            )
            .await?;
        }
    }
    Ok(events::insert(tx, community, event, raw, None)
        .await?
        .of_no_deletion())
}

/// The agent's NIP-OA owner, if it is registered here.
pub async fn owner_of(
    tx: &mut Tx<'_>,
    community: &str,
    agent: &[u8; 32],
) -> Result<Option<[u8; 32]>, StoreError> {
    let q = Q::new("SELECT owner FROM agents WHERE community_id = $1 AND pubkey = $2");
    let row = tx.one(q.bind(community).bind(*agent)).await?;
    row.map(|r| r.id32(0)).transpose()
}

/// Whether `owner` owns a managed agent registered here.
pub async fn owns_any(tx: &mut Tx<'_>, community: &str, owner: &PublicKey) -> Result<bool, StoreError> {
    let q = Q::new("SELECT 1 FROM agents WHERE community_id = $1 AND owner = $2");
    tx.exists(q.bind(community).bind(owner.to_bytes())).await
}
