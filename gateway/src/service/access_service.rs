//! `AccessService`: tokens (created, listed and revoked by a cluster admin)
//! and the audit log.

use peloton_authz::Permission;
use peloton_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::Api;
use crate::access;
use crate::command::{AccessCommand, Command};

/// A token name that may hold certificates: the bootstrap admin's is
/// configuration and has none.
fn check_certificate_name(name: &str) -> Result<(), Status> {
    if name == access::ADMIN {
        return Err(Status::failed_precondition(
            "name: the bootstrap admin token is configuration and holds no certificates; \
             create a cluster-admin token and issue its certificate",
        ));
    }
    access::check_token_name("name", name)
}

#[tonic::async_trait]
impl pb::access_service_server::AccessService for Api {
    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let name = request.get_ref().name.clone();
        let caller = access::require(&request, Permission::TokensAdmin, "/", name)?;
        let r = request.into_inner();
        access::check_token_name("name", &r.name)?;
        if r.grants.is_empty() {
            return Err(crate::convert::invalid(
                "grants",
                "give at least one (role and pool)",
            ));
        }
        let secret = access::new_secret();
        let token = crate::lifecycle::Token {
            name: r.name,
            grants: access::grants_from_pb("grants", &r.grants)?,
            created_at_ms: 0,
            created_by: caller.principal.name().to_owned(),
            digest: access::digest(&secret),
            certificates: Vec::new(),
        };
        let token = self
            .call(|reply| {
                Command::Access(AccessCommand::CreateToken {
                    token: Box::new(token),
                    reply,
                })
            })
            .await?;
        Ok(Response::new(pb::CreateTokenResponse {
            token: Some(token),
            secret,
        }))
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, Status> {
        let name = request.get_ref().name.clone();
        access::require(&request, Permission::TokensAdmin, "/", name.clone())?;
        if name == access::ADMIN {
            return Err(Status::failed_precondition(
                "name: the bootstrap admin token is configuration (DATA_DIR/admin-token or \
                 admin_token); change it there and restart to rotate it",
            ));
        }
        access::check_token_name("name", &name)?;
        self.call(|reply| Command::Access(AccessCommand::RevokeToken { name, reply }))
            .await?;
        Ok(Response::new(pb::RevokeTokenResponse {}))
    }

    async fn issue_certificate(
        &self,
        request: Request<pb::IssueCertificateRequest>,
    ) -> Result<Response<pb::IssueCertificateResponse>, Status> {
        let name = request.get_ref().name.clone();
        access::require(&request, Permission::TokensAdmin, "/", name)?;
        let note = access::note_handle(&request);
        let r = request.into_inner();
        check_certificate_name(&r.name)?;
        if !self.access.is_secure() {
            return Err(Status::failed_precondition(
                "this server is insecure (--insecure): it has no tokens and checks no certificates",
            ));
        }
        let signer = held_signer(self.access.signer())?;
        let days = certificate_days(r.valid_days, peloton_tls::DEFAULT_USER_CERT_DAYS)?;
        // Signing takes a fraction of a millisecond: done here, not in the
        // loop. A certificate the loop does not record is never returned.
        let cert = signer
            .sign_user_csr(&r.name, &r.csr_pem, days)
            .map_err(|e| sign_error(e, "a user"))?;
        let certificate = crate::lifecycle::Certificate {
            fingerprint: access::digest_bytes(&cert.der),
            issued_at_ms: 0,
            not_after_ms: u64::try_from(cert.not_after_unix_s)
                .unwrap_or(0)
                .saturating_mul(1000),
        };
        let certificate = self
            .call(|reply| {
                Command::Access(AccessCommand::IssueCertificate {
                    name: r.name.clone(),
                    certificate,
                    reply,
                })
            })
            .await?;
        if let Some(note) = note {
            note.set(&format!("{} {}", r.name, certificate.fingerprint));
        }
        Ok(Response::new(pb::IssueCertificateResponse {
            certificate_pem: cert.cert_pem,
            ca_pem: signer.ca_cert_pem.clone(),
            certificate: Some(certificate),
        }))
    }

    async fn issue_agent_certificate(
        &self,
        request: Request<pb::IssueAgentCertificateRequest>,
    ) -> Result<Response<pb::IssueAgentCertificateResponse>, Status> {
        let host = request.get_ref().host.clone();
        access::require(&request, Permission::TokensAdmin, "/", host)?;
        let r = request.into_inner();
        // The names a registration may carry, so that the agent can use it.
        if r.host.is_empty() {
            return Err(crate::convert::invalid("host", "must not be empty"));
        }
        crate::convert::id("host", &r.host)?;
        if let Err(problem) = peloton_engine::host::validate_attribute_word(&r.host) {
            return Err(crate::convert::invalid("host", problem));
        }
        if !self.access.is_secure() {
            return Err(Status::failed_precondition(
                "this server is insecure (--insecure): agents need no certificate",
            ));
        }
        let signer = held_signer(self.access.signer())?;
        let days = certificate_days(r.valid_days, peloton_tls::MAX_USER_CERT_DAYS)?;
        let cert = signer
            .sign_agent_csr(&r.host, &r.csr_pem, days)
            .map_err(|e| sign_error(e, "an agent"))?;
        tracing::info!(host = %r.host, "issued an agent certificate");
        Ok(Response::new(pb::IssueAgentCertificateResponse {
            certificate_pem: cert.cert_pem,
            ca_pem: signer.ca_cert_pem.clone(),
            agent_token: self
                .hub
                .as_ref()
                .map(|hub| hub.token().to_owned())
                .unwrap_or_default(),
            not_after_ms: u64::try_from(cert.not_after_unix_s)
                .unwrap_or(0)
                .saturating_mul(1000),
        }))
    }

    async fn revoke_certificate(
        &self,
        request: Request<pb::RevokeCertificateRequest>,
    ) -> Result<Response<pb::RevokeCertificateResponse>, Status> {
        let r = request.get_ref();
        let target = format!("{} {}", r.name, r.fingerprint);
        access::require(&request, Permission::TokensAdmin, "/", target)?;
        let r = request.into_inner();
        check_certificate_name(&r.name)?;
        let fingerprint = access::parse_hex("fingerprint", &r.fingerprint)?;
        self.call(|reply| {
            Command::Access(AccessCommand::RevokeCertificate {
                name: r.name,
                fingerprint,
                reply,
            })
        })
        .await?;
        Ok(Response::new(pb::RevokeCertificateResponse {}))
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        access::require(&request, Permission::TokensAdmin, "/", "")?;
        let tokens = self
            .call(|reply| Command::Access(AccessCommand::ListTokens { reply }))
            .await?;
        Ok(Response::new(pb::ListTokensResponse { tokens }))
    }

    async fn who_am_i(
        &self,
        request: Request<pb::WhoAmIRequest>,
    ) -> Result<Response<pb::WhoAmIResponse>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(pb::WhoAmIResponse {
            token: Some(caller.token.clone()),
        }))
    }

    async fn list_audit(
        &self,
        request: Request<pb::ListAuditRequest>,
    ) -> Result<Response<pb::ListAuditResponse>, Status> {
        access::require(&request, Permission::AuditRead, "/", "")?;
        let request = request.into_inner();
        let out = self
            .call(|reply| Command::Access(AccessCommand::ListAudit { request, reply }))
            .await?;
        Ok(Response::new(out))
    }
}

/// `valid_days` of a certificate request: `default` for 0, at most
/// `MAX_USER_CERT_DAYS`.
fn certificate_days(valid_days: u32, default: u32) -> Result<u32, Status> {
    match valid_days {
        0 => Ok(default),
        d if d > peloton_tls::MAX_USER_CERT_DAYS => Err(crate::convert::invalid(
            "valid_days",
            format!("{d}; at most {}", peloton_tls::MAX_USER_CERT_DAYS),
        )),
        d => Ok(d),
    }
}

/// Why signing `whose` ("a user", "an agent") certificate failed: the
/// request's fault (InvalidArgument on `csr_pem`), or the CA's (logged).
fn sign_error(e: peloton_tls::SignError, whose: &str) -> Status {
    match e {
        peloton_tls::SignError::Request(why) => crate::convert::invalid("csr_pem", why),
        peloton_tls::SignError::Ca(why) => {
            tracing::error!(error = %why, "cannot sign {whose} certificate");
            Status::internal(format!("the server's CA cannot sign: {why}"))
        }
    }
}

/// The server's signer, or why it cannot sign (it lacks its CA's key).
fn held_signer<T>(signer: Option<T>) -> Result<T, Status> {
    signer.ok_or_else(|| {
        Status::failed_precondition(
            "this server does not hold its client CA's key, so it cannot sign certificates \
             (give --tls-client-ca and its key, --tls-client-ca-key, a PKCS#8 PEM file)",
        )
    })
}
