//! Sending a `call_webhook` step's request: reqwest (rustls) with the
//! address guard, the signature, a timeout and a bounded answer.
//!
//! The guard (docs/workflows.md, "Security rules for webhooks"): a host not in the community's
//! `webhook_allow_hosts` must be `https` and may only be reached at public
//! addresses. Names are resolved first (pinned names from
//! `webhooks.resolve`, else the system resolver) and refused when any
//! address is loopback, private, link-local, multicast, unspecified or
//! otherwise not public, IPv4 forms inside IPv6 (mapped, compatible, NAT64,
//! 6to4) included; the connection then uses exactly the addresses checked,
//! so a second lookup cannot answer differently. Redirects are followed
//! only within the same origin (scheme, host, port), whose every connection
//! goes through the same resolver; a redirect elsewhere ends the call with
//! its 3xx, so a run's data never goes where the definition did not send it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use serde_json::Value;

use crate::config::WebhookConfig;
use crate::secrets::SecretsKey;
use crate::workflow::outcalls::{CallResult, OutCall};

/// Why an address may not be reached, by class.
pub fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match () {
        _ if ip.is_unspecified() || a == 0 => "unspecified",
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_private() => "private",
        _ if ip.is_link_local() => "link-local",
        _ if ip.is_multicast() => "multicast",
        _ if ip.is_broadcast() => "broadcast",
        // Shared address space (carrier NAT), IETF protocol assignments,
        // documentation, benchmarking and the reserved 240/4.
        _ if a == 100 && (64..128).contains(&b) => "private",
        _ if a == 192 && b == 0 && c == 0 => "reserved",
        _ if ip.is_documentation() => "reserved",
        _ if a == 198 && (b == 18 || b == 19) => "reserved",
        _ if a >= 240 => "reserved",
        _ => return None,
    })
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let seg = ip.segments();
    if let Some(v4) = embedded_v4(ip) {
        return forbidden_v4(v4);
    }
    Some(match () {
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_multicast() => "multicast",
        _ if seg[0] & 0xffc0 == 0xfe80 => "link-local",
        // Unique local (fc00::/7) and the old site-local (fec0::/10).
        _ if seg[0] & 0xfe00 == 0xfc00 || seg[0] & 0xffc0 == 0xfec0 => "private",
        // Documentation (2001:db8::/32) and discard (100::/64).
        _ if (seg[0] == 0x2001 && seg[1] == 0xdb8) || (seg[0] == 0x100 && seg[1..4] == [0, 0, 0]) => {
            "reserved"
        }
        _ => return None,
    })
}

/// The IPv4 address an IPv6 address carries: mapped (`::ffff:a.b.c.d`),
/// compatible (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) or 6to4
/// (`2002:aabb:ccdd::`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let seg = ip.segments();
    let low = Ipv4Addr::new(
        (seg[6] >> 8) as u8,
        seg[6] as u8,
        (seg[7] >> 8) as u8,
        seg[7] as u8,
    );
    match seg {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(low),
        [0, 0, 0, 0, 0, 0, hi, _] if hi != 0 => Some(low),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
    }
}

/// A refused destination (typed, so the engine can tell it from a network
/// failure in reqwest's error chain).
#[derive(Debug, thiserror::Error)]
#[error("refused to connect to {host} ({addr} is {class}); add the host to webhook_allow_hosts to allow it")]
pub struct Refused {
    host: String,
    addr: IpAddr,
    class: &'static str,
}

/// Resolves names for one call under the guard.
struct Guard {
    pins: std::collections::BTreeMap<String, Vec<IpAddr>>,
    allowed: bool,
}

impl Resolve for Guard {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let pinned = self.pins.get(&host).cloned();
        let allowed = self.allowed;
        Box::pin(async move {
            let addrs: Vec<IpAddr> = match pinned {
                Some(p) => p,
                None => tokio::net::lookup_host((host.as_str(), 0))
                    .await?
                    .map(|a| a.ip())
                    .collect(),
            };
            if !allowed {
                if let Some((addr, class)) = addrs.iter().find_map(|a| forbidden(*a).map(|c| (*a, c))) {
                    return Err(
                        Box::new(Refused { host, addr, class }) as Box<dyn std::error::Error + Send + Sync>
                    );
                }
            }
            let out: Addrs = Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(out)
        })
    }
}

/// What sends the engine's webhook calls.
pub struct Outcaller {
    cfg: WebhookConfig,
    roots: Vec<reqwest::Certificate>,
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Each community's and each owner's share of `in_flight`.
    shares: Arc<crate::shares::Shares>,
}

impl Outcaller {
    /// Reads the extra root certificates, if any.
    pub fn new(cfg: &WebhookConfig) -> anyhow::Result<Outcaller> {
        let roots = match &cfg.ca_file {
            Some(path) => {
                let pem = std::fs::read(path)
                    .map_err(|e| anyhow::anyhow!("webhooks.ca_file {}: {e}", path.display()))?;
                reqwest::Certificate::from_pem_bundle(&pem)
                    .map_err(|e| anyhow::anyhow!("webhooks.ca_file {}: {e}", path.display()))?
            }
            None => Vec::new(),
        };
        Ok(Outcaller {
            cfg: cfg.clone(),
            roots,
            in_flight: Arc::new(tokio::sync::Semaphore::new(cfg.max_in_flight.max(1))),
            shares: crate::shares::Shares::new(),
        })
    }

    /// Sends one call for `community` (whose allow-list is `allow`) and
    /// says what came of it. Never panics on what the server does. It
    /// waits for a slot within its community's and its owner's share
    /// first, then for one of the process's: one owner's hanging calls
    /// hold at most its own share.
    pub async fn send(
        &self,
        community: &str,
        allow: &[String],
        key: &SecretsKey,
        call: &OutCall,
    ) -> CallResult {
        let share = [
            (community.to_string(), self.cfg.max_in_flight_per_community),
            (
                format!("{community}/{}", call.owner),
                self.cfg.max_in_flight_per_owner,
            ),
        ];
        let _share = self.shares.enter(&share).await;
        let Ok(_slot) = self.in_flight.clone().acquire_owned().await else {
            return failed("webhook_unreachable", "the relay is shutting down");
        };
        match self.try_send(community, allow, key, call).await {
            Ok(result) | Err(result) => result,
        }
    }

    async fn try_send(
        &self,
        community: &str,
        allow: &[String],
        key: &SecretsKey,
        call: &OutCall,
    ) -> Result<CallResult, CallResult> {
        let url =
            reqwest::Url::parse(&call.url).map_err(|e| failed("webhook_refused", format!("bad URL: {e}")))?;
        let host = url
            .host_str()
            .unwrap_or_default()
            .trim_matches(['[', ']'])
            .to_ascii_lowercase();
        let allowed = allow
            .iter()
            .any(|h| h.trim_matches(['[', ']']).eq_ignore_ascii_case(&host));
        if !allowed && url.scheme() != "https" {
            let why = format!("{host} is not in webhook_allow_hosts, so the URL must be https");
            return Err(failed("webhook_refused", why));
        }
        if let (false, Ok(ip)) = (allowed, host.parse::<IpAddr>()) {
            if let Some(class) = forbidden(ip) {
                return Err(failed(
                    "webhook_refused",
                    Refused {
                        host: host.clone(),
                        addr: ip,
                        class,
                    }
                    .to_string(),
                ));
            }
        }
        let client = self.client(&url, allowed)?;
        let mut req = client
            .request(
                reqwest::Method::from_bytes(call.method.as_str().as_bytes()).unwrap_or(reqwest::Method::POST),
                url,
            )
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", &call.idempotency_key)
            .timeout(call.timeout())
            .body(call.body.clone());
        if let Some(traceparent) = &call.traceparent {
            req = req.header("traceparent", traceparent);
        }
        if let Some(secret) = &call.secret {
            let value = key
                .open(&secret.sealed, community, &call.workflow_id, &secret.name)
                .map_err(|e| failed("secret_unreadable", e.to_string()))?;
            req = req.header(
                protocol::webhook::SIGNATURE_HEADER,
                protocol::webhook::signature(&value, call.body.as_bytes()),
            );
        }
        let resp = req.send().await.map_err(|e| network_failure(&e))?;
        let status = resp.status().as_u16();
        let body = read_bounded(resp).await?;
        Ok(CallResult::Answered { status, body })
    }

    fn client(&self, url: &reqwest::Url, allowed: bool) -> Result<reqwest::Client, CallResult> {
        let origin = url.origin();
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > 5 || attempt.url().origin() != origin {
                attempt.stop()
            } else {
                attempt.follow()
            }
        });
        let mut b = reqwest::Client::builder()
            .dns_resolver(Arc::new(Guard {
                pins: self
                    .cfg
                    .resolve
                    .iter()
                    .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
                    .collect(),
                allowed,
            }))
            .redirect(policy)
            .no_proxy()
            .connect_timeout(Duration::from_millis(self.cfg.connect_timeout_ms))
            .user_agent(concat!("nostr-relay-workflows/", env!("CARGO_PKG_VERSION")));
        for root in &self.roots {
            b = b.add_root_certificate(root.clone());
        }
        b.build()
            .map_err(|e| failed("webhook_unreachable", e.to_string()))
    }
}

impl OutCall {
    /// The whole call's time limit.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }
}

fn failed(code: &str, message: impl Into<String>) -> CallResult {
    CallResult::Failed {
        code: code.to_string(),
        message: message.into(),
    }
}

/// A reqwest failure as the run's error: a refusal of the guard, a
/// timeout, or the network.
fn network_failure(e: &reqwest::Error) -> CallResult {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<Refused>() {
            return failed("webhook_refused", r.to_string());
        }
        source = s.source();
    }
    if e.is_timeout() {
        return failed("webhook_timeout", "no answer within the step's timeout_secs");
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    failed("webhook_unreachable", text)
}

/// The answer's body, at most [`protocol::webhook::MAX_BODY_BYTES`]: JSON
/// when it parses, else its text.
async fn read_bounded(mut resp: reqwest::Response) -> Result<Value, CallResult> {
    let max = protocol::webhook::MAX_BODY_BYTES;
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(failed(
            "answer_too_large",
            format!("the answer is over {max} bytes"),
        ));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| network_failure(&e))? {
        if body.len() + chunk.len() > max {
            return Err(failed(
                "answer_too_large",
                format!("the answer is over {max} bytes"),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_non_public_class_is_refused() {
        for (ip, class) in [
            ("0.0.0.0", "unspecified"),
            ("127.0.0.1", "loopback"),
            ("127.8.9.10", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "private"),
            ("169.254.169.254", "link-local"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("240.0.0.1", "reserved"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("fc00::1", "private"),
            ("fd12:3456::1", "private"),
            ("ff02::1", "multicast"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::127.0.0.1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("2002:7f00:1::", "loopback"),
            ("2002:c0a8:101::1", "private"),
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(forbidden(ip), Some(class), "{ip}");
        }
        for ip in [
            "1.1.1.1",
            "93.184.216.34",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(forbidden(ip), None, "{ip}");
        }
    }
}
