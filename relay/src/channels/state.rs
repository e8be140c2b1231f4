//! A channel as stored: its members and their roles (`ChannelView`),
//! loading it, the lock that serialises its changes, and membership rows.

use std::collections::BTreeMap;

use nostr::prelude::{Event, PublicKey};

use crate::persistence::db::{Tx, Q};
use crate::persistence::StoreError;

/// A member's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Admin,
    Member,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Member => "member",
        }
    }
}

/// A channel as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelView {
    pub id: String,
    pub name: String,
    pub about: String,
    pub picture: String,
    pub private: bool,
    pub closed: bool,
    pub deleted: bool,
    /// Member -> role, ordered (so metadata events are deterministic).
    pub members: BTreeMap<[u8; 32], Role>,
    pub metadata_at: i64,
}

impl ChannelView {
    pub fn role_of(&self, pk: &PublicKey) -> Option<Role> {
        self.members.get(&pk.to_bytes()).copied()
    }

    pub fn is_member(&self, pk: &PublicKey) -> bool {
        self.role_of(pk).is_some()
    }
}

/// Events to announce after commit.
pub type Published = Vec<(Event, String)>;

/// The key of the lock ([`Tx::lock`]) that serialises every change to one
/// channel.
pub(crate) fn lock_key(community: &str, channel: &str) -> String {
    format!("{community}:channel:{channel}")
}

/// Loads a channel with its members.
pub async fn load(tx: &mut Tx<'_>, community: &str, id: &str) -> Result<Option<ChannelView>, StoreError> {
    let row = tx
        .one(
            Q::new(
                "SELECT name, about, picture, private, closed, deleted, metadata_at FROM channels \
                 WHERE community_id = $1 AND id = $2",
            )
            .bind(community)
            .bind(id),
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let mut members = BTreeMap::new();
    for m in tx
        .all(
            Q::new("SELECT pubkey, role FROM channel_members WHERE community_id = $1 AND channel_id = $2")
                .bind(community)
                .bind(id),
        )
        .await?
    {
        let role = if m.text("role")? == "admin" {
            Role::Admin
        } else {
            Role::Member
        };
        members.insert(m.id32("pubkey")?, role);
    }
    Ok(Some(ChannelView {
        id: id.to_string(),
        name: row.text("name")?,
        about: row.text("about")?,
        picture: row.text("picture")?,
        private: row.bool("private")?,
        closed: row.bool("closed")?,
        deleted: row.bool("deleted")?,
        members,
        metadata_at: row.int("metadata_at")?,
    }))
}

pub(crate) async fn put_member(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    pk: &PublicKey,
    role: Role,
    now: i64,
) -> Result<(), StoreError> {
    tx.exec(
        Q::new(
            "INSERT INTO channel_members (community_id, channel_id, pubkey, role, added_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (community_id, channel_id, pubkey) DO UPDATE SET role = excluded.role",
        )
        .bind(community)
        .bind(channel)
        .bind(pk.to_bytes())
        .bind(role.as_str())
        .bind(now),
    )
    .await?;
    tx.exec(
        Q::new(
            "DELETE FROM channel_join_requests WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3",
        )
        .bind(community)
        .bind(channel)
        .bind(pk.to_bytes()),
    )
    .await?;
    Ok(())
}

pub(crate) async fn remove_member(
    tx: &mut Tx<'_>,
    community: &str,
    channel: &str,
    pk: &PublicKey,
) -> Result<(), StoreError> {
    tx.exec(
        Q::new("DELETE FROM channel_members WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3")
            .bind(community)
            .bind(channel)
            .bind(pk.to_bytes()),
    )
    .await?;
    Ok(())
}
