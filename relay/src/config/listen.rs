//! Listen addresses: one or several `host:port`, parsed from TOML, the
//! environment and flags alike.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// The listen addresses: at least one, each `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen(pub Vec<SocketAddr>);

impl Default for Listen {
    /// Loopback on IPv4 and IPv6 (`localhost` resolves to either).
    fn default() -> Self {
        Self(vec![
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 7777)),
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 7777)),
        ])
    }
}

impl Listen {
    /// Whether these are the built-in addresses (an address of them that
    /// this machine lacks, such as IPv6 loopback, is skipped with a warning;
    /// a configured one that cannot be bound is an error).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Parses one listen address, saying what is expected when it is not
/// `host:port` (clap's "invalid socket address syntax" named neither).
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    s.parse::<SocketAddr>().map_err(|_| {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            format!("listen address {s:?} has no host: use host:port, e.g. 127.0.0.1:{s}, 0.0.0.0:{s} or [::]:{s}")
        } else {
            format!("listen address {s:?} is not host:port (a numeric address and a port, IPv6 in brackets: [::1]:7777)")
        }
    })
}

/// Comma-separated `host:port` addresses (the form of a flag or an
/// environment variable).
pub fn parse_listen_list(s: &str) -> Result<Vec<SocketAddr>, String> {
    s.split(',')
        .filter(|a| !a.trim().is_empty())
        .map(parse_listen)
        .collect()
}

impl Serialize for Listen {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let all: Vec<String> = self.0.iter().map(SocketAddr::to_string).collect();
        all.serialize(ser)
    }
}

impl<'de> Deserialize<'de> for Listen {
    /// `"127.0.0.1:7777"`, `"127.0.0.1:7777,[::1]:7777"` or a list of them.
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            One(String),
            Many(Vec<String>),
        }
        let texts = match Form::deserialize(de)? {
            Form::One(s) => vec![s],
            Form::Many(v) => v,
        };
        let mut out = Vec::new();
        for t in &texts {
            out.extend(parse_listen_list(t).map_err(serde::de::Error::custom)?);
        }
        if out.is_empty() {
            return Err(serde::de::Error::custom(
                "listen needs at least one host:port address",
            ));
        }
        Ok(Listen(out))
    }
}
