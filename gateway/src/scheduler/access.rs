//! The loop's side of access control: stored tokens (created and revoked
//! here, published to [`Access`] once their commit is durable, before the
//! answer) and the audit log (kept in memory, bounded, written with each
//! commit).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use peloton_proto::v1 as pb;
use prost::Message;
use tonic::Status;

use super::{Reply, Scheduler};
use crate::access::{Access, Caller, Digest32};
use crate::store::{Snapshot, WriteBatch, audit_key};

/// Audit entries kept (in memory and in the store).
pub const MAX_AUDIT_ENTRIES: usize = 100_000;
/// Most audit entries one read returns.
pub const MAX_AUDIT_READ: u32 = 1000;
/// Audit entries one read returns by default.
const DEFAULT_AUDIT_READ: u32 = 100;

/// A token as stored: as listed, and its secret's digest.
#[derive(Clone, PartialEq, prost::Message)]
struct StoredToken {
    #[prost(message, optional, tag = "1")]
    token: Option<pb::Token>,
    #[prost(bytes = "vec", tag = "2")]
    digest: Vec<u8>,
}

/// Tokens and the audit log, as the loop keeps them.
#[derive(Debug, Default)]
pub(super) struct AccessState {
    /// Where valid tokens are published (none: the server is insecure and
    /// keeps nothing).
    pub(super) shared: Option<Arc<Access>>,
    tokens: BTreeMap<String, (pb::Token, Digest32)>,
    audit: VecDeque<pb::AuditEntry>,
    next_seq: u64,
}

impl AccessState {
    /// Tokens and audit entries from the store.
    pub(super) fn recover(snap: &Snapshot) -> anyhow::Result<AccessState> {
        let mut s = AccessState::default();
        for (name, bytes) in &snap.tokens {
            let stored = StoredToken::decode(bytes.as_slice())
                .map_err(|e| anyhow::anyhow!("stored token {name}: {e}"))?;
            let digest: Digest32 =
                stored.digest.as_slice().try_into().map_err(|_| {
                    anyhow::anyhow!("stored token {name}: its digest is not 32 bytes")
                })?;
            let token = stored.token.unwrap_or_default();
            s.tokens.insert(name.clone(), (token, digest));
        }
        for (key, bytes) in &snap.audit {
            let e = pb::AuditEntry::decode(bytes.as_slice())
                .map_err(|e| anyhow::anyhow!("audit entry {key}: {e}"))?;
            s.next_seq = s.next_seq.max(e.seq + 1);
            s.audit.push_back(e);
        }
        s.next_seq = s.next_seq.max(1);
        Ok(s)
    }

    /// Publishes the stored tokens to `access`.
    pub(super) fn attach(&mut self, access: Arc<Access>) {
        access.set_tokens(self.tokens.iter().filter_map(|(name, (token, digest))| {
            match Caller::from_token(token.clone()) {
                Ok(c) => Some((*digest, Arc::new(c))),
                Err(e) => {
                    tracing::error!(token = %name, error = %e, "a stored token's grants are not valid: it is refused");
                    None
                }
            }
        }));
        access.set_certs(self.tokens.values().flat_map(|(token, digest)| {
            token
                .certificates
                .iter()
                .filter_map(|c| Some((fingerprint(c)?, *digest, c.not_after_ms)))
        }));
        self.shared = Some(access);
    }
}

/// Client certificates recorded per token (expired ones are dropped when
/// another is issued).
pub const MAX_CERTS_PER_TOKEN: usize = 16;

/// A recorded certificate's fingerprint (a stored one that does not parse
/// is skipped: it never authenticates).
fn fingerprint(c: &pb::TokenCertificate) -> Option<Digest32> {
    crate::access::parse_hex("fingerprint", &c.fingerprint).ok()
}

/// A token's stored row.
fn stored_row(token: &pb::Token, digest: &Digest32) -> Vec<u8> {
    StoredToken {
        token: Some(token.clone()),
        digest: digest.to_vec(),
    }
    .encode_to_vec()
}

impl Scheduler {
    /// Creates a token (the handler checked the caller, the name and the
    /// grants).
    pub(super) fn create_token(
        &mut self,
        token: pb::Token,
        digest: Digest32,
        reply: Reply<pb::Token>,
    ) {
        let a = &mut self.access;
        let Some(shared) = a.shared.clone() else {
            let _ = reply.send(Err(Status::failed_precondition(
                "this server is insecure (--insecure): it has no tokens",
            )));
            return;
        };
        if a.tokens.contains_key(&token.name) {
            let _ = reply.send(Err(Status::already_exists(format!(
                "token {} already exists (revoke it first)",
                token.name
            ))));
            return;
        }
        if a.tokens.len() >= crate::access::MAX_TOKENS {
            let _ = reply.send(Err(Status::resource_exhausted(format!(
                "{} tokens exist; the limit is {}",
                a.tokens.len(),
                crate::access::MAX_TOKENS
            ))));
            return;
        }
        let mut token = token;
        token.created_at_ms = self.now;
        let caller = match Caller::from_token(token.clone()) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        a.tokens.insert(token.name.clone(), (token.clone(), digest));
        self.batch
            .tokens
            .push((token.name.clone(), Some(stored_row(&token, &digest))));
        self.deferred.push(Box::new(move || {
            shared.add_token(digest, caller);
            let _ = reply.send(Ok(token));
        }));
    }

    /// Revokes a token: refused from the answer on.
    pub(super) fn revoke_token(&mut self, name: String, reply: Reply<()>) {
        let a = &mut self.access;
        let (Some(shared), Some((token, digest))) = (a.shared.clone(), a.tokens.remove(&name))
        else {
            let _ = reply.send(Err(Status::not_found(format!("token {name} not found"))));
            return;
        };
        let certs: Vec<Digest32> = token.certificates.iter().filter_map(fingerprint).collect();
        self.batch.tokens.push((name, None));
        self.deferred.push(Box::new(move || {
            shared.remove_token(&digest, &certs);
            let _ = reply.send(Ok(()));
        }));
    }

    /// Records a client certificate (signed by the handler) with the token
    /// `name`: it authenticates as the token from the answer on. Expired
    /// certificates of the token are dropped first.
    pub(super) fn issue_certificate(
        &mut self,
        name: String,
        mut cert: pb::TokenCertificate,
        reply: Reply<pb::TokenCertificate>,
    ) {
        let now = self.now;
        let a = &mut self.access;
        let (Some(shared), Some((token, digest))) = (a.shared.clone(), a.tokens.get_mut(&name))
        else {
            let _ = reply.send(Err(Status::not_found(format!("token {name} not found"))));
            return;
        };
        let Some(fp) = fingerprint(&cert) else {
            let _ = reply.send(Err(Status::internal("a malformed fingerprint")));
            return;
        };
        let expired: Vec<Digest32> = token
            .certificates
            .iter()
            .filter(|c| c.not_after_ms <= now)
            .filter_map(fingerprint)
            .collect();
        if token.certificates.len() - expired.len() >= MAX_CERTS_PER_TOKEN {
            let _ = reply.send(Err(Status::resource_exhausted(format!(
                "token {name} has {MAX_CERTS_PER_TOKEN} certificates that have not expired; \
                 revoke one first (RevokeCertificate)"
            ))));
            return;
        }
        token.certificates.retain(|c| c.not_after_ms > now);
        cert.issued_at_ms = now;
        token.certificates.push(cert.clone());
        let (row, digest) = (stored_row(token, digest), *digest);
        self.batch.tokens.push((name, Some(row)));
        let not_after_ms = cert.not_after_ms;
        self.deferred.push(Box::new(move || {
            shared.remove_certs(&expired);
            shared.add_cert(fp, &digest, not_after_ms);
            let _ = reply.send(Ok(cert));
        }));
    }

    /// Forgets one client certificate of the token `name`: refused from
    /// the answer on.
    pub(super) fn revoke_certificate(&mut self, name: String, fp: Digest32, reply: Reply<()>) {
        let a = &mut self.access;
        let (Some(shared), Some((token, digest))) = (a.shared.clone(), a.tokens.get_mut(&name))
        else {
            let _ = reply.send(Err(Status::not_found(format!("token {name} not found"))));
            return;
        };
        let before = token.certificates.len();
        token
            .certificates
            .retain(|c| fingerprint(c).is_none_or(|f| f != fp));
        if token.certificates.len() == before {
            let _ = reply.send(Err(Status::not_found(format!(
                "token {name} has no certificate {}",
                crate::access::hex(&fp)
            ))));
            return;
        }
        let row = stored_row(token, digest);
        self.batch.tokens.push((name, Some(row)));
        self.deferred.push(Box::new(move || {
            shared.remove_certs(&[fp]);
            let _ = reply.send(Ok(()));
        }));
    }

    /// Every stored token, by name.
    pub(super) fn list_tokens(&self) -> Vec<pb::Token> {
        self.access
            .tokens
            .values()
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Appends an entry to the audit log (written with this iteration's
    /// commit; the oldest beyond the bound go).
    pub(super) fn audit(&mut self, mut entry: pb::AuditEntry) {
        let a = &mut self.access;
        if a.shared.is_none() {
            return;
        }
        entry.seq = a.next_seq;
        entry.time_ms = self.now;
        a.next_seq += 1;
        push_audit(&mut a.audit, &mut self.batch, entry);
    }

    /// Audit entries, newest first.
    pub(super) fn list_audit(
        &self,
        request: &pb::ListAuditRequest,
    ) -> Result<pb::ListAuditResponse, Status> {
        if request.limit > MAX_AUDIT_READ {
            return Err(crate::convert::invalid(
                "limit",
                format!("{}; the limit is {MAX_AUDIT_READ}", request.limit),
            ));
        }
        let limit = match request.limit {
            0 => DEFAULT_AUDIT_READ,
            n => n,
        } as usize;
        let before = match request.before_seq {
            0 => u64::MAX,
            s => s,
        };
        let entries = self
            .access
            .audit
            .iter()
            .rev()
            .filter(|e| e.seq < before)
            .filter(|e| request.principal.is_empty() || e.principal == request.principal)
            .take(limit)
            .cloned()
            .collect();
        Ok(pb::ListAuditResponse { entries })
    }

    /// Tells [`Access`] which jobs exist: every job at start.
    pub(super) fn publish_all_jobs(&self) {
        if let Some(shared) = &self.access.shared {
            shared.set_job_pools(
                self.core
                    .jobs_by_id("")
                    .map(|(_, j)| (j.id.clone(), j.plan.pool.clone())),
            );
        }
    }

    /// Tells [`Access`] of the jobs a commit created and deleted (before
    /// its answers and events go out).
    pub(super) fn publish_jobs(&self, events: &[crate::lifecycle::Event]) {
        let Some(shared) = &self.access.shared else {
            return;
        };
        let mut created = Vec::new();
        let mut deleted = Vec::new();
        for e in events {
            if let crate::lifecycle::EventKind::Job {
                job, deleted: d, ..
            } = &e.kind
            {
                if *d {
                    deleted.push(job.clone());
                } else if !shared.knows_job(job)
                    && let Some(j) = self.core.job_key(job).ok().and_then(|k| self.core.job(k))
                {
                    created.push((j.id.clone(), j.plan.pool.clone()));
                }
            }
        }
        if !created.is_empty() || !deleted.is_empty() {
            shared.change_jobs(created, deleted);
        }
    }
}

fn push_audit(log: &mut VecDeque<pb::AuditEntry>, batch: &mut WriteBatch, entry: pb::AuditEntry) {
    batch
        .audit
        .push((audit_key(entry.seq), Some(entry.encode_to_vec())));
    log.push_back(entry);
    while log.len() > MAX_AUDIT_ENTRIES {
        let old = log.pop_front().expect("not empty");
        batch.audit.push((audit_key(old.seq), None));
    }
}
