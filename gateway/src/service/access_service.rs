//! `AccessService`: tokens (created, listed and revoked by a cluster admin)
//! and the audit log.

use peloton_authz::Permission;
use peloton_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::Api;
use crate::access;
use crate::scheduler::Command;

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
        access::grants_from_pb("grants", &r.grants)?;
        let secret = access::new_secret();
        let token = pb::Token {
            name: r.name,
            grants: r.grants,
            created_at_ms: 0,
            created_by: caller.principal.name().to_owned(),
        };
        let digest = access::digest(&secret);
        let token = self
            .call(|reply| Command::CreateToken {
                token,
                digest,
                reply,
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
        self.call(|reply| Command::RevokeToken { name, reply })
            .await?;
        Ok(Response::new(pb::RevokeTokenResponse {}))
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        access::require(&request, Permission::TokensAdmin, "/", "")?;
        let tokens = self.call(|reply| Command::ListTokens { reply }).await?;
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
            .call(|reply| Command::ListAudit { request, reply })
            .await?;
        Ok(Response::new(out))
    }
}
