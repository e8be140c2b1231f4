//! A relay's Prometheus metrics, as a scraper reads them.

use crate::Relay;

/// The text of `/metrics` (the relay runs with `metrics_listen`).
pub async fn text(relay: &Relay) -> String {
    let addr = relay.metrics_addr.expect("metrics_listen is set");
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics body")
}

/// Scrapes `/metrics` and parses it with a Prometheus text parser.
pub async fn scrape(relay: &Relay) -> prometheus_parse::Scrape {
    let body = text(relay).await;
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text")
}

/// The value of `name` whose labels include `labels` (a histogram: its
/// count); 0 when there is none.
pub fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    use prometheus_parse::Value as V;
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            V::Counter(x) | V::Gauge(x) | V::Untyped(x) => *x,
            V::Histogram(buckets) => buckets.iter().map(|b| b.count).fold(0.0, f64::max),
            V::Summary(_) => 0.0,
        })
        .sum()
}
