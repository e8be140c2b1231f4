//! A PostgreSQL URL naming several hosts, in libpq's form
//! (`postgres://user@h1:5432,h2:5432/relay?target_session_attrs=read-write`):
//! sqlx reads one host, so the URL is cut here into one URL per host, in
//! order, and `target_session_attrs` says which host the relay uses: the
//! first that accepts a connection (`any`, the default), or the first
//! that accepts writes (`read-write`, or `primary`: checked after connect
//! with `SHOW transaction_read_only`, as libpq does). Pure: no I/O.

/// Most hosts one URL may name.
pub const MAX_HOSTS: usize = 16;

/// A database URL cut into one URL per host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hosts {
    /// One URL per host, in the order given, without `target_session_attrs`.
    pub urls: Vec<String>,
    /// Whether only a host that accepts writes will do.
    pub writable_only: bool,
}

/// The parts of a URL around its host list.
struct Parts<'a> {
    /// `postgres://` or `postgresql://`.
    scheme: &'a str,
    /// `user:password@`, or empty.
    userinfo: &'a str,
    hosts: &'a str,
    /// The path (the database), without the query.
    path: &'a str,
    query: Option<&'a str>,
}

fn parts(url: &str) -> Result<Parts<'_>, String> {
    let at = url.find("://").ok_or("the database URL has no scheme")? + 3;
    let (scheme, rest) = url.split_at(at);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => authority.split_at(i + 1),
        None => ("", authority),
    };
    let (path, query) = match tail.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (tail, None),
    };
    Ok(Parts {
        scheme,
        userinfo,
        hosts,
        path,
        query,
    })
}

/// Cuts `url` into one URL per host. Refused: no host, more than
/// [`MAX_HOSTS`], an empty host, a `target_session_attrs` other than
/// `any`, `read-write` and `primary`.
pub fn parse(url: &str) -> Result<Hosts, String> {
    let p = parts(url)?;
    let mut writable_only = false;
    let mut kept = Vec::new();
    for pair in p.query.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        match pair.split_once('=') {
            Some(("target_session_attrs", "any")) => writable_only = false,
            Some(("target_session_attrs", "read-write" | "primary")) => writable_only = true,
            Some(("target_session_attrs", other)) => {
                return Err(format!(
                    "target_session_attrs={other} is not supported (any, read-write, primary)"
                ))
            }
            _ => kept.push(pair),
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    let hosts: Vec<&str> = p.hosts.split(',').collect();
    if hosts.len() > MAX_HOSTS {
        return Err(format!(
            "the database URL names {} hosts; at most {MAX_HOSTS}",
            hosts.len()
        ));
    }
    if hosts.iter().any(|h| h.is_empty()) {
        return Err("the database URL names an empty host".into());
    }
    let urls = hosts
        .iter()
        .map(|h| format!("{}{}{h}{}{query}", p.scheme, p.userinfo, p.path))
        .collect();
    Ok(Hosts { urls, writable_only })
}

/// `url` with its password, if any, shown as `***`: to name a database
/// in messages (one host or several).
pub fn redacted(url: &str) -> String {
    let Ok(p) = parts(url) else {
        return url.to_string();
    };
    let Some((user, _)) = p.userinfo.trim_end_matches('@').split_once(':') else {
        return url.to_string();
    };
    let query = p.query.map(|q| format!("?{q}")).unwrap_or_default();
    format!("{}{user}:***@{}{}{query}", p.scheme, p.hosts, p.path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_url_per_host_in_order() {
        let h = parse(
            "postgres://relay:pw@db1:5432,db2:5433/relay?sslmode=disable&target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(
            h.urls,
            [
                "postgres://relay:pw@db1:5432/relay?sslmode=disable",
                "postgres://relay:pw@db2:5433/relay?sslmode=disable"
            ]
        );
        assert!(h.writable_only);
        let one = parse("postgresql://localhost/relay").unwrap();
        assert_eq!(one.urls, ["postgresql://localhost/relay"]);
        assert!(!one.writable_only);
        let v6 = parse("postgres://[::1]:5432,[::2]/r?target_session_attrs=primary").unwrap();
        assert_eq!(v6.urls, ["postgres://[::1]:5432/r", "postgres://[::2]/r"]);
        assert!(v6.writable_only);
        let any = parse("postgres://a,b/r?target_session_attrs=any").unwrap();
        assert_eq!(any.urls, ["postgres://a/r", "postgres://b/r"]);
        assert!(!any.writable_only);
    }

    #[test]
    fn what_is_refused() {
        assert!(parse("postgres://a,,b/r").unwrap_err().contains("empty host"));
        assert!(parse("postgres://a/r?target_session_attrs=standby")
            .unwrap_err()
            .contains("not supported"));
        let many = vec!["h"; MAX_HOSTS + 1].join(",");
        assert!(parse(&format!("postgres://{many}/r"))
            .unwrap_err()
            .contains("at most"));
        assert!(parse("db1:5432/relay").is_err());
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            redacted("postgres://relay:secret@db1:5432,db2/relay?x=1"),
            "postgres://relay:***@db1:5432,db2/relay?x=1"
        );
        assert_eq!(
            redacted("postgres://relay@db1/relay"),
            "postgres://relay@db1/relay"
        );
        assert_eq!(redacted("postgres://db1/relay"), "postgres://db1/relay");
    }
}
