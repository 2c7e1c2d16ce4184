//! [`LeaderChannel`]: the channel under every command's client. It connects
//! to the first `--server` address that accepts, and follows the leader:
//! a call refused by a standby (`not the leader`) is sent again to the
//! leader it names, or to the next address; so is a call that could not be
//! sent, and a read whose connection broke. The decisions are
//! [`crate::servers::Route`]'s; this module only sends.
//!
//! Each request's body is kept until its answer has come (a few KiB of
//! protobuf; at most [`crate::MAX_MESSAGE_BYTES`]), so that it can be sent
//! again. A refusal is recognised in the answer's headers: a server's
//! refusal carries no body (gRPC's trailers-only answer), which is how
//! tonic answers any error returned before a response starts.
//!
//! The connection's [`Security`] goes with every call and every retry:
//! TLS to `https://` servers (trusting the configured CA) and the bearer
//! token, set as the `authorization` header of each request it sends.

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Bytes, Service, StdError, http};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::error::ConnectError;
use crate::servers::{self, Failure, Route, Scheme};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A gRPC channel to whichever of the servers leads.
#[derive(Debug, Clone)]
pub struct LeaderChannel {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    servers: Vec<String>,
    security: Security,
    /// Where calls go first: the server that took the last one.
    current: Mutex<(String, Channel)>,
}

/// How calls are secured: the CA that `https://` servers' certificates
/// must chain to, and the bearer token sent with every call.
#[derive(Clone, Default)]
pub struct Security {
    /// The CA certificate (PEM) and the file it came from; none: `https://`
    /// servers cannot be reached.
    pub ca: Option<(Certificate, String)>,
    /// A client certificate and key presented to `https://` servers, and
    /// the certificate's file.
    pub identity: Option<(Identity, String)>,
    /// `Bearer <token>`, marked sensitive; none: no `authorization` header.
    pub authorization: Option<http::HeaderValue>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Security")
            .field("ca_file", &self.ca.as_ref().map(|(_, file)| file))
            .field("cert_file", &self.identity.as_ref().map(|(_, file)| file))
            .field("token", &self.authorization.as_ref().map(|_| "<token>"))
            .finish()
    }
}

impl Security {
    /// The scheme assumed for an address without one: `https://` once a CA
    /// is configured.
    pub fn scheme(&self) -> Scheme {
        if self.ca.is_some() {
            Scheme::Https
        } else {
            Scheme::Http
        }
    }

    /// `authorization: Bearer <token>` from now on. The token must be
    /// printable ASCII (no blanks), as an HTTP header value.
    pub fn with_token(mut self, token: &str) -> Result<Security, String> {
        if token.is_empty() {
            return Err("the token is empty".to_owned());
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "the token is not printable ASCII (no blanks or control characters)".to_owned(),
            );
        }
        let mut value = http::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| "the token is not printable ASCII".to_owned())?;
        value.set_sensitive(true);
        self.authorization = Some(value);
        Ok(self)
    }
}

impl LeaderChannel {
    /// Connects to the first of `servers` (URIs) that accepts a connection,
    /// without a CA or a token (`http://` servers of an insecure cluster).
    pub async fn connect(servers: Vec<String>) -> Result<LeaderChannel, ConnectError> {
        LeaderChannel::connect_with(servers, Security::default()).await
    }

    /// Connects to the first of `servers` (URIs) that accepts a connection;
    /// every call goes with `security`.
    pub async fn connect_with(
        servers: Vec<String>,
        security: Security,
    ) -> Result<LeaderChannel, ConnectError> {
        assert!(!servers.is_empty(), "at least one server");
        let mut failures = Vec::new();
        for server in &servers {
            match connect(server, &security).await {
                Ok(channel) => {
                    let current = Mutex::new((server.clone(), channel));
                    let shared = Arc::new(Shared {
                        servers,
                        security,
                        current,
                    });
                    return Ok(LeaderChannel { shared });
                }
                Err(source) => failures.push((server.clone(), source)),
            }
        }
        Err(ConnectError { failures })
    }
}

async fn connect(uri: &str, security: &Security) -> Result<Channel, StdError> {
    let mut endpoint = Endpoint::from_shared(uri.to_owned())?.connect_timeout(CONNECT_TIMEOUT);
    if uri.starts_with("https://") {
        let Some((ca, _)) = &security.ca else {
            return Err(crate::error::UsageError(no_ca_file(uri)).into());
        };
        let mut tls = ClientTlsConfig::new().ca_certificate(ca.clone());
        if let Some((identity, _)) = &security.identity {
            tls = tls.identity(identity.clone());
        }
        endpoint = endpoint.tls_config(tls)?;
    }
    Ok(endpoint.connect().await?)
}

/// After a connection to an `http://` server broke: a secure server
/// serves TLS only, which a plain-text HTTP/2 client hears as a broken
/// connection.
fn tls_hint(server: &str) -> &'static str {
    if server.starts_with("http://") {
        "; if the server is secure (TLS only), give its address as https:// with its CA file \
         (--ca-file)"
    } else {
        ""
    }
}

/// Why an `https://` server cannot be reached without a CA file, naming the
/// three ways to give one.
pub fn no_ca_file(uri: &str) -> String {
    format!(
        "{uri}: an https:// server needs the CA certificate its certificate is signed \
         with: give it with --ca-file FILE, the PELOTON_CA_FILE environment variable or \
         `ca_file:` in the config file"
    )
}

impl Service<http::Request<Body>> for LeaderChannel {
    type Response = http::Response<Body>;
    type Error = StdError;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each call waits for the channel it picks.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move { shared.call(request).await })
    }
}

impl Shared {
    fn current(&self) -> (String, Channel) {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn call(&self, request: http::Request<Body>) -> Result<http::Response<Body>, StdError> {
        let (mut parts, body) = request.into_parts();
        // Every try below sends these headers.
        if let Some(authorization) = &self.security.authorization {
            parts
                .headers
                .insert(http::header::AUTHORIZATION, authorization.clone());
        }
        let body = Limited::new(body, crate::MAX_MESSAGE_BYTES)
            .collect()
            .await
            .map_err(|err| Status::internal(format!("reading the request to send: {err}")))?
            .to_bytes();
        let read = servers::is_read(parts.uri.path());
        let (mut server, mut channel) = self.current();
        let mut route = Route::new(&self.servers, &server, read);
        // A server that has just taken the lead answers `starting` while it
        // recovers (the call was not applied): wait for it, a while.
        let starting_until = std::time::Instant::now() + servers::STARTING_PATIENCE;
        let mut refused_by_standby = false;
        loop {
            let (mut failure, mut said) = match send(&mut channel, &parts, body.clone()).await {
                Ok(response) => {
                    let status = Status::from_header_map(response.headers());
                    if status.as_ref().is_some_and(servers::is_starting)
                        && std::time::Instant::now() < starting_until
                    {
                        tokio::time::sleep(servers::STARTING_RETRY).await;
                        continue;
                    }
                    let refusal = status
                        .and_then(|status| servers::not_leader(&status, self.security.scheme()));
                    match refusal {
                        None => {
                            *self.current.lock().unwrap_or_else(PoisonError::into_inner) =
                                (server, channel);
                            return Ok(response);
                        }
                        Some(refusal) => (
                            Failure::NotLeader {
                                leader: refusal.leader,
                            },
                            refusal.message,
                        ),
                    }
                }
                Err(err) if never_sent(&*err) => (
                    Failure::Unreachable,
                    format!("cannot connect: {}", root_cause(&*err)),
                ),
                // It may have been applied: not tried again.
                Err(err) if !read => {
                    return Err(Status::unavailable(format!(
                        "{server}: connection lost: {} (the call may have been applied){}",
                        root_cause(&*err),
                        tls_hint(&server)
                    ))
                    .into());
                }
                Err(err) => (
                    Failure::Broken,
                    format!(
                        "connection lost: {}{}",
                        root_cause(&*err),
                        tls_hint(&server)
                    ),
                ),
            };
            if matches!(failure, Failure::NotLeader { .. }) {
                refused_by_standby = true;
            }
            loop {
                let Some(next) = route.next(&failure, said) else {
                    // Every server tried, and some standby answered: the
                    // lead is changing hands (the leader died and the lease
                    // has not expired yet). Start over, a while.
                    if refused_by_standby && std::time::Instant::now() < starting_until {
                        tokio::time::sleep(servers::STARTING_RETRY).await;
                        route = Route::new(&self.servers, &self.servers[0], read);
                        failure = Failure::Unreachable;
                        refused_by_standby = false;
                        server = self.servers[0].clone();
                        match connect(&server, &self.security).await {
                            Ok(connected) => {
                                channel = connected;
                                break;
                            }
                            Err(err) => {
                                said = format!("cannot connect: {}", root_cause(&*err));
                                continue;
                            }
                        }
                    }
                    return Err(route.give_up().into());
                };
                let next = next.to_owned();
                match connect(&next, &self.security).await {
                    Ok(connected) => {
                        server = next;
                        channel = connected;
                        break;
                    }
                    Err(err) => {
                        failure = Failure::Unreachable;
                        said = format!("cannot connect: {}", root_cause(&*err));
                    }
                }
            }
        }
    }
}

/// Sends a copy of the request (`parts` and `body`) on `channel`.
async fn send(
    channel: &mut Channel,
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<http::Response<Body>, StdError> {
    std::future::poll_fn(|cx| channel.poll_ready(cx)).await?;
    let mut request = http::Request::new(Body::new(Full::new(body)));
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    *request.extensions_mut() = parts.extensions.clone();
    Ok(channel.call(request).await?)
}

/// Whether the call failed before it was sent: the channel could not
/// (re)connect.
fn never_sent(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if err.is::<tonic::ConnectError>() {
            return true;
        }
        cause = err.source();
    }
    false
}

/// The last error of the chain: tonic's own ("transport error") says little,
/// the bottom one ("Connection refused") is the news.
pub fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last = err;
    while let Some(source) = last.source() {
        last = source;
    }
    last.to_string()
}
