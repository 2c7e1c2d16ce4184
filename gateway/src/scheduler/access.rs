//! The loop's side of access control. Tokens, their certificates and the
//! audit log are the core's (`lifecycle::AccessState`), changed only by its
//! inputs; here they are converted from and to the API's messages, and what
//! the core says the authentication table ([`Access`]) must learn is
//! published to it once the commit is durable, before the answers.

use std::sync::Arc;

use peloton_proto::v1 as pb;

use super::{Reply, Scheduler};
use crate::access::{Access, Caller, Digest32};
use crate::codec::{audit_from_pb, audit_to_pb, token_to_pb};
use crate::lifecycle::{AccessChange, Certificate, Error, Input, Token};

/// Most audit entries one read returns.
pub const MAX_AUDIT_READ: u32 = 1000;
/// Audit entries one read returns by default.
const DEFAULT_AUDIT_READ: u32 = 100;

/// What an insecure server answers to a new token.
fn insecure() -> Error {
    Error::Precondition("this server is insecure (--insecure): it has no tokens".into())
}

/// What an insecure server answers to commands about a token.
fn no_token(name: &str) -> Error {
    Error::NotFound(format!("token {name} not found"))
}

impl Scheduler {
    /// Publishes the stored tokens and certificates to `access`.
    pub(super) fn attach_access(&mut self, access: Arc<Access>) {
        let tokens = self.core.access().tokens();
        access.set_tokens(tokens.filter_map(|t| {
            match Caller::from_token(token_to_pb(t)) {
                Ok(c) => Some((t.digest, Arc::new(c))),
                Err(e) => {
                    tracing::error!(token = %t.name, error = %e, "a stored token's grants are not valid: it is refused");
                    None
                }
            }
        }));
        access.set_certs(self.core.access().tokens().flat_map(|t| {
            t.certificates
                .iter()
                .map(|c| (c.fingerprint, t.digest, c.not_after_ms))
        }));
        self.shared_access = Some(access);
    }

    /// Tells [`Access`] what a durable commit changed of the tokens.
    pub(super) fn publish_access(&mut self, changes: Vec<AccessChange>) {
        let Some(shared) = &self.shared_access else {
            return;
        };
        for change in changes {
            match change {
                AccessChange::TokenCreated(name) => {
                    // (Gone again if revoked in the same commit.)
                    if let Some(t) = self.core.access().token(&name)
                        && let Ok(caller) = Caller::from_token(token_to_pb(t))
                    {
                        shared.add_token(t.digest, Arc::new(caller));
                    }
                }
                AccessChange::TokenRevoked {
                    digest,
                    certificates,
                } => shared.remove_token(&digest, &certificates),
                AccessChange::CertificateIssued {
                    fingerprint,
                    digest,
                    not_after_ms,
                } => shared.add_cert(fingerprint, &digest, not_after_ms),
                AccessChange::CertificatesRemoved(fingerprints) => {
                    shared.remove_certs(&fingerprints);
                }
            }
        }
    }

    /// Creates a token (the handler checked the caller, the name and the
    /// grants).
    pub(super) fn create_token(&mut self, token: Token, reply: Reply<pb::Token>) {
        if self.shared_access.is_none() {
            return self.defer(reply, Err(insecure()));
        }
        let name = token.name.clone();
        let r = self
            .apply(Input::CreateToken(Box::new(token)))
            .map(|_| token_to_pb(self.core.access().token(&name).expect("created")));
        self.defer(reply, r);
    }

    /// Revokes a token: refused from the answer on.
    pub(super) fn revoke_token(&mut self, name: String, reply: Reply<()>) {
        if self.shared_access.is_none() {
            return self.defer(reply, Err(no_token(&name)));
        }
        let r = self.apply(Input::RevokeToken { name }).map(|_| ());
        self.defer(reply, r);
    }

    /// Records a client certificate (signed by the handler) with the token
    /// `name`: it authenticates as the token from the answer on. Expired
    /// certificates of the token are dropped first.
    pub(super) fn issue_certificate(
        &mut self,
        name: String,
        cert: Certificate,
        reply: Reply<pb::TokenCertificate>,
    ) {
        if self.shared_access.is_none() {
            return self.defer(reply, Err(no_token(&name)));
        }
        let r = self
            .apply(Input::IssueCertificate {
                name: name.clone(),
                certificate: cert,
            })
            .map(|_| {
                let token = self.core.access().token(&name).expect("issued");
                let c = token.certificates.last().expect("issued");
                pb::TokenCertificate {
                    fingerprint: crate::access::hex(&c.fingerprint),
                    issued_at_ms: c.issued_at_ms,
                    not_after_ms: c.not_after_ms,
                }
            });
        self.defer(reply, r);
    }

    /// Forgets one client certificate of the token `name`: refused from
    /// the answer on.
    pub(super) fn revoke_certificate(&mut self, name: String, fp: Digest32, reply: Reply<()>) {
        if self.shared_access.is_none() {
            return self.defer(reply, Err(no_token(&name)));
        }
        let r = self
            .apply(Input::RevokeCertificate {
                name,
                fingerprint: fp,
            })
            .map(|_| ());
        self.defer(reply, r);
    }

    /// Every stored token, by name.
    pub(super) fn list_tokens(&self) -> Vec<pb::Token> {
        self.core.access().tokens().map(token_to_pb).collect()
    }

    /// Appends an entry to the audit log (a secure server's).
    pub(super) fn audit(&mut self, entry: pb::AuditEntry) {
        if self.shared_access.is_some() {
            self.step(Input::Audit(Box::new(audit_from_pb(entry))));
        }
    }

    /// Audit entries, newest first.
    pub(super) fn list_audit(
        &self,
        request: &pb::ListAuditRequest,
    ) -> Result<pb::ListAuditResponse, Error> {
        if request.limit > MAX_AUDIT_READ {
            return Err(Error::invalid(
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
            .core
            .access()
            .audit_newest_first()
            .filter(|e| e.seq < before)
            .filter(|e| request.principal.is_empty() || e.principal == request.principal)
            .take(limit)
            .map(audit_to_pb)
            .collect();
        Ok(pb::ListAuditResponse { entries })
    }

    /// Tells [`Access`] which jobs exist: every job at start.
    pub(super) fn publish_all_jobs(&self) {
        if let Some(shared) = &self.job_index {
            shared.set_job_pools(
                self.core
                    .jobs_by_id("")
                    .map(|(_, j)| (j.id.clone(), j.plan.pool.clone())),
            );
            shared.set_job_names(
                self.core
                    .jobs_by_id("")
                    .map(|(_, j)| (j.id.clone(), j.plan.name.clone(), j.state.is_terminal())),
            );
        }
    }

    /// Tells [`Access`] of the jobs a commit created and deleted (before
    /// its answers and events go out).
    pub(super) fn publish_jobs(&self, events: &[crate::lifecycle::Event]) {
        let Some(shared) = &self.job_index else {
            return;
        };
        let mut created = Vec::new();
        let mut deleted = Vec::new();
        let mut named = Vec::new();
        for e in events {
            if let crate::lifecycle::EventKind::Job {
                job,
                deleted: d,
                state,
                ..
            } = &e.kind
            {
                if *d {
                    deleted.push(job.clone());
                } else if let Some(j) = self.core.job_key(job).ok().and_then(|k| self.core.job(k)) {
                    if !shared.knows_job(job) {
                        created.push((j.id.clone(), j.plan.pool.clone()));
                    }
                    named.push((j.id.clone(), j.plan.name.clone(), state.is_terminal()));
                }
            }
        }
        if !named.is_empty() {
            shared.name_jobs(named);
        }
        if !created.is_empty() || !deleted.is_empty() {
            shared.change_jobs(created, deleted);
        }
    }
}
