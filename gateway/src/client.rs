//! Connecting to a server as its own tools do (the demo, local tests): over
//! TLS with the server's private CA when it is secure, with a bearer token.

use std::path::Path;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::config::Config;

/// Adds `authorization: Bearer <token>` to every call (nothing without a
/// token).
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Bearer(<token>)"
        } else {
            "Bearer(none)"
        })
    }
}

impl Bearer {
    /// Sends `token` (none: no header).
    pub fn new(token: Option<&str>) -> anyhow::Result<Bearer> {
        let value = match token {
            Some(t) => Some(
                format!("Bearer {}", t.trim())
                    .parse()
                    .map_err(|_| anyhow::anyhow!("the token is not printable ASCII"))?,
            ),
            None => None,
        };
        Ok(Bearer(value))
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// A channel with its token.
pub type Authed = InterceptedService<Channel, Bearer>;

/// The URL of a server listening at `addr` (`https` when secure).
pub fn url(secure: bool, addr: std::net::SocketAddr) -> String {
    let scheme = if secure { "https" } else { "http" };
    format!("{scheme}://{addr}")
}

/// An endpoint for `url`, trusting the CA in `ca_file` for https.
pub fn endpoint(url: &str, ca_file: Option<&Path>) -> anyhow::Result<Endpoint> {
    let e = Endpoint::from_shared(url.to_owned())?;
    if !url.starts_with("https://") {
        return Ok(e);
    }
    let ca_file =
        ca_file.ok_or_else(|| anyhow::anyhow!("{url}: an https server needs its CA file"))?;
    let ca = std::fs::read_to_string(ca_file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", ca_file.display()))?;
    Ok(e.tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))?)
}

/// Connects to this process's own server at `addr` as its admin: TLS with
/// the private CA in `DATA_DIR/tls` and the bootstrap token, when secure.
pub async fn connect_local(config: &Config, addr: std::net::SocketAddr) -> anyhow::Result<Authed> {
    let ca = config.data_dir.join("tls").join("ca.pem");
    let channel = endpoint(&url(config.secure, addr), Some(&ca))?
        .connect()
        .await?;
    let token = if config.secure {
        Some(config.resolve_admin_token()?)
    } else {
        None
    };
    Ok(InterceptedService::new(
        channel,
        Bearer::new(token.as_deref())?,
    ))
}
