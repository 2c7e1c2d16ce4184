//! Leader election on PostgreSQL: one lease row with a fencing epoch.
//!
//! Several `pelotond`s share one database (`store: postgres://…`). The
//! lease row (`peloton_leader`, created by the store's migrations) names
//! the holder, the address its clients use, and when the lease expires on
//! the database's clock. A server takes the lease when it has expired,
//! adding one to the epoch; the leader renews it every third of its
//! length. Until a server leads it is a standby: it answers every call
//! with UNAVAILABLE naming the leader (see [`Gate`]).
//!
//! Safety rests on the epoch, not on clocks: every commit of the leader
//! checks the epoch under a share lock of the lease row in the commit's
//! own transaction (`pgstore.rs`), so a server deposed while it slept
//! (SIGSTOP, a long pause, a partition) cannot write once another took the
//! lease, and the new leader reads the state only after any commit in
//! flight has ended. A deposed leader stops its process ([`deposed`]):
//! its memory is stale, and a supervisor starts it again as a standby.
//!
//! Liveness: a leader that cannot renew for a whole lease *lapses*: it
//! answers calls with UNAVAILABLE and ends agents' sessions so they look
//! for the new leader, and leads again if it renews before anyone took the
//! lease (same epoch: nobody else has written). A standby takes over
//! within one lease plus one poll of the leader's death or partition.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::IntoResponse;
use tower::ServiceExt;

use crate::pgstore;

/// Exit status of a server that found another leader had taken over.
pub const EXIT_DEPOSED: i32 = 75;

/// Response metadata (and HTTP header) naming the leader's URL.
pub const LEADER_HEADER: &str = "peloton-leader";

/// Where this server stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Starting up (recovering the state) before it serves.
    Starting,
    /// Waiting for the lease; `leader` is the current holder's address.
    Standby {
        /// The leader's URL, if a live one is known.
        leader: Option<String>,
    },
    /// Leading: calls are served.
    Leading,
    /// Leading, but the lease could not be renewed for a whole lease:
    /// calls are refused until it is renewed (or the server is deposed).
    Lapsed,
    /// Stopping (a graceful stop): its last batch is committed and its
    /// lease given up; calls are refused and agents' sessions end, naming
    /// no leader, so that clients and agents go on to the next server at
    /// once rather than wait for the process to exit.
    Stopping,
}

/// This server's standing, shared by the gate, the lease keeper and the
/// agents' sessions.
#[derive(Debug)]
pub struct Role {
    standing: Mutex<Standing>,
    leading: tokio::sync::watch::Sender<bool>,
}

impl Role {
    /// A role starting up.
    pub fn new() -> Arc<Role> {
        Arc::new(Role {
            standing: Mutex::new(Standing::Starting),
            leading: tokio::sync::watch::Sender::new(false),
        })
    }

    /// The standing now.
    pub fn standing(&self) -> Standing {
        self.standing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Changes the standing (the flag follows under the same lock, so
    /// the two never disagree).
    pub fn set(&self, standing: Standing) {
        let mut current = self.standing.lock().unwrap_or_else(|e| e.into_inner());
        self.apply(&mut current, standing);
    }

    /// Changes the standing to `to` only if it is `from` now: true if it
    /// did (the lease's keeper and watchdog race each other).
    pub fn transition(&self, from: &Standing, to: Standing) -> bool {
        let mut current = self.standing.lock().unwrap_or_else(|e| e.into_inner());
        if *current != *from {
            return false;
        }
        self.apply(&mut current, to);
        true
    }

    fn apply(&self, current: &mut Standing, to: Standing) {
        let leading = to == Standing::Leading;
        *current = to;
        self.leading.send_if_modified(|l| {
            let changed = *l != leading;
            *l = leading;
            changed
        });
    }

    /// Whether calls are served.
    pub fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }

    /// Follows whether calls are served (agents' sessions end when it
    /// turns false).
    pub fn watch_leading(&self) -> tokio::sync::watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Why a call is refused now (`None`: it is served), and the leader's
    /// address to name.
    pub fn refusal(&self) -> Option<(String, Option<String>)> {
        match self.standing() {
            Standing::Leading => None,
            Standing::Starting => Some((
                "starting: the server is recovering its state; try again shortly".into(),
                None,
            )),
            Standing::Standby { leader: Some(l) } => {
                Some((format!("not the leader: the leader is at {l}"), Some(l)))
            }
            Standing::Standby { leader: None } => {
                Some(("not the leader: no leader is known yet".into(), None))
            }
            Standing::Lapsed => Some((
                "not the leader: this server's lease lapsed (it cannot reach the database)".into(),
                None,
            )),
            Standing::Stopping => Some(("not the leader: this server is stopping".into(), None)),
        }
    }
}

/// Whether a request is a gRPC call (else an HTTP one, of the mirror).
pub fn is_grpc(request: &axum::extract::Request) -> bool {
    request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// Stops the process: another server holds the lease now.
pub fn deposed(why: &str) -> ! {
    tracing::error!(
        reason = why,
        "deposed: another server leads now; stopping (start again to stand by)"
    );
    eprintln!("pelotond: deposed: {why}");
    std::process::exit(EXIT_DEPOSED)
}

/// The router every connection reaches: the service's routes once this
/// server leads, a refusal naming the leader before (and while lapsed).
#[derive(Clone, Debug)]
pub struct Gate {
    role: Arc<Role>,
    routes: Arc<OnceLock<axum::Router>>,
}

impl Gate {
    /// A closed gate.
    pub fn new(role: Arc<Role>) -> Gate {
        Gate {
            role,
            routes: Arc::new(OnceLock::new()),
        }
    }

    /// Serves `routes` from now on (while leading).
    pub fn open(&self, routes: axum::Router) {
        let _ = self.routes.set(routes);
    }

    /// The router to serve.
    pub fn router(&self) -> axum::Router {
        let gate = self.clone();
        axum::Router::new().fallback(move |request: axum::extract::Request| {
            let gate = gate.clone();
            async move { gate.handle(request).await }
        })
    }

    async fn handle(&self, request: axum::extract::Request) -> axum::response::Response {
        // The common case reads one flag; the standing (under a lock) is
        // looked at only to refuse.
        if self.role.is_leading()
            && let Some(routes) = self.routes.get()
        {
            return match routes.clone().oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
        }
        let (message, leader) = self
            .role
            .refusal()
            .unwrap_or_else(|| ("starting: try again shortly".into(), None));
        if is_grpc(&request) {
            let mut status = tonic::Status::unavailable(message);
            if let Some(l) = &leader
                && let Ok(v) = l.parse()
            {
                status.metadata_mut().insert(LEADER_HEADER, v);
            }
            return status.into_http::<Body>();
        }
        // The HTTP mirror: its error shape, and a redirect to the leader
        // when it is known.
        let code = if leader.is_some() {
            axum::http::StatusCode::TEMPORARY_REDIRECT
        } else {
            axum::http::StatusCode::SERVICE_UNAVAILABLE
        };
        let body = serde_json::json!({
            "error": {"code": code.as_u16(), "status": "UNAVAILABLE", "message": message}
        });
        let mut response = (
            code,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            format!("{body}\n"),
        )
            .into_response();
        if let Some(l) = leader {
            let target = format!(
                "{}{}",
                l.trim_end_matches('/'),
                request.uri().path_and_query().map_or("/", |p| p.as_str())
            );
            let headers = response.headers_mut();
            if let Ok(v) = target.parse() {
                headers.insert(axum::http::header::LOCATION, v);
            }
            if let Ok(v) = l.parse() {
                headers.insert(LEADER_HEADER, v);
            }
        }
        response
    }
}

/// How to hold the lease.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// The database.
    pub url: String,
    /// This server's URL for clients (named by standbys).
    pub address: String,
    /// The lease's length.
    pub lease: Duration,
    /// This server's lasting identity (kept in its data dir): a server
    /// started again after a crash takes the lease its previous process
    /// held at once instead of waiting for it to expire. Safe either way:
    /// were that process still alive, its next write would be fenced.
    pub server_id: String,
}

/// The lease this server holds.
#[derive(Debug)]
pub struct Lease {
    config: LeaseConfig,
    /// Unique per process.
    holder: String,
    /// The epoch it leads under.
    pub epoch: i64,
    /// When the attempt that took it began.
    acquired_at: Instant,
    stop: Arc<AtomicBool>,
    keeper: Option<std::thread::JoinHandle<()>>,
}

/// `SERVER_ID/HOST/PID/RANDOM`: unique per process, and starting with the
/// server's lasting identity (see [`LeaseConfig::server_id`]).
fn holder_id(server_id: &str) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    format!(
        "{server_id}/{host}/{}/{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    )
}

fn lease_ms(lease: Duration) -> f64 {
    lease.as_millis() as f64
}

/// Whether `holder` is an earlier process of this server (same identity,
/// same host) that is no longer alive: its lease can be taken at once.
fn dead_predecessor(holder: &str, server_id: &str) -> bool {
    let mut parts = holder.split('/');
    let (Some(id), Some(host), Some(pid)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let our_host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    let Ok(pid) = pid.parse::<i32>() else {
        return false;
    };
    !server_id.is_empty()
        && id == server_id
        && host == our_host
        && pid != std::process::id() as i32
        && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH)
}

/// Takes the lease if it has expired (or its holder was this server's
/// previous process, now dead): the new epoch, or `Err` with the live
/// holder's address (`""`: none).
///
/// One transaction: the lease row (`peloton_lease`: epoch, expiry) is
/// updated first, then the fenced row (`peloton_leader`), which waits for
/// any commit of the old leader in flight (its share lock). The lease is
/// this server's now, so such a commit's session is ended first
/// ([`end_fenced_commits`]): a leader frozen between statements would be
/// ended by the database (`idle_in_transaction_session_timeout`, set by
/// the store), but one frozen inside a statement that waits for its client
/// (a `COPY` of task rows) never is. The wait is bounded by
/// `lock_timeout`, and the standby tries again meanwhile.
fn try_acquire(
    client: &mut postgres::Client,
    holder: &str,
    config: &LeaseConfig,
) -> Result<Result<i64, String>, postgres::Error> {
    let mut tx = client.transaction()?;
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = {}",
        config.lease.as_millis().max(1)
    ))?;
    let current = tx.query_one(
        "SELECT l.holder, l.address, x.expires_at >= now() \
         FROM peloton_leader l, peloton_lease x WHERE l.id = 1 AND x.id = 1",
        &[],
    )?;
    let (previous, address, live): (String, String, bool) =
        (current.get(0), current.get(1), current.get(2));
    let own_dead: Option<String> =
        (live && dead_predecessor(&previous, &config.server_id)).then(|| previous.clone());
    let taken = tx.query_opt(
        "UPDATE peloton_lease \
         SET epoch = epoch + 1, expires_at = now() + $1 * interval '1 millisecond' \
         WHERE id = 1 AND (expires_at < now() \
             OR (SELECT holder FROM peloton_leader WHERE id = 1) = $2) \
         RETURNING epoch",
        &[&lease_ms(config.lease), &own_dead],
    )?;
    let Some(row) = taken else {
        drop(tx);
        return Ok(Err(if live { address } else { String::new() }));
    };
    let epoch: i64 = row.get(0);
    end_fenced_commits(&mut tx);
    tx.execute(
        "UPDATE peloton_leader SET epoch = $1, holder = $2, address = $3 WHERE id = 1",
        &[&epoch, &holder, &config.address],
    )?;
    tx.commit()?;
    if own_dead.is_some() {
        tracing::info!(
            previous,
            "took over the lease of this server's previous process"
        );
    }
    Ok(Ok(epoch))
}

/// Ends the sessions that hold the fence's share lock on `peloton_leader`
/// in this database: commits in flight of the leader whose lease this
/// server just took (expired, or held by its own dead process; only a
/// fenced commit takes that lock). Such a process may be frozen in the
/// middle of a statement, where no timeout of the database's ends it;
/// ending the session rolls the commit back (nothing of it was
/// acknowledged) and frees the lock. Each session is ended in a savepoint
/// of its own: one this server's database role may not signal (another
/// role without `pg_signal_backend`, a superuser) is left, logged, and
/// the takeover waits for it as before. A commit that begins after this
/// and before the fenced row is updated is waited for (`lock_timeout`),
/// and ended at the next try if it is stuck too.
fn end_fenced_commits(tx: &mut postgres::Transaction<'_>) {
    let holders: Vec<i32> = match tx.query(
        "SELECT DISTINCT pid FROM pg_locks \
         WHERE locktype = 'relation' AND relation = 'peloton_leader'::regclass \
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND mode = 'RowShareLock' AND granted AND pid <> pg_backend_pid()",
        &[],
    ) {
        Ok(rows) => rows.iter().map(|r| r.get(0)).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the expired leader's commits in flight");
            return;
        }
    };
    for pid in holders {
        let ended = tx.transaction().and_then(|mut sp| {
            let ended: bool = sp
                .query_one("SELECT pg_terminate_backend($1)", &[&pid])?
                .get(0);
            sp.commit()?;
            Ok(ended)
        });
        match ended {
            Ok(true) => tracing::warn!(
                pid,
                "ended the expired leader's commit in flight, which held the fence"
            ),
            // Gone meanwhile.
            Ok(false) => {}
            Err(e) => tracing::warn!(
                pid,
                error = %e,
                "cannot end the expired leader's commit in flight; waiting for it"
            ),
        }
    }
}

/// Extends the lease of `epoch`: false when another server took it. It
/// touches only the lease row, so it never waits behind a commit (which
/// holds a share lock on the fenced row). A released lease (expiry set to
/// the epoch of time) is not extended again.
fn renew(
    client: &mut postgres::Client,
    epoch: i64,
    lease: Duration,
) -> Result<bool, postgres::Error> {
    Ok(client
        .query_opt(
            "UPDATE peloton_lease SET expires_at = now() + $2 * interval '1 millisecond' \
             WHERE id = 1 AND epoch = $1 AND expires_at > 'epoch' RETURNING epoch",
            &[&epoch, &lease_ms(lease)],
        )?
        .is_some())
}

impl Lease {
    /// Waits until this server holds the lease, telling `role` who leads
    /// meanwhile. Blocking: call from a blocking thread.
    pub fn acquire(config: LeaseConfig, role: &Role) -> anyhow::Result<Lease> {
        let holder = holder_id(&config.server_id);
        // Migrations create the lease row.
        {
            let mut c = pgstore::connect(&config.url)?;
            pgstore::migrate(&mut c)?;
        }
        let poll = (config.lease / 4).clamp(Duration::from_millis(50), Duration::from_secs(2));
        let mut client: Option<postgres::Client> = None;
        let mut said: Option<String> = None;
        loop {
            let began = Instant::now();
            let attempt = match client.as_mut() {
                Some(c) => try_acquire(c, &holder, &config).map_err(|e| e.to_string()),
                None => match pgstore::connect(&config.url) {
                    Ok(c) => {
                        client = Some(c);
                        continue;
                    }
                    Err(e) => Err(e.to_string()),
                },
            };
            match attempt {
                Ok(Ok(epoch)) => {
                    tracing::info!(epoch, holder, "leading: took the lease");
                    return Ok(Lease {
                        config,
                        holder,
                        epoch,
                        acquired_at: began,
                        stop: Arc::new(AtomicBool::new(false)),
                        keeper: None,
                    });
                }
                Ok(Err(leader)) => {
                    let leader = (!leader.is_empty()).then_some(leader);
                    if said != leader {
                        tracing::info!(leader = ?leader, "standing by");
                        said = leader.clone();
                    }
                    role.set(Standing::Standby { leader });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "standing by: cannot reach the database");
                    client = None;
                    role.set(Standing::Standby { leader: None });
                }
            }
            std::thread::sleep(poll);
        }
    }

    /// Renews the lease every third of its length on a thread of its own
    /// until [`Lease::release`] (from right after it is taken: recovery
    /// may take longer than a lease). A watchdog lapses `role` when no
    /// renewal has succeeded for a whole lease, even while a renewal hangs
    /// on a partitioned connection; a renewal that finds the lease taken
    /// stops the process.
    pub fn keep(&mut self, role: Arc<Role>) {
        let (config, epoch, stop) = (self.config.clone(), self.epoch, self.stop.clone());
        let every = config.lease / 3;
        // When the last successful renewal (or the acquisition) began: the
        // lease runs at least a lease from then on the database's clock.
        let renewed_at = Arc::new(Mutex::new(self.acquired_at));
        let (watch_role, watch_renewed, watch_stop) =
            (role.clone(), renewed_at.clone(), stop.clone());
        let lapse_after = config.lease - (config.lease / 10).max(Duration::from_millis(100));
        std::thread::Builder::new()
            .name("peloton-lease-watch".into())
            .spawn(move || {
                while !watch_stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    let since = watch_renewed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .elapsed();
                    // A margin before the database's expiry: the lease
                    // ran from the renewal's start on its clock.
                    if since >= lapse_after
                        && watch_role.transition(&Standing::Leading, Standing::Lapsed)
                    {
                        tracing::error!(
                            epoch,
                            silent_ms = since.as_millis() as u64,
                            "the lease lapsed: refusing calls until it is renewed"
                        );
                    }
                }
            })
            .expect("spawn the lease watchdog");
        let keeper = std::thread::Builder::new()
            .name("peloton-lease".into())
            .spawn(move || {
                let mut client: Option<postgres::Client> = None;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::park_timeout(every);
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let began = Instant::now();
                    let result = match client.as_mut() {
                        Some(c) => renew(c, epoch, config.lease).map_err(|e| e.to_string()),
                        None => match pgstore::connect(&config.url) {
                            Ok(mut c) => {
                                let r =
                                    renew(&mut c, epoch, config.lease).map_err(|e| e.to_string());
                                client = Some(c);
                                r
                            }
                            Err(e) => Err(e.to_string()),
                        },
                    };
                    match result {
                        Ok(true) => {
                            *renewed_at.lock().unwrap_or_else(|e| e.into_inner()) = began;
                            if role.transition(&Standing::Lapsed, Standing::Leading) {
                                tracing::warn!(epoch, "the lease is renewed: leading again");
                            }
                        }
                        // A graceful stop sets `stop` before it gives the
                        // lease up, so a renewal that lost the lease to
                        // the server taking over after it sees `stop` and
                        // ends quietly (it is no deposition: an in-process
                        // restart, in tests, would otherwise exit).
                        Ok(false) if stop.load(Ordering::SeqCst) => break,
                        Ok(false) => deposed(&format!(
                            "the lease of epoch {epoch} was taken by another server"
                        )),
                        Err(e) => {
                            client = None;
                            tracing::warn!(error = %e, "cannot renew the lease");
                        }
                    }
                }
            })
            .expect("spawn the lease keeper");
        self.keeper = Some(keeper);
    }

    /// Stops renewing and gives the lease up at once (a graceful stop), so
    /// that a standby takes over without waiting for it to expire.
    pub fn release(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Not joined: a renewal may hang on a partitioned connection.
        if let Some(k) = self.keeper.take() {
            k.thread().unpark();
        }
        match pgstore::connect(&self.config.url) {
            Ok(mut c) => {
                let r = c.execute(
                    "UPDATE peloton_lease SET expires_at = 'epoch' WHERE id = 1 AND epoch = $1",
                    &[&self.epoch],
                );
                match r {
                    Ok(_) => {
                        tracing::info!(epoch = self.epoch, holder = %self.holder, "lease released");
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot release the lease"),
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot release the lease"),
        }
    }
}
