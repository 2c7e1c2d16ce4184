//! The server's accept loop: TCP connections in, TLS streams out, each
//! handshake in its own task so no client can hold up another.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;

/// How long a client has to finish its TLS handshake before it is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in flight at once; beyond it the loop stops accepting (the
/// kernel's backlog holds further clients) until one finishes.
pub const MAX_CONCURRENT_HANDSHAKES: usize = 1024;
/// Established streams waiting for the server to take them.
const ESTABLISHED_QUEUE: usize = 128;
/// After an accept error that is not one connection's (out of file
/// descriptors, say): wait this long rather than spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Accepts TCP connections on `listener` and yields each one whose TLS
/// handshake (with `config`) succeeds, for
/// `tonic::transport::Server::serve_with_incoming_shutdown`.
///
/// Accepted sockets get `TCP_NODELAY` and keepalive probes after 60 s idle.
/// Every handshake runs in its own task, bounded by [`HANDSHAKE_TIMEOUT`];
/// at most [`MAX_CONCURRENT_HANDSHAKES`] run at once. A connection whose
/// handshake fails or times out is dropped (logged at debug). Accept errors
/// are handled here too, so the stream never yields an `Err`; its item is a
/// `Result` because tonic's `serve_with_incoming` wants one.
///
/// The accept loop stops, closing the listener, as soon as the returned
/// stream is dropped.
///
/// # Panics
///
/// Outside a tokio runtime (the accept loop is spawned on the current one).
pub fn tls_incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, io::Error>> + Send + 'static {
    let (established, stream) = mpsc::channel(ESTABLISHED_QUEUE);
    tokio::spawn(accept_loop(
        listener,
        TlsAcceptor::from(config),
        established,
    ));
    ReceiverStream::new(stream)
}

type Established = mpsc::Sender<Result<TlsStream<TcpStream>, io::Error>>;

async fn accept_loop(listener: TcpListener, acceptor: TlsAcceptor, established: Established) {
    let handshakes = Arc::new(Semaphore::new(MAX_CONCURRENT_HANDSHAKES));
    loop {
        // Every wait also watches the receiver, so dropping the stream ends
        // the loop (and closes the listener) at once, even while it waits.
        let permit = tokio::select! {
            () = established.closed() => return,
            permit = handshakes.clone().acquire_owned() => {
                permit.expect("the handshake semaphore is never closed")
            }
        };
        let accepted = tokio::select! {
            () = established.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if is_one_connections(&e) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a TCP connection failed");
                tokio::select! {
                    () = established.closed() => return,
                    () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => continue,
                }
            }
        };
        configure_socket(&tcp, peer);
        let acceptor = acceptor.clone();
        let established = established.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                // Fails only when the stream is gone: the connection is dropped.
                Ok(Ok(tls)) => drop(established.send(Ok(tls)).await),
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
            // Held until the stream is handed over, so a slow consumer slows
            // accepting rather than piling up finished handshakes.
            drop(permit);
        });
    }
}

/// Accept errors about the one connection being accepted, after which the
/// next accept may succeed at once.
fn is_one_connections(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

fn configure_socket(tcp: &TcpStream, peer: SocketAddr) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE);
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive) {
        tracing::debug!(%peer, error = %e, "could not set TCP keepalive");
    }
}
