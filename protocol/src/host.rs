//! Host names as the relay uses them to pick a community (docs/protocol.md, "Communities").

/// Normalises a `Host` header value: lower-cased, trailing dot removed,
/// default ports (80 and 443) removed. Returns `None` for an empty or
/// malformed value, which the relay treats as an unknown host (fail closed).
pub fn normalize(raw: &str) -> Option<String> {
    let raw = raw.trim();
    if raw.is_empty() || raw.len() > 255 {
        return None;
    }
    let lower = raw.to_ascii_lowercase();
    let (name, port) = split_port(&lower)?;
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || !name.chars().all(valid_host_char) {
        return None;
    }
    match port {
        None | Some("80") | Some("443") => Some(name.to_string()),
        Some(p) => Some(format!("{name}:{p}")),
    }
}

/// The host part of a normalised host (`name` for `name:port`).
pub fn without_port(normalized: &str) -> &str {
    match split_port(normalized) {
        Some((name, _)) => name,
        None => normalized,
    }
}

fn split_port(s: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = s.strip_prefix('[') {
        // IPv6 literal: "[::1]" or "[::1]:8080".
        let end = rest.find(']')?;
        let name = &s[..end + 2];
        let after = &rest[end + 1..];
        return match after.strip_prefix(':') {
            None if after.is_empty() => Some((name, None)),
            Some(p) if valid_port(p) => Some((name, Some(p))),
            _ => None,
        };
    }
    match s.rsplit_once(':') {
        None => Some((s, None)),
        Some((name, p)) if valid_port(p) => Some((name, Some(p))),
        Some(_) => None,
    }
}

fn valid_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok()
}

fn valid_host_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '[' | ']' | ':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises() {
        assert_eq!(normalize("Example.COM").as_deref(), Some("example.com"));
        assert_eq!(normalize("example.com.").as_deref(), Some("example.com"));
        assert_eq!(normalize("example.com:443").as_deref(), Some("example.com"));
        assert_eq!(normalize("example.com:80").as_deref(), Some("example.com"));
        assert_eq!(normalize("example.com:8080").as_deref(), Some("example.com:8080"));
        assert_eq!(normalize("127.0.0.1:7777").as_deref(), Some("127.0.0.1:7777"));
        assert_eq!(normalize("[::1]:7777").as_deref(), Some("[::1]:7777"));
        assert_eq!(normalize("[::1]").as_deref(), Some("[::1]"));
        assert_eq!(normalize(""), None);
        assert_eq!(normalize("a b"), None);
        assert_eq!(normalize("host:notaport"), None);
        assert_eq!(normalize("host:99999"), None);
        assert_eq!(normalize("."), None);
    }

    #[test]
    fn strips_port() {
        assert_eq!(without_port("a.b:8080"), "a.b");
        assert_eq!(without_port("a.b"), "a.b");
        assert_eq!(without_port("[::1]:80"), "[::1]");
    }
}
