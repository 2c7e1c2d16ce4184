//! The core's own types to and from the API's messages, where the loop
//! reads and writes them: jobs' secrets (the core keeps the values: see
//! `lifecycle::Secret`), tokens and audit entries, agents' run reports
//! and usage reports.

use peloton_proto::v1 as pb;

use peloton_authz::Role;
use tonic::Status;

use crate::access::Digest32;
use crate::convert;
use crate::lifecycle::usage::{RunUsage, UsageReport};
use crate::lifecycle::{AuditEntry, Certificate, RunPhase, RunReport, Secret, Token};

/// Secrets as the core keeps them (names validated by the service).
pub(crate) fn from_pb(secrets: Vec<pb::Secret>) -> Vec<Secret> {
    secrets
        .into_iter()
        .map(|s| Secret {
            name: s.name,
            value: s.value,
        })
        .collect()
}

/// Secrets as messages, with their values (for launches; reads redact
/// them).
pub(crate) fn to_pb(secrets: &[Secret]) -> Vec<pb::Secret> {
    secrets
        .iter()
        .map(|s| pb::Secret {
            name: s.name.clone(),
            value: s.value.clone(),
            size: s.value.len() as u32,
        })
        .collect()
}

/// Secrets as reads show them: names and sizes, never values.
pub(crate) fn redacted(secrets: &[Secret]) -> Vec<pb::Secret> {
    secrets
        .iter()
        .map(|s| pb::Secret {
            name: s.name.clone(),
            value: Vec::new(),
            size: s.value.len() as u32,
        })
        .collect()
}

/// A token as the API lists it.
pub(crate) fn token_to_pb(t: &Token) -> pb::Token {
    pb::Token {
        name: t.name.clone(),
        grants: t
            .grants
            .iter()
            .map(|g| pb::Grant {
                role: match g.role() {
                    Role::Viewer => pb::Role::Viewer,
                    Role::Submitter => pb::Role::Submitter,
                    Role::PoolAdmin => pb::Role::PoolAdmin,
                    Role::ClusterAdmin => pb::Role::ClusterAdmin,
                } as i32,
                pool: g.pool().to_string(),
            })
            .collect(),
        created_at_ms: t.created_at_ms,
        created_by: t.created_by.clone(),
        certificates: t
            .certificates
            .iter()
            .map(|c| pb::TokenCertificate {
                fingerprint: crate::access::hex(&c.fingerprint),
                issued_at_ms: c.issued_at_ms,
                not_after_ms: c.not_after_ms,
            })
            .collect(),
    }
}

/// A token from the API's message (its grants checked again) and its
/// secret's digest; a certificate whose fingerprint does not parse is
/// skipped (it could never authenticate).
pub(crate) fn token_from_pb(t: pb::Token, digest: Digest32) -> Result<Token, Status> {
    let grants = crate::access::grants_from_pb("grants", &t.grants)?;
    let certificates = t
        .certificates
        .iter()
        .filter_map(|c| {
            Some(Certificate {
                fingerprint: crate::access::parse_hex("fingerprint", &c.fingerprint).ok()?,
                issued_at_ms: c.issued_at_ms,
                not_after_ms: c.not_after_ms,
            })
        })
        .collect();
    Ok(Token {
        name: t.name,
        grants,
        created_at_ms: t.created_at_ms,
        created_by: t.created_by,
        digest,
        certificates,
    })
}

/// An audit entry as the API lists it.
pub(crate) fn audit_to_pb(e: &AuditEntry) -> pb::AuditEntry {
    pb::AuditEntry {
        seq: e.seq,
        time_ms: e.time_ms,
        principal: e.principal.clone(),
        method: e.method.clone(),
        target: e.target.clone(),
        code: e.code,
        message: e.message.clone(),
    }
}

/// An audit entry from the API's message.
pub(crate) fn audit_from_pb(e: pb::AuditEntry) -> AuditEntry {
    AuditEntry {
        seq: e.seq,
        time_ms: e.time_ms,
        principal: e.principal,
        method: e.method,
        target: e.target,
        code: e.code,
        message: e.message,
    }
}

/// An agent's report in the core's terms (reports without a key are
/// ignored; its free text is cut to `convert::MAX_AGENT_TEXT_BYTES`).
pub(crate) fn run_report(r: pb::RunReport) -> Option<RunReport> {
    let phase = match r.phase() {
        pb::RunPhase::Unknown => RunPhase::Unknown,
        pb::RunPhase::Starting => RunPhase::Starting,
        pb::RunPhase::Running => RunPhase::Running,
        pb::RunPhase::Succeeded => RunPhase::Succeeded,
        pb::RunPhase::Failed => RunPhase::Failed,
        pb::RunPhase::Killed => RunPhase::Killed,
    };
    let health = convert::health_from_pb(r.health());
    let key = r.key?;
    let mut ports: Vec<(String, u32)> = r.ports.into_iter().collect();
    ports.sort_unstable();
    Some(RunReport {
        key: crate::lifecycle::AgentRunKey {
            job_id: key.job_id.into(),
            instance: key.instance,
            run: key.run_id,
            launch: key.launch_id,
        },
        phase,
        time_ms: r.time_ms,
        exit_code: r.exit_code,
        reason: convert::agent_text(r.reason),
        started_ms: r.started_ms,
        health,
        health_detail: convert::agent_text(r.health_detail),
        ports,
        checkpoint_ms: r.checkpoint_ms,
    })
}

/// An agent's usage report in the core's terms: runs without a key or
/// with a job id out of bounds are left out, and at most
/// `MAX_REPORTS_PER_MESSAGE` runs are taken.
pub(crate) fn usage_report(host: std::sync::Arc<str>, u: pb::AgentUsage) -> UsageReport {
    UsageReport {
        host,
        time_ms: u.time_ms,
        runs: u
            .runs
            .into_iter()
            .take(crate::agent_hub::MAX_REPORTS_PER_MESSAGE)
            .filter_map(|r| {
                let key = r.key?;
                crate::convert::id("usage.runs.key.job_id", &key.job_id).ok()?;
                Some(RunUsage {
                    key: crate::lifecycle::AgentRunKey {
                        job_id: key.job_id.into(),
                        instance: key.instance,
                        run: key.run_id,
                        launch: key.launch_id,
                    },
                    cpu_usec: r.cpu_usec,
                    memory_bytes: r.memory_bytes,
                    disk_bytes: r.disk_bytes,
                })
            })
            .collect(),
    }
}
