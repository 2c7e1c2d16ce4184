//! End to end over real sockets on 127.0.0.1: `tls_incoming` on the server,
//! tokio-rustls clients built with `client_config`.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use peloton_tls::rustls::ClientConfig;
use peloton_tls::rustls::pki_types::ServerName;
use peloton_tls::tokio_rustls::{TlsConnector, client, server};
use peloton_tls::{CertPair, Pki, cert_allows_host, client_config, ensure_local_ca, server_config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::{Stream, StreamExt};

/// Far above any handshake on loopback, far below the 10 s handshake timeout.
const BOUND: Duration = Duration::from_secs(5);

type Incoming = Pin<Box<dyn Stream<Item = std::io::Result<server::TlsStream<TcpStream>>> + Send>>;

struct Server {
    _dir: tempfile::TempDir,
    pki: Pki,
    addr: SocketAddr,
    incoming: Incoming,
}

impl Server {
    async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let pki = ensure_local_ca(dir.path()).unwrap();
        let names = ["localhost", "127.0.0.1", "::1"].map(String::from);
        let pair = pki.ensure_server(&names).unwrap();
        let config = server_config(&pair.cert_pem, &pair.key_pem, Some(&pki.ca_cert_pem)).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = Box::pin(peloton_tls::tls_incoming(listener, config));
        Server {
            _dir: dir,
            pki,
            addr,
            incoming,
        }
    }

    fn client(&self, identity: Option<&CertPair>) -> ClientConfig {
        client_config(&self.pki.ca_cert_pem, identity).unwrap()
    }

    /// The next established stream, which must come within [`BOUND`].
    async fn next(&mut self) -> server::TlsStream<TcpStream> {
        tokio::time::timeout(BOUND, self.incoming.next())
            .await
            .expect("no TLS stream within the bound")
            .expect("the incoming stream ended")
            .expect("tls_incoming yields no errors")
    }
}

async fn connect(
    addr: SocketAddr,
    config: ClientConfig,
) -> std::io::Result<client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// Sends a line from the client and reads it on the server: the stream works.
async fn exchange(
    client: &mut client::TlsStream<TcpStream>,
    server: &mut server::TlsStream<TcpStream>,
) {
    client.write_all(b"ping\n").await.unwrap();
    client.flush().await.unwrap();
    let mut buf = [0; 5];
    server.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping\n");
}

#[tokio::test]
async fn alpn_is_h2_for_grpc_clients_and_http11_for_the_others() {
    let mut server = Server::start().await;

    let mut h2 = connect(server.addr, server.client(None)).await.unwrap();
    let mut theirs = server.next().await;
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(theirs.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    exchange(&mut h2, &mut theirs).await;

    let mut http11_only = server.client(None);
    http11_only.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut http11 = connect(server.addr, http11_only).await.unwrap();
    let mut theirs = server.next().await;
    assert_eq!(http11.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(theirs.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    exchange(&mut http11, &mut theirs).await;
}

#[tokio::test]
async fn a_client_without_a_certificate_is_accepted_without_one() {
    let mut server = Server::start().await;
    let mut client = connect(server.addr, server.client(None)).await.unwrap();
    let mut theirs = server.next().await;
    assert!(theirs.get_ref().1.peer_certificates().is_none());
    exchange(&mut client, &mut theirs).await;
}

#[tokio::test]
async fn a_client_certificate_from_our_ca_names_its_host() {
    let mut server = Server::start().await;
    let identity = server.pki.issue_client("local-1").unwrap();
    let mut client = connect(server.addr, server.client(Some(&identity)))
        .await
        .unwrap();
    let mut theirs = server.next().await;
    let certs = theirs
        .get_ref()
        .1
        .peer_certificates()
        .expect("a client certificate");
    assert!(cert_allows_host(&certs[0], "local-1"));
    assert!(cert_allows_host(&certs[0], "LOCAL-1"));
    assert!(!cert_allows_host(&certs[0], "local-2"));
    exchange(&mut client, &mut theirs).await;
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused() {
    let mut server = Server::start().await;
    let other_dir = tempfile::tempdir().unwrap();
    let impostor = ensure_local_ca(other_dir.path())
        .unwrap()
        .issue_client("local-1")
        .unwrap();

    // With TLS 1.3 the client finishes its side before the server has read
    // its certificate: the refusal arrives as an alert on the first read.
    if let Ok(mut refused) = connect(server.addr, server.client(Some(&impostor))).await {
        let mut buf = [0; 1];
        let read = tokio::time::timeout(BOUND, refused.read(&mut buf))
            .await
            .expect("an answer");
        assert!(matches!(read, Err(_) | Ok(0)), "the impostor read {read:?}");
    }

    // The server yields the next good client, never the impostor.
    let identity = server.pki.issue_client("local-2").unwrap();
    let _client = connect(server.addr, server.client(Some(&identity)))
        .await
        .unwrap();
    let theirs = server.next().await;
    let certs = theirs
        .get_ref()
        .1
        .peer_certificates()
        .expect("a client certificate");
    assert!(cert_allows_host(&certs[0], "local-2"));
}

#[tokio::test]
async fn a_client_that_never_handshakes_blocks_no_one() {
    let mut server = Server::start().await;
    let _silent = TcpStream::connect(server.addr).await.unwrap();
    let mut client = connect(server.addr, server.client(None)).await.unwrap();
    let mut theirs = server.next().await;
    exchange(&mut client, &mut theirs).await;
}

#[tokio::test]
async fn plaintext_http_gets_no_http_answer() {
    let mut server = Server::start().await;
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(BOUND, tcp.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection");
    assert!(
        read.is_err() || !answer.starts_with(b"HTTP/"),
        "answered {answer:?}"
    );

    // And nothing reaches the server's consumer but the next real client.
    let _client = connect(server.addr, server.client(None)).await.unwrap();
    assert!(
        server
            .next()
            .await
            .get_ref()
            .1
            .peer_certificates()
            .is_none()
    );
}

#[tokio::test]
async fn dropping_the_stream_stops_accepting() {
    let server = Server::start().await;
    let addr = server.addr;
    drop(server);
    // The accept loop notices the dropped receiver and closes the listener;
    // connections already queued by the kernel before then may still succeed.
    tokio::time::timeout(BOUND, async {
        while TcpStream::connect(addr).await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the listener is closed");
}
