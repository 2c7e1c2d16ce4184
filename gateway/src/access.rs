//! Who is calling, and whether they may: the service's side of
//! `peloton-authz`.
//!
//! - [`Access`] is shared by the gRPC handlers, the loop and the
//!   authentication layer: whether the server is secure, the bootstrap
//!   admin token, the digests of the stored tokens (the loop changes them
//!   after its commit, before it answers, so a revoked token is refused
//!   from the next call on), and each job's pool (handlers check a job's
//!   permission before they send the loop anything).
//! - `crate::audit::layer` wraps every public gRPC service (and so the JSON/HTTP
//!   mirror, which calls them in process): it reads the bearer token, or
//!   without one the connection's client certificate (recorded with a
//!   token), refuses a call without a valid one (UNAUTHENTICATED), hands the
//!   [`Caller`] to the handler, and writes every mutating call to the
//!   audit log with its outcome.
//! - Handlers call [`Access::allow`] (or its job form) with the permission
//!   the call needs; a refusal is PERMISSION_DENIED naming it.
//!
//! Secrets: a token's secret is shown once, at creation; the server keeps
//! its SHA-256 digest only (tokens are 256 random bits, so a plain digest
//! is as strong as a slow hash would be).

use std::sync::{Arc, Mutex, RwLock};

use peloton_authz::{Grant, Permission, Principal, Role};
use peloton_proto::v1 as pb;
use rustc_hash::FxHashMap;
use sha2::{Digest, Sha256};
use tonic::Status;

use crate::status::truncate;

/// Name of the bootstrap admin token.
pub const ADMIN: &str = "admin";
/// Name the audit log gives calls without a valid token.
pub const UNAUTHENTICATED: &str = "unauthenticated";
/// Name of every caller of an insecure server.
pub const ANONYMOUS: &str = "anonymous";
/// What every token's secret starts with (so a leaked one is recognisable).
pub const SECRET_PREFIX: &str = "pel_";
/// Longest authorization header read.
const MAX_TOKEN_BYTES: usize = 512;
/// Most grants in one token.
pub const MAX_GRANTS: usize = 64;
/// Most tokens stored.
pub use crate::lifecycle::MAX_TOKENS;
/// Longest audit target kept (longer ones are cut).
const MAX_TARGET_BYTES: usize = 512;
/// Deleted jobs whose pool is remembered for filtering reads (their last
/// events reach their viewers' watches after the job is gone).
const REMEMBERED_DELETED_JOBS: usize = 100_000;

/// A token's digest (and a certificate's fingerprint).
pub use crate::lifecycle::Digest32;

/// The SHA-256 digest of a token's secret.
pub fn digest(secret: &str) -> Digest32 {
    digest_bytes(secret.as_bytes())
}

/// The SHA-256 digest of bytes (a certificate's DER: its fingerprint).
pub fn digest_bytes(bytes: &[u8]) -> Digest32 {
    Sha256::digest(bytes).into()
}

/// A digest as lowercase hex (how fingerprints are shown).
pub use crate::lifecycle::digest_hex as hex;

/// A fingerprint from its hex form, or INVALID_ARGUMENT naming `field`.
pub fn parse_hex(field: &str, text: &str) -> Result<Digest32, Status> {
    let bad = || crate::convert::invalid(field, "must be 64 hex digits (a SHA-256 fingerprint)");
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// A new random secret: the prefix and 256 random bits in hex.
pub fn new_secret() -> String {
    format!(
        "{SECRET_PREFIX}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// What tonic records of a TLS connection (its client certificates among
/// it); the JSON mirror copies it to the calls it makes in process.
pub type TlsInfo =
    tonic::transport::server::TlsConnectInfo<tonic::transport::server::TcpConnectInfo>;

/// Who is calling: its token as listed and its grants.
#[derive(Debug)]
pub struct Caller {
    /// Name and grants.
    pub principal: Principal,
    /// The token as the API shows it.
    pub token: pb::Token,
    /// Set when the token is revoked: streams it opened end.
    revoked: std::sync::atomic::AtomicBool,
}

/// The message a stream ends with when its token is revoked.
pub const REVOKED: &str = "the token was revoked";

/// `stream`, ended with UNAUTHENTICATED at its next message once `caller`'s
/// token is revoked (a revoked token stops working at once, open streams
/// included).
pub fn until_revoked<T>(
    stream: impl futures::Stream<Item = Result<T, Status>> + Send + 'static,
    caller: Arc<Caller>,
) -> impl futures::Stream<Item = Result<T, Status>> + Send + 'static
where
    T: Send + 'static,
{
    use futures::StreamExt as _;
    let mut ended = false;
    stream
        .map(move |item| {
            if caller.is_revoked() {
                Err(Status::unauthenticated(REVOKED))
            } else {
                item
            }
        })
        .take_while(move |item| {
            let go = !ended;
            if matches!(item, Err(e) if e.code() == tonic::Code::Unauthenticated && e.message() == REVOKED)
            {
                ended = true;
            }
            std::future::ready(go)
        })
}

impl Caller {
    /// The caller holding `token` (its grants already checked). Its
    /// certificates are not kept (they change; the loop lists them).
    pub fn from_token(mut token: pb::Token) -> Result<Caller, Status> {
        token.certificates.clear();
        let grants = grants_from_pb("grants", &token.grants)?;
        Ok(Caller {
            principal: Principal::new(token.name.clone(), grants),
            token,
            revoked: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Another caller of the same token, with a revoked flag of its own
    /// (a certificate's).
    fn same_token(&self) -> Caller {
        Caller {
            principal: self.principal.clone(),
            token: self.token.clone(),
            revoked: std::sync::atomic::AtomicBool::new(self.is_revoked()),
        }
    }

    /// Whether its token (or certificate) was revoked.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The bootstrap admin, or an insecure server's anonymous caller.
    fn admin(name: &str) -> Caller {
        Caller::from_token(pb::Token {
            name: name.to_owned(),
            grants: vec![pb::Grant {
                role: pb::Role::ClusterAdmin as i32,
                pool: "/".into(),
            }],
            created_at_ms: 0,
            created_by: String::new(),
            certificates: Vec::new(),
        })
        .expect("a valid grant")
    }
}

/// The API's grants as the model's, refusing a bad one with the field.
pub fn grants_from_pb(field: &str, grants: &[pb::Grant]) -> Result<Vec<Grant>, Status> {
    if grants.len() > MAX_GRANTS {
        return Err(crate::convert::invalid(
            field,
            format!("{} grants; the limit is {MAX_GRANTS}", grants.len()),
        ));
    }
    grants
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let role = match pb::Role::try_from(g.role) {
                Ok(pb::Role::Viewer) => Role::Viewer,
                Ok(pb::Role::Submitter) => Role::Submitter,
                Ok(pb::Role::PoolAdmin) => Role::PoolAdmin,
                Ok(pb::Role::ClusterAdmin) => Role::ClusterAdmin,
                _ => {
                    return Err(crate::convert::invalid(
                        &format!("{field}[{i}].role"),
                        "must be VIEWER, SUBMITTER, POOL_ADMIN or CLUSTER_ADMIN",
                    ));
                }
            };
            Grant::new(role, &g.pool)
                .map_err(|e| crate::convert::invalid(&format!("{field}[{i}].pool"), e.0))
        })
        .collect()
}

/// A token's name: 1–64 characters of `[A-Za-z0-9._-]`.
pub fn check_token_name(field: &str, name: &str) -> Result<(), Status> {
    if name.is_empty() || name.len() > 64 {
        return Err(crate::convert::invalid(field, "must be 1–64 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(crate::convert::invalid(
            field,
            "may hold only letters, digits, '.', '_' and '-'",
        ));
    }
    if [ADMIN, UNAUTHENTICATED, ANONYMOUS].contains(&name) {
        return Err(crate::convert::invalid(
            field,
            format!("{name:?} is reserved"),
        ));
    }
    Ok(())
}

/// Access control state shared by the layer, the handlers and the loop.
#[derive(Debug)]
pub struct Access {
    secure: bool,
    admin: Option<(Digest32, Arc<Caller>)>,
    anonymous: Arc<Caller>,
    tokens: RwLock<FxHashMap<Digest32, Arc<Caller>>>,
    /// Client certificates recorded with tokens, by the SHA-256 of their
    /// DER: each has a caller of its own (its token's name and grants, and
    /// a revoked flag of its own, so revoking one certificate ends the
    /// streams it opened) and its expiry (ms since the epoch).
    certs: RwLock<FxHashMap<Digest32, (Arc<Caller>, u64)>>,
    /// The CA that signs user certificates, when the server holds its key.
    signer: Option<Arc<peloton_tls::Pki>>,
    job_pools: RwLock<std::collections::BTreeMap<Arc<str>, Arc<str>>>,
    /// The pools of the jobs deleted last (bounded), oldest first: for
    /// filtering events, never for authorizing a call.
    deleted: RwLock<Deleted>,
    /// The live jobs by name, for calls that name a job by its name.
    job_names: RwLock<JobNames>,
}

/// The live jobs by name: each name's jobs, whether each has ended.
#[derive(Debug, Default)]
struct JobNames {
    by_name: FxHashMap<Arc<str>, std::collections::BTreeMap<Arc<str>, bool>>,
    name_of: FxHashMap<Arc<str>, Arc<str>>,
}

impl JobNames {
    /// Records job `id` named `name`, ended or not.
    fn set(&mut self, id: Arc<str>, name: Arc<str>, ended: bool) {
        if name.is_empty() {
            // No name: known by its id alone.
            self.forget(&id);
            return;
        }
        if let Some(old) = self.name_of.get(&id)
            && *old != name
        {
            let old = old.clone();
            self.remove(&id, &old);
        }
        self.name_of.insert(id.clone(), name.clone());
        self.by_name.entry(name).or_default().insert(id, ended);
    }

    fn remove(&mut self, id: &str, name: &str) {
        if let Some(ids) = self.by_name.get_mut(name) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_name.remove(name);
            }
        }
    }

    fn forget(&mut self, id: &str) {
        if let Some(name) = self.name_of.remove(id) {
            self.remove(id, &name);
        }
    }
}

/// Recently deleted jobs' pools, bounded.
#[derive(Debug, Default)]
struct Deleted {
    pools: FxHashMap<Arc<str>, Arc<str>>,
    order: std::collections::VecDeque<Arc<str>>,
}

impl Access {
    /// Access of an insecure server: every call is the anonymous cluster
    /// admin.
    pub fn insecure() -> Access {
        Access {
            secure: false,
            admin: None,
            anonymous: Arc::new(Caller::admin(ANONYMOUS)),
            tokens: RwLock::default(),
            certs: RwLock::default(),
            signer: None,
            job_pools: RwLock::default(),
            deleted: RwLock::default(),
            job_names: RwLock::default(),
        }
    }

    /// Access of a secure server whose bootstrap admin token is
    /// `admin_secret`; `signer` signs user certificates (none: the server
    /// cannot issue them).
    pub fn secure(admin_secret: &str, signer: Option<Arc<peloton_tls::Pki>>) -> Access {
        Access {
            secure: true,
            admin: Some((digest(admin_secret), Arc::new(Caller::admin(ADMIN)))),
            signer,
            ..Access::insecure()
        }
    }

    /// The CA that signs user certificates, if the server holds its key.
    pub fn signer(&self) -> Option<&peloton_tls::Pki> {
        self.signer.as_deref()
    }

    /// Whether calls need a token.
    pub fn is_secure(&self) -> bool {
        self.secure
    }

    /// The caller presenting `secret`, if it is a valid token.
    pub fn lookup(&self, secret: &str) -> Option<Arc<Caller>> {
        let d = digest(secret);
        if let Some((admin, caller)) = &self.admin
            && *admin == d
        {
            return Some(caller.clone());
        }
        self.tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&d)
            .cloned()
    }

    /// Who sends `headers` over a connection whose client certificate (DER)
    /// is `peer_cert`: a valid bearer token's caller; without a bearer
    /// header, the caller of the token the certificate is recorded with;
    /// an insecure server's anonymous admin; or why not.
    pub fn authenticate(
        &self,
        headers: &axum::http::HeaderMap,
        peer_cert: Option<&[u8]>,
    ) -> Result<Arc<Caller>, Status> {
        if !self.secure {
            return Ok(self.anonymous.clone());
        }
        let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
            if let Some(der) = peer_cert {
                let now_ms = crate::clock::wall_ms();
                let certs = self.certs.read().unwrap_or_else(|e| e.into_inner());
                return match certs.get(&digest_bytes(der)) {
                    // TLS checked its validity at the handshake; a resumed
                    // session is not checked again, so the expiry is here too.
                    Some((caller, not_after_ms)) if now_ms < *not_after_ms => Ok(caller.clone()),
                    Some(_) => Err(Status::unauthenticated(
                        "the client certificate has expired",
                    )),
                    None => Err(Status::unauthenticated(
                        "the client certificate is not recorded with any token (a cluster \
                         admin issues one with `peloton token cert NAME`; revoked ones are \
                         refused)",
                    )),
                };
            }
            return Err(Status::unauthenticated(
                "no token: send `authorization: Bearer <token>` (the CLI reads it from \
                 PELOTON_TOKEN, PELOTON_TOKEN_FILE or its config file) or a client \
                 certificate issued for a token",
            ));
        };
        let secret = value
            .to_str()
            .ok()
            .filter(|v| v.len() <= MAX_TOKEN_BYTES)
            .and_then(|v| {
                let (scheme, rest) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then_some(rest)
            })
            .map(str::trim)
            .ok_or_else(|| {
                Status::unauthenticated("the authorization header must be `Bearer <token>`")
            })?;
        self.lookup(secret)
            .ok_or_else(|| Status::unauthenticated("the token is not valid (unknown or revoked)"))
    }

    /// The stored tokens from now on (the loop, at start).
    pub fn set_tokens(&self, tokens: impl IntoIterator<Item = (Digest32, Arc<Caller>)>) {
        *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = tokens.into_iter().collect();
    }

    /// A token is valid from now on.
    pub fn add_token(&self, digest: Digest32, caller: Arc<Caller>) {
        self.tokens
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(digest, caller);
    }

    /// A token is refused from now on, and so are its certificates
    /// (`certs`, by fingerprint); the streams it opened end.
    pub fn remove_token(&self, digest: &Digest32, certs: &[Digest32]) {
        let gone = self
            .tokens
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(digest);
        self.remove_certs(certs);
        if let Some(c) = gone {
            c.revoked.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The certificates recorded with stored tokens from now on (the
    /// loop, at start): each fingerprint with its token's digest and its
    /// expiry.
    pub fn set_certs(&self, certs: impl IntoIterator<Item = (Digest32, Digest32, u64)>) {
        let tokens = self.tokens.read().unwrap_or_else(|e| e.into_inner());
        let map = certs
            .into_iter()
            .filter_map(|(fp, token, not_after_ms)| {
                let caller = tokens.get(&token)?;
                Some((fp, (Arc::new(caller.same_token()), not_after_ms)))
            })
            .collect();
        *self.certs.write().unwrap_or_else(|e| e.into_inner()) = map;
    }

    /// A certificate acts as the token whose digest is `token` from now on,
    /// until `not_after_ms` (nothing if that token is gone).
    pub fn add_cert(&self, fingerprint: Digest32, token: &Digest32, not_after_ms: u64) {
        let caller = self
            .tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .map(|c| Arc::new(c.same_token()));
        if let Some(caller) = caller {
            self.certs
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(fingerprint, (caller, not_after_ms));
        }
    }

    /// Certificates refused from now on; the streams they opened end.
    pub fn remove_certs(&self, fingerprints: &[Digest32]) {
        if fingerprints.is_empty() {
            return;
        }
        let mut m = self.certs.write().unwrap_or_else(|e| e.into_inner());
        for fp in fingerprints {
            if let Some((caller, _)) = m.remove(fp) {
                caller
                    .revoked
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// The pool of every live job from now on (the loop, at start).
    pub fn set_job_pools(&self, jobs: impl IntoIterator<Item = (Arc<str>, Arc<str>)>) {
        *self.job_pools.write().unwrap_or_else(|e| e.into_inner()) = jobs.into_iter().collect();
    }

    /// The name of every live job, and whether it has ended, from now on
    /// (the loop, at start).
    pub fn set_job_names(&self, jobs: impl IntoIterator<Item = (Arc<str>, Arc<str>, bool)>) {
        let mut names = JobNames::default();
        for (id, name, ended) in jobs {
            names.set(id, name, ended);
        }
        *self.job_names.write().unwrap_or_else(|e| e.into_inner()) = names;
    }

    /// Jobs whose state a commit changed: their names and whether they
    /// have ended (created jobs among them).
    pub fn name_jobs(&self, jobs: impl IntoIterator<Item = (Arc<str>, Arc<str>, bool)>) {
        let mut names = self.job_names.write().unwrap_or_else(|e| e.into_inner());
        for (id, name, ended) in jobs {
            names.set(id, name, ended);
        }
    }

    /// Jobs created and deleted by a commit.
    pub fn change_jobs(
        &self,
        created: impl IntoIterator<Item = (Arc<str>, Arc<str>)>,
        deleted: impl IntoIterator<Item = Arc<str>>,
    ) {
        let mut m = self.job_pools.write().unwrap_or_else(|e| e.into_inner());
        m.extend(created);
        let mut gone = self.deleted.write().unwrap_or_else(|e| e.into_inner());
        let mut names = self.job_names.write().unwrap_or_else(|e| e.into_inner());
        for d in deleted {
            names.forget(&d);
            if let Some(pool) = m.remove(&d) {
                gone.order.push_back(d.clone());
                gone.pools.insert(d, pool);
                while gone.order.len() > REMEMBERED_DELETED_JOBS {
                    let old = gone.order.pop_front().expect("not empty");
                    gone.pools.remove(&old);
                }
            }
        }
    }

    /// Whether the job is known.
    pub fn knows_job(&self, job: &str) -> bool {
        self.job_pools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(job)
    }

    /// The live job `given` names, for `caller`: the job with that id, else
    /// the one whose id starts with it among the jobs `caller` may read
    /// (job ids are the server's UUIDs; a unique prefix names one, as git
    /// and docker take them), else the one of that name
    /// ([`Access::resolve_job_name`]); `job/` before any of these is
    /// ignored (the CLI's `-o name` lines). None: no job matches (the call
    /// answers NOT_FOUND as for any unknown id). INVALID_ARGUMENT naming
    /// `field` when several match.
    pub fn resolve_job(
        &self,
        caller: &Caller,
        field: &str,
        given: &str,
    ) -> Result<Option<Arc<str>>, Status> {
        // `job/ID` (the CLI's `-o name`, as kubectl writes it) is ID.
        let given = given.strip_prefix("job/").unwrap_or(given);
        let m = self.job_pools.read().unwrap_or_else(|e| e.into_inner());
        if let Some((id, _)) = m.get_key_value(given) {
            return Ok(Some(id.clone()));
        }
        if given.is_empty() {
            return Ok(None);
        }
        if !given.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return self.resolve_job_name(&m, caller, field, given);
        }
        let mut matches = m
            .range::<str, _>((std::ops::Bound::Included(given), std::ops::Bound::Unbounded))
            .take_while(|(id, _)| id.starts_with(given))
            .filter(|(_, pool)| {
                caller.principal.sees_everything()
                    || caller.principal.allows(Permission::JobsRead, pool)
            })
            .map(|(id, _)| id.clone());
        let Some(first) = matches.next() else {
            // No id starts with it: it may be a name ("cafe").
            return self.resolve_job_name(&m, caller, field, given);
        };
        let rest: Vec<Arc<str>> = matches.by_ref().take(MAX_NAMED_MATCHES).collect();
        if rest.is_empty() {
            // A start of one job's id that is also another job's name
            // ("dd", "cafe") names neither: a kill must not pick one.
            return match self.resolve_job_name(&m, caller, field, given) {
                Ok(Some(named)) if named != first => Err(Status::invalid_argument(format!(
                    "{field}: {given:?} is the start of job {first}'s id and the name of job \
                     {named}: give the id"
                ))),
                Err(_) => Err(Status::invalid_argument(format!(
                    "{field}: {given:?} is the start of job {first}'s id and the name of other \
                     jobs: give the id"
                ))),
                _ => Ok(Some(first)),
            };
        }
        let more = matches.count();
        let mut named: Vec<&str> = std::iter::once(&*first)
            .chain(rest.iter().map(|id| &**id))
            .take(MAX_NAMED_MATCHES)
            .collect();
        named.sort_unstable();
        let n = 1 + rest.len() + more;
        Err(Status::invalid_argument(format!(
            "{field}: {given:?} is the start of {n} jobs' ids ({}{}): give more of it",
            named.join(", "),
            if n > named.len() { ", …" } else { "" }
        )))
    }

    /// The live job the name `given` names, for `caller` (see
    /// [`Access::resolve_job`]): `NAME`, or `POOL/NAME` (a pool path, then
    /// the name after its last `/`), among the jobs `caller` may read. Of
    /// several jobs of that name the one that has not ended is named (the
    /// core keeps a pool's unfinished jobs' names distinct); one ended job
    /// alone is named too. INVALID_ARGUMENT naming `field` and the
    /// candidates when several have not ended (in several pools, or from a
    /// store written before names were unique), or none has and several
    /// ended.
    fn resolve_job_name(
        &self,
        pools: &std::collections::BTreeMap<Arc<str>, Arc<str>>,
        caller: &Caller,
        field: &str,
        given: &str,
    ) -> Result<Option<Arc<str>>, Status> {
        let (pool, name) = match given.rfind('/') {
            Some(i) if given.starts_with('/') && i > 0 => (Some(&given[..i]), &given[i + 1..]),
            _ => (None, given),
        };
        let names = self.job_names.read().unwrap_or_else(|e| e.into_inner());
        let Some(ids) = names.by_name.get(name) else {
            return Ok(None);
        };
        // (ended, pool, id) of each readable job of that name.
        let mut found: Vec<(bool, &Arc<str>, &Arc<str>)> = ids
            .iter()
            .filter_map(|(id, &ended)| Some((ended, pools.get(id)?, id)))
            .filter(|(_, p, _)| pool.is_none_or(|want| ***p == *want))
            .filter(|(_, p, _)| {
                caller.principal.sees_everything()
                    || caller.principal.allows(Permission::JobsRead, p)
            })
            .collect();
        if found.iter().any(|(ended, ..)| !ended) {
            found.retain(|(ended, ..)| !ended);
        }
        match found.len() {
            0 => Ok(None),
            1 => Ok(Some(found[0].2.clone())),
            n => {
                found.sort_unstable_by(|a, b| (a.1, a.2).cmp(&(b.1, b.2)));
                let named: Vec<String> = found
                    .iter()
                    .take(MAX_NAMED_MATCHES)
                    .map(|(_, p, id)| format!("{id} in {p}"))
                    .collect();
                let which = if found[0].0 { "ended " } else { "unfinished " };
                Err(Status::invalid_argument(format!(
                    "{field}: {n} {which}jobs are named {name:?} ({}{}): give an id{}",
                    named.join(", "),
                    if n > named.len() { ", …" } else { "" },
                    if pool.is_none() && found.iter().any(|f| f.1 != found[0].1) {
                        ", or POOL/NAME"
                    } else {
                        ""
                    }
                )))
            }
        }
    }

    /// A job's pool.
    pub fn job_pool(&self, job: &str) -> Option<Arc<str>> {
        self.job_pools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(job)
            .cloned()
    }

    /// A job's pool, live or among the recently deleted (for objects that
    /// outlive their job, such as volumes).
    pub fn job_pool_or_deleted(&self, job: &str) -> Option<Arc<str>> {
        self.job_pool(job).or_else(|| {
            self.deleted
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .pools
                .get(job)
                .cloned()
        })
    }

    /// Whether `caller` may read the job `job` (false for an unknown job
    /// unless it reads everything).
    pub fn sees_job(&self, caller: &Caller, job: &str) -> bool {
        if caller.principal.sees_everything() {
            return true;
        }
        self.job_pool_or_deleted(job)
            .is_some_and(|p| caller.principal.allows(Permission::JobsRead, &p))
    }
}

/// The caller of a request that passed [`layer`]. A secure server's
/// request without one (it did not come through the layer) is refused.
pub fn caller<T>(request: &tonic::Request<T>) -> Result<Arc<Caller>, Status> {
    request
        .extensions()
        .get::<Arc<Caller>>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("the call carries no identity"))
}

/// Records what a call named, for its audit entry.
pub fn note<T>(request: &tonic::Request<T>, target: impl Into<String>) {
    if let Some(n) = request.extensions().get::<AuditNote>() {
        n.set(&target.into());
    }
}

/// `caller` may do `permission` on `pool` (a cluster permission ignores
/// it), or PERMISSION_DENIED naming what it lacked.
pub fn allow(caller: &Caller, permission: Permission, pool: &str) -> Result<(), Status> {
    caller
        .principal
        .check(permission, pool)
        .map_err(|d| Status::permission_denied(d.to_string()))
}

/// Checks a request's caller for `permission` on `pool` and notes
/// `target` for the audit log.
pub fn require<T>(
    request: &tonic::Request<T>,
    permission: Permission,
    pool: &str,
    target: impl Into<String>,
) -> Result<Arc<Caller>, Status> {
    note(request, target);
    let c = caller(request)?;
    allow(&c, permission, pool)?;
    Ok(c)
}

/// Jobs an ambiguous id prefix's error names at most.
const MAX_NAMED_MATCHES: usize = 5;

/// Checks a request's caller for `permission` on the job `job`'s pool.
/// An unknown job is NOT_FOUND for a caller that could not act on it
/// anywhere; for one that could, the loop answers (it knows the job or
/// says NOT_FOUND itself).
pub fn require_job<T>(
    access: &Access,
    request: &tonic::Request<T>,
    permission: Permission,
    job: &str,
) -> Result<Arc<Caller>, Status> {
    note(request, job);
    let c = caller(request)?;
    match access.job_pool(job) {
        Some(pool) => allow(&c, permission, &pool)?,
        None if c.principal.allows(permission, "/") => {}
        None => return Err(Status::not_found(format!("job {job} not found"))),
    }
    Ok(c)
}

/// What a call named, filled in by its handler (see [`note`]).
#[derive(Clone, Debug, Default)]
pub struct AuditNote(Arc<Mutex<String>>);

impl AuditNote {
    /// Replaces what the call named (for what only its answer tells).
    pub fn set(&self, target: &str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) =
            truncate(target, MAX_TARGET_BYTES).into_owned();
    }

    /// Takes what the call named (the layer, once the call is answered).
    pub fn take(&self) -> String {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The request's audit note, to fill in after the request is consumed.
pub fn note_handle<T>(request: &tonic::Request<T>) -> Option<AuditNote> {
    request.extensions().get::<AuditNote>().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_valid_bearer_token_authenticates() {
        let access = Access::secure("pel_root", None);
        let mut h = axum::http::HeaderMap::new();
        assert_eq!(
            access.authenticate(&h, None).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        h.insert("authorization", "Bearer pel_root".parse().unwrap());
        assert_eq!(
            access.authenticate(&h, None).unwrap().principal.name(),
            ADMIN
        );
        h.insert("authorization", "Basic pel_root".parse().unwrap());
        assert!(access.authenticate(&h, None).is_err());
        let token = pb::Token {
            name: "alice".into(),
            grants: vec![pb::Grant {
                role: pb::Role::Submitter as i32,
                pool: "/a".into(),
            }],
            ..Default::default()
        };
        let d = digest("pel_alice");
        access.add_token(d, Arc::new(Caller::from_token(token).unwrap()));
        h.insert("authorization", "Bearer pel_alice".parse().unwrap());
        assert_eq!(
            access.authenticate(&h, None).unwrap().principal.name(),
            "alice"
        );
        // A recorded certificate acts as its token when no header is sent;
        // a header wins over it; an unrecorded one is refused.
        let (cert, other) = (b"alice's certificate".as_slice(), b"another".as_slice());
        access.add_cert(digest_bytes(cert), &d, u64::MAX);
        let by_cert = access
            .authenticate(&axum::http::HeaderMap::new(), Some(cert))
            .unwrap();
        let none = axum::http::HeaderMap::new();
        assert_eq!(
            access
                .authenticate(&none, Some(cert))
                .unwrap()
                .principal
                .name(),
            "alice"
        );
        let e = access.authenticate(&none, Some(other)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(e.message().contains("not recorded"), "{e}");
        let mut admin = axum::http::HeaderMap::new();
        admin.insert("authorization", "Bearer pel_root".parse().unwrap());
        assert_eq!(
            access
                .authenticate(&admin, Some(cert))
                .unwrap()
                .principal
                .name(),
            ADMIN
        );
        // Revoking the token refuses both, and marks the certificate's
        // caller revoked (its streams end).
        access.remove_token(&d, &[digest_bytes(cert)]);
        assert!(access.authenticate(&h, None).is_err());
        assert!(access.authenticate(&none, Some(cert)).is_err());
        assert!(by_cert.is_revoked());
        // An expired certificate is refused even if still recorded.
        let d2 = digest("pel_bob");
        let bob = pb::Token {
            name: "bob".into(),
            grants: vec![pb::Grant {
                role: pb::Role::Viewer as i32,
                pool: "/".into(),
            }],
            ..Default::default()
        };
        access.add_token(d2, Arc::new(Caller::from_token(bob).unwrap()));
        access.add_cert(digest_bytes(other), &d2, 1);
        let e = access.authenticate(&none, Some(other)).unwrap_err();
        assert!(e.message().contains("expired"), "{e}");
        // An insecure server needs nothing.
        let open = Access::insecure();
        assert!(
            open.authenticate(&axum::http::HeaderMap::new(), None)
                .is_ok()
        );
    }

    #[test]
    fn fingerprints_round_trip_through_hex() {
        let d = digest_bytes(b"x");
        let text = hex(&d);
        assert_eq!(text.len(), 64);
        assert_eq!(parse_hex("fingerprint", &text).unwrap(), d);
        assert_eq!(parse_hex("fingerprint", &text.to_uppercase()).unwrap(), d);
        for bad in ["", "zz", &"0".repeat(63), &"g".repeat(64)] {
            let e = parse_hex("fingerprint", bad).unwrap_err();
            assert!(e.message().contains("fingerprint"), "{e}");
        }
    }

    #[test]
    fn token_names_and_grants_are_checked_with_the_field() {
        assert!(check_token_name("name", "ci-bot.1").is_ok());
        for bad in ["", "a b", "admin", "é", &"x".repeat(65)] {
            assert!(check_token_name("name", bad).is_err(), "{bad:?}");
        }
        let e = grants_from_pb(
            "grants",
            &[pb::Grant {
                role: pb::Role::ClusterAdmin as i32,
                pool: "/a".into(),
            }],
        )
        .unwrap_err();
        assert!(e.message().contains("grants[0].pool"), "{e}");
        let e = grants_from_pb(
            "grants",
            &[pb::Grant {
                role: 0,
                pool: "/".into(),
            }],
        )
        .unwrap_err();
        assert!(e.message().contains("grants[0].role"), "{e}");
    }
}
