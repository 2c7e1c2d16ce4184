//! Access: the stored tokens (name, grants, the digest of their secret,
//! the client certificates that act as them) and the audit log, as plain
//! domain types.
//!
//! Changed only by the inputs [`Input::CreateToken`](super::Input),
//! `RevokeToken`, `IssueCertificate`, `RevokeCertificate` and `Audit`;
//! persisted as [`StateRow::Token`] and [`StateRow::Audit`] rows; what the
//! shell's authentication table must learn (after the commit) is listed
//! in [`Effects::access`]. The shell sends these inputs only on a secure
//! server (an insecure one keeps no tokens and no audit log).

use std::collections::{BTreeMap, VecDeque};

use peloton_authz::Grant;

use super::effects::{Effects, StateRow};
use super::{Answer, Error, Lifecycle};

/// A SHA-256 digest (a token's secret, a certificate's DER).
pub type Digest32 = [u8; 32];

/// Most tokens stored.
pub const MAX_TOKENS: usize = 10_000;

/// Client certificates recorded per token (expired ones are dropped when
/// another is issued).
pub const MAX_CERTS_PER_TOKEN: usize = 16;

/// Audit entries kept by default (in memory and in the store): see
/// [`CoreConfig::max_audit_entries`](super::CoreConfig::max_audit_entries).
pub const MAX_AUDIT_ENTRIES: usize = 100_000;

/// A client certificate recorded with a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Certificate {
    /// SHA-256 of its DER.
    pub fingerprint: Digest32,
    /// When it was recorded.
    pub issued_at_ms: u64,
    /// When it expires.
    pub not_after_ms: u64,
}

/// A stored token: never its secret, only the secret's digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    /// Unique name (validated by the shell).
    pub name: String,
    /// What it may do (validated).
    pub grants: Vec<Grant>,
    /// When it was created (set by the core).
    pub created_at_ms: u64,
    /// The token that created it.
    pub created_by: String,
    /// Its secret's digest.
    pub digest: Digest32,
    /// Client certificates that act as it.
    pub certificates: Vec<Certificate>,
}

/// One entry of the audit log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditEntry {
    /// Increasing, never reused (set by the core).
    pub seq: u64,
    /// When (set by the core).
    pub time_ms: u64,
    /// The token's name.
    pub principal: String,
    /// The call.
    pub method: String,
    /// What it named.
    pub target: String,
    /// Its outcome's gRPC code.
    pub code: i32,
    /// The error message of a refused call.
    pub message: String,
}

/// What the shell's authentication table must learn once a commit is
/// durable (before the answers go out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessChange {
    /// A token was created.
    TokenCreated(String),
    /// A token was revoked: its digest and its certificates' fingerprints.
    TokenRevoked {
        /// Its secret's digest.
        digest: Digest32,
        /// Its certificates.
        certificates: Vec<Digest32>,
    },
    /// A certificate now acts as the token of `digest`.
    CertificateIssued {
        /// The certificate.
        fingerprint: Digest32,
        /// Its token's digest.
        digest: Digest32,
        /// When it expires.
        not_after_ms: u64,
    },
    /// Certificates no longer act as their tokens (revoked or expired).
    CertificatesRemoved(Vec<Digest32>),
}

/// Tokens and the audit log.
#[derive(Clone, Debug)]
pub struct AccessState {
    tokens: BTreeMap<String, Token>,
    /// Oldest first, by sequence number.
    audit: VecDeque<AuditEntry>,
    next_seq: u64,
}

impl Default for AccessState {
    fn default() -> Self {
        AccessState {
            tokens: BTreeMap::new(),
            audit: VecDeque::new(),
            // Sequence numbers start at 1 (0 reads as "from the newest").
            next_seq: 1,
        }
    }
}

impl AccessState {
    /// A token by name.
    pub fn token(&self, name: &str) -> Option<&Token> {
        self.tokens.get(name)
    }

    /// Every token, by name.
    pub fn tokens(&self) -> impl Iterator<Item = &Token> + '_ {
        self.tokens.values()
    }

    /// The audit log, newest first.
    pub fn audit_newest_first(&self) -> impl Iterator<Item = &AuditEntry> + '_ {
        self.audit.iter().rev()
    }

    /// An audit entry by sequence number.
    pub fn audit_entry(&self, seq: u64) -> Option<&AuditEntry> {
        let i = self.audit.binary_search_by_key(&seq, |e| e.seq).ok()?;
        self.audit.get(i)
    }
}

impl Lifecycle {
    /// Tokens and the audit log.
    pub fn access(&self) -> &AccessState {
        &self.access
    }

    pub(super) fn create_token(
        &mut self,
        mut token: Token,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let a = &mut self.access;
        if a.tokens.contains_key(&token.name) {
            return Err(Error::AlreadyExists(format!(
                "token {} already exists (revoke it first)",
                token.name
            )));
        }
        if a.tokens.len() >= MAX_TOKENS {
            return Err(Error::Exhausted(format!(
                "{} tokens exist; the limit is {MAX_TOKENS}",
                a.tokens.len()
            )));
        }
        token.created_at_ms = self.now;
        token.certificates.clear();
        let name = token.name.clone();
        a.tokens.insert(name.clone(), token);
        fx.state_rows.push(StateRow::Token(name.as_str().into()));
        fx.access.push(AccessChange::TokenCreated(name));
        Ok(Answer::Done)
    }

    pub(super) fn revoke_token(&mut self, name: &str, fx: &mut Effects) -> Result<Answer, Error> {
        let token = self
            .access
            .tokens
            .remove(name)
            .ok_or_else(|| Error::NotFound(format!("token {name} not found")))?;
        fx.state_rows.push(StateRow::Token(name.into()));
        fx.access.push(AccessChange::TokenRevoked {
            digest: token.digest,
            certificates: token.certificates.iter().map(|c| c.fingerprint).collect(),
        });
        Ok(Answer::Done)
    }

    /// Records a client certificate (signed by the shell) with the token
    /// `name`; its expired certificates go first.
    pub(super) fn issue_certificate(
        &mut self,
        name: &str,
        mut cert: Certificate,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let now = self.now;
        let token = self
            .access
            .tokens
            .get_mut(name)
            .ok_or_else(|| Error::NotFound(format!("token {name} not found")))?;
        let expired: Vec<Digest32> = token
            .certificates
            .iter()
            .filter(|c| c.not_after_ms <= now)
            .map(|c| c.fingerprint)
            .collect();
        if token.certificates.len() - expired.len() >= MAX_CERTS_PER_TOKEN {
            return Err(Error::Exhausted(format!(
                "token {name} has {MAX_CERTS_PER_TOKEN} certificates that have not expired; \
                 revoke one first (RevokeCertificate)"
            )));
        }
        token.certificates.retain(|c| c.not_after_ms > now);
        cert.issued_at_ms = now;
        token.certificates.push(cert.clone());
        if !expired.is_empty() {
            fx.access.push(AccessChange::CertificatesRemoved(expired));
        }
        fx.access.push(AccessChange::CertificateIssued {
            fingerprint: cert.fingerprint,
            digest: token.digest,
            not_after_ms: cert.not_after_ms,
        });
        fx.state_rows.push(StateRow::Token(name.into()));
        Ok(Answer::Done)
    }

    /// Forgets one client certificate of the token `name`.
    pub(super) fn revoke_certificate(
        &mut self,
        name: &str,
        fingerprint: Digest32,
        fx: &mut Effects,
    ) -> Result<Answer, Error> {
        let token = self
            .access
            .tokens
            .get_mut(name)
            .ok_or_else(|| Error::NotFound(format!("token {name} not found")))?;
        let before = token.certificates.len();
        token.certificates.retain(|c| c.fingerprint != fingerprint);
        if token.certificates.len() == before {
            return Err(Error::NotFound(format!(
                "token {name} has no certificate {}",
                hex(&fingerprint)
            )));
        }
        fx.state_rows.push(StateRow::Token(name.into()));
        fx.access
            .push(AccessChange::CertificatesRemoved(vec![fingerprint]));
        Ok(Answer::Done)
    }

    /// Appends an entry to the audit log (its sequence number and time set
    /// here); the oldest beyond the bound go.
    pub(super) fn audit(&mut self, mut entry: AuditEntry, fx: &mut Effects) -> Answer {
        let max = self.config.max_audit_entries;
        let a = &mut self.access;
        entry.seq = a.next_seq;
        entry.time_ms = self.now;
        a.next_seq += 1;
        fx.state_rows.push(StateRow::Audit(entry.seq));
        a.audit.push_back(entry);
        while a.audit.len() > max {
            let old = a.audit.pop_front().expect("not empty");
            fx.state_rows.push(StateRow::Audit(old.seq));
        }
        Answer::Done
    }

    /// Tokens and audit entries as stored (entries beyond the bound go, and
    /// their rows).
    pub(super) fn recover_access(
        &mut self,
        tokens: Vec<Token>,
        mut audit: Vec<AuditEntry>,
        fx: &mut Effects,
    ) {
        let a = &mut self.access;
        a.tokens = tokens.into_iter().map(|t| (t.name.clone(), t)).collect();
        audit.sort_unstable_by_key(|e| e.seq);
        audit.dedup_by_key(|e| e.seq);
        a.next_seq = audit.last().map_or(1, |e| e.seq + 1).max(1);
        a.audit = audit.into();
        while a.audit.len() > self.config.max_audit_entries {
            let old = a.audit.pop_front().expect("not empty");
            fx.state_rows.push(StateRow::Audit(old.seq));
        }
    }

    /// Access's invariants: bounds, names, and an audit log in sequence
    /// order below the next number.
    pub(super) fn check_access_invariants(&self) {
        let a = &self.access;
        assert!(a.tokens.len() <= MAX_TOKENS, "tokens are bounded");
        for (name, t) in &a.tokens {
            assert_eq!(name, &t.name, "token {name} is indexed by its name");
            assert!(
                t.certificates.len() <= MAX_CERTS_PER_TOKEN,
                "token {name}: certificates are bounded"
            );
        }
        assert!(
            a.audit.len() <= self.config.max_audit_entries,
            "the audit log is bounded"
        );
        // (Appends keep the order; the newest pair is checked every step.)
        let n = a.audit.len();
        if n >= 2 {
            assert!(
                a.audit[n - 2].seq < a.audit[n - 1].seq,
                "the audit log is in sequence order"
            );
        }
        assert!(
            a.next_seq >= 1 && a.audit.back().is_none_or(|e| e.seq < a.next_seq),
            "sequence numbers start at 1 and are never reused"
        );
    }
}

/// A digest as lowercase hex (how fingerprints are shown).
pub fn hex(d: &Digest32) -> String {
    use std::fmt::Write as _;
    d.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
