//! A community's settings: the default community made at start, its
//! channel policy, and who may write (`Access`).

use serde::{Deserialize, Serialize};

/// The community served with no setup.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DefaultCommunity {
    /// Create it on start when missing.
    pub enabled: bool,
    /// Its id.
    pub id: String,
    /// Hosts bound to it (a host without a port matches any port).
    pub hosts: Vec<String>,
    /// Its public relay URL (its scheme is the one NIP-42 and NIP-98 expect).
    pub relay_url: String,
}

impl Default for DefaultCommunity {
    fn default() -> Self {
        Self {
            enabled: true,
            id: "default".into(),
            hosts: vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into()],
            relay_url: "ws://127.0.0.1:7777".into(),
        }
    }
}

/// Who may create channels and which kinds need membership.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelPolicy {
    /// `"authenticated"`: any author authenticated (NIP-42) on the connection;
    /// `"allowlist"`: only the `creators`, also authenticated.
    pub create: String,
    /// Hex pubkeys allowed to create channels when `create = "allowlist"`.
    pub creators: Vec<String>,
    /// Kinds that need membership when they carry an `h` tag; empty means
    /// every kind (join requests and channel creation never do).
    pub membership_kinds: Vec<u16>,
}

impl Default for ChannelPolicy {
    fn default() -> Self {
        Self {
            create: "authenticated".into(),
            creators: Vec::new(),
            membership_kinds: Vec::new(),
        }
    }
}

impl ChannelPolicy {
    /// Whether an `h`-tagged event of `kind` needs its author to be a member.
    pub fn requires_membership(&self, kind: u16) -> bool {
        use protocol::nip29::{CREATE_GROUP, JOIN_REQUEST};
        if kind == CREATE_GROUP || kind == JOIN_REQUEST {
            false
        } else {
            self.membership_kinds.is_empty() || self.membership_kinds.contains(&kind)
        }
    }

    /// Whether `pubkey` (hex) may create channels.
    pub fn may_create(&self, pubkey_hex: &str) -> bool {
        self.create == "authenticated" || self.creators.iter().any(|c| c.eq_ignore_ascii_case(pubkey_hex))
    }
}

/// Settings of one community.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommunitySettings {
    /// Overrides the top-level `[channels]` policy.
    pub channels: Option<ChannelPolicy>,
    /// Hosts (names or literal addresses, as written in step URLs) that
    /// this community's `call_webhook` steps may reach over plain `http`
    /// and at loopback, private, link-local or other non-public addresses.
    pub webhook_allow_hosts: Vec<String>,
    /// This community's admins (hex pubkeys), besides the relay-wide `admins`.
    pub admins: Vec<String>,
    /// Overrides the top-level `[access]` rules.
    pub access: Option<Access>,
    /// Its share of the workflow engine beside the other communities
    /// (1 to 100, default 1): each round of a pass advances up to
    /// `weight` x `workflows.concurrent_runs` of its due runs.
    pub weight: Option<u32>,
}

/// Who may read and write a community over WebSocket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Access {
    /// REQ and COUNT need NIP-42 authentication first (`CLOSED auth-required:`).
    pub auth_required_for_reads: bool,
    /// EVENT needs NIP-42 authentication first (`OK false auth-required:`).
    pub auth_required_for_writes: bool,
    /// Only authors on the community's allow list (NIP-86 `allowpubkey`)
    /// and its admins may publish (`OK false restricted:`).
    pub writers_allowlist: bool,
}
