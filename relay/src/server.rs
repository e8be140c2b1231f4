//! Process life cycle: open storage, ensure the default community, serve,
//! and shut down gracefully (stop accepting, let connections finish and
//! close, flush storage).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::clock::unix_now;
use crate::config::Config;
use crate::state::AppState;
use crate::store::{self, StoreError};

/// Creates the default community on first start (zero-config).
pub async fn ensure_default_community(cfg: &Config, store: &store::Store) -> anyhow::Result<()> {
    let d = &cfg.default_community;
    if !d.enabled {
        return Ok(());
    }
    if store.list_communities().await?.iter().any(|c| c.id == d.id) {
        return Ok(());
    }
    let mut record =
        crate::community::new_record(&d.id, &d.relay_url, &d.hosts).map_err(anyhow::Error::msg)?;
    if let Some(dir) = &cfg.keys_dir {
        crate::keys::move_out(&mut record, dir)?;
    }
    match store.add_community(&record).await {
        // Another process created it at the same moment: fine.
        Ok(()) | Err(StoreError::Conflict(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Every community's signing key loads: a community whose key file is
/// missing or wrong would answer nothing but errors, so the relay refuses
/// to start instead, naming it.
async fn check_keys(cfg: &Config, store: &store::Store) -> anyhow::Result<()> {
    for c in store.list_communities().await? {
        crate::keys::load(&c, cfg.keys_dir.as_deref())?;
    }
    Ok(())
}

/// Runs the relay until SIGTERM/SIGINT.
pub async fn serve(cfg: Config) -> anyhow::Result<()> {
    let (store, remote) = start_store(&cfg).await?;
    let listeners = bind_all(&cfg.listen).await?;
    let local: Vec<SocketAddr> = listeners.iter().filter_map(|l| l.local_addr().ok()).collect();

    let grace = cfg.shutdown_grace();
    let sweep_every = Duration::from_secs(cfg.expiry_sweep_interval_secs.max(1));
    let secrets = crate::secrets::SecretsKey::load_or_create(&cfg.secrets_key_path())?;
    let outcaller = crate::outcall::Outcaller::new(&cfg.webhooks)?;
    let metrics = match cfg.metrics_listen {
        Some(addr) => Some(start_metrics(addr).await?),
        None => None,
    };
    let spans = crate::spans::Spans::start(cfg.otlp_endpoint.as_deref(), "relay")?;
    let state = Arc::new(AppState {
        spans,
        ..AppState::new(cfg, store.clone(), secrets, outcaller)
    });

    if metrics.is_some() {
        refresh_gauges(&state).await;
    }
    // One machine-readable line on stdout: tests and scripts read the
    // first address from it (its fourth word).
    let first = local[0];
    let mut also: String = local[1..].iter().map(|a| format!(" also={a}")).collect();
    if let Some((addr, _)) = &metrics {
        also.push_str(&format!(" metrics={addr}"));
    }
    println!("relay listening on {first} backend={}{also}", store.backend());
    tracing::info!(?local, backend = store.backend(), "relay listening");

    spawn_signal_handler(state.clone());
    let mut background = vec![
        tokio::spawn(expiry_sweeper(state.clone(), sweep_every)).abort_handle(),
        tokio::spawn(maintenance(state.clone())).abort_handle(),
        tokio::spawn(statistics(state.clone())).abort_handle(),
        // Its own thread: it holds the write lock across the statements of
        // a step (see `dedicated`).
        crate::dedicated::spawn(
            "workflow-engine",
            crate::engine::run(state.clone()),
            store.closed(),
        )
        .context("starting the workflow engine")?,
    ];

    if let Some(remote) = remote {
        background.push(tokio::spawn(forward_remote(state.clone(), remote)).abort_handle());
    }
    if let Some((_, serving)) = metrics {
        background.push(serving);
        background.push(tokio::spawn(collect_gauges(state.clone())).abort_handle());
    }

    let l = &state.cfg.limits;
    let serving = crate::listen::Serving {
        app: crate::routes::router(state.clone()),
        cap: crate::listen::PeerCap::new(l.max_connections_per_ip, &l.connection_cap_exempt),
        header_read_timeout: Duration::from_millis(l.header_read_timeout_ms),
        shutdown: state.shutdown.clone(),
    };
    crate::listen::serve(listeners, serving).await;

    state.tracker.close();
    if tokio::time::timeout(grace, state.tracker.wait()).await.is_err() {
        tracing::warn!("connections still open after the shutdown grace period; closing anyway");
    }
    for task in background {
        task.abort();
    }
    store.close().await;
    tracing::info!("relay stopped");
    Ok(())
}

/// Installs the metrics recorder and serves `GET /metrics` (Prometheus
/// text format) on `addr`, apart from the public listeners. Returns the
/// bound address and the serving task.
async fn start_metrics(addr: SocketAddr) -> anyhow::Result<(SocketAddr, tokio::task::AbortHandle)> {
    let handle = crate::telemetry::install()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding metrics_listen {addr}"))?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move { handle.render() }
        }),
    );
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics listener stopped");
        }
    });
    Ok((bound, task.abort_handle()))
}

/// Refreshes the gauges read from the database, every
/// `metrics_interval_secs` (the first pass ran before the relay said it
/// listens).
async fn collect_gauges(state: Arc<AppState>) {
    let every = Duration::from_secs(state.cfg.metrics_interval_secs.max(1));
    loop {
        tokio::time::sleep(every).await;
        refresh_gauges(&state).await;
    }
}

/// Sets the gauges read from the database for every community: every
/// status a delivery or a run can have, at 0 when no row has it, so that
/// each series is there from the first scrape and a status whose rows are
/// gone reads 0.
async fn refresh_gauges(state: &AppState) {
    use crate::telemetry::{DELIVERIES, OLDEST_PENDING, RUNS};
    use protocol::api::{DeliveryStatus, RunStatus};
    let deliveries: Vec<&str> = DeliveryStatus::ALL.iter().map(|s| s.as_str()).collect();
    let runs: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
    let communities = state.store.list_communities().await.unwrap_or_default();
    for c in communities {
        let g = match state.store.gauges(&c.id).await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(community = %c.id, error = %e, "reading metrics gauges failed");
                continue;
            }
        };
        for (name, known, rows) in [(DELIVERIES, &deliveries, &g.deliveries), (RUNS, &runs, &g.runs)] {
            for status in known.iter() {
                let n = rows.iter().find(|(s, _)| s == status).map_or(0, |(_, n)| *n);
                gauge_of(name, &c.id, status).set(n as f64);
            }
        }
        metrics::gauge!(OLDEST_PENDING, "community" => c.id.clone()).set(g.oldest_pending_secs as f64);
    }
}

/// A gauge by community and status (`relay_runs` has no community
/// label in the first list of metrics, but several communities need one).
fn gauge_of(name: &'static str, community: &str, status: &str) -> metrics::Gauge {
    metrics::gauge!(name, "community" => community.to_string(), "status" => status.to_string())
}

/// Binds every listen address. Of the built-in ones, an address this
/// machine does not have (IPv6 loopback in a container without IPv6) is
/// skipped with a warning; any other failure, and any failure of an
/// address the operator configured, is an error naming the address.
async fn bind_all(listen: &crate::config::Listen) -> anyhow::Result<Vec<tokio::net::TcpListener>> {
    let mut out = Vec::with_capacity(listen.0.len());
    for addr in &listen.0 {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => out.push(l),
            Err(e)
                if listen.is_default()
                    && addr.is_ipv6()
                    && matches!(
                        e.raw_os_error(),
                        Some(libc_codes::EADDRNOTAVAIL | libc_codes::EAFNOSUPPORT)
                    ) =>
            {
                tracing::warn!(%addr, error = %e, "not listening on this address: the machine lacks it");
            }
            Err(e) => return Err(anyhow::Error::new(e).context(format!("binding {addr}"))),
        }
    }
    anyhow::ensure!(!out.is_empty(), "no listen address could be bound");
    Ok(out)
}

/// The two errno values `bind_all` tolerates (Linux values; the relay does
/// not depend on `libc` for two numbers).
mod libc_codes {
    pub const EAFNOSUPPORT: i32 = 97;
    pub const EADDRNOTAVAIL: i32 = 99;
}

fn spawn_signal_handler(state: Arc<AppState>) {
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
        else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        state.shutdown.cancel();
    });
}

async fn expiry_sweeper(state: Arc<AppState>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        match state.store.purge_expired(unix_now()).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(purged = n, "expired events purged"),
            Err(e) => tracing::warn!(error = %e, "expiry sweep failed"),
        }
    }
}

async fn maintenance(state: Arc<AppState>) {
    let every = Duration::from_secs(state.cfg.postgres.maintenance_interval_secs.max(60));
    let mut tick = tokio::time::interval(every);
    tick.tick().await; // the store did it on open
    loop {
        tick.tick().await;
        if let Err(e) = state.store.maintain(unix_now()).await {
            tracing::warn!(error = %e, "storage maintenance failed");
        }
    }
}

/// How often the store looks for tables whose statistics are stale.
const STATISTICS_EVERY: Duration = Duration::from_secs(5);

/// Keeps the database's statistics of young tables current
/// (`SqlStore::refresh_statistics`); nothing on SQLite.
async fn statistics(state: Arc<AppState>) {
    if state.store.backend() != "postgres" {
        return;
    }
    let mut tick = tokio::time::interval(STATISTICS_EVERY);
    loop {
        tick.tick().await;
        match state.store.refresh_statistics().await {
            Ok(t) if t.is_empty() => {}
            Ok(tables) => tracing::debug!(?tables, "statistics gathered"),
            Err(e) => tracing::warn!(error = %e, "gathering statistics failed"),
        }
    }
}

/// Feeds events accepted by other relay processes into the local hub.
async fn forward_remote(state: Arc<AppState>, mut remote: tokio::sync::mpsc::Receiver<store::RemoteEvent>) {
    while let Some(r) = remote.recv().await {
        match nostr::prelude::Event::from_json(&r.raw) {
            Ok(event) => state.publish(&r.community, Arc::new(event), Arc::from(r.raw)),
            Err(e) => tracing::warn!(error = %e, "undecodable event from another relay process"),
        }
    }
}

/// Opens the store, makes sure of the default community, checks every
/// community's key and starts
/// listening to other relay processes, waiting up to
/// `startup_db_wait_secs` for a database that is not reachable yet or drops
/// the connection meanwhile (a relay may start before its database does).
async fn start_store(
    cfg: &Config,
) -> anyhow::Result<(
    std::sync::Arc<store::Store>,
    Option<tokio::sync::mpsc::Receiver<store::RemoteEvent>>,
)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(cfg.startup_db_wait_secs);
    let mut delay = Duration::from_millis(100);
    loop {
        let attempt = async {
            let store = store::open(cfg, store::OpenMode::Create).await?;
            ensure_default_community(cfg, store.as_ref()).await?;
            // Inside the retried start: a database restarting under this
            // read used to stop the relay (seen in the chaos campaign).
            check_keys(cfg, store.as_ref()).await?;
            let remote = store.subscribe_remote(cfg.limits.fanout_buffer_events).await?;
            Ok::<_, anyhow::Error>((store, remote))
        };
        match attempt.await {
            Ok(r) => return Ok(r),
            Err(e) if tokio::time::Instant::now() < deadline && transient(&e) => {
                tracing::warn!(error = %e, "database not reachable yet; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(e.context("opening the database")),
        }
    }
}

fn transient(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<StoreError>(),
        Some(StoreError::Db(_) | StoreError::Unreachable(_) | StoreError::Migrate(_))
    )
}
