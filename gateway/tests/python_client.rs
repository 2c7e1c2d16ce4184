//! A client in another language: `examples/python/client.py` (grpcio)
//! against a real secure server, with the CA file and a token, as the
//! docs/access.md shows. It fails, never skips, without python3 and grpcio (CI
//! installs them).

mod common;

use common::*;
use peloton_proto::v1 as pb;

/// Runs the example client against `addr` with `token`.
async fn run_client(addr: std::net::SocketAddr, token: &str) -> (bool, String) {
    run_client_with(addr, &[("PELOTON_TOKEN", token)]).await
}

/// Runs the example client against `addr` with `env` (its credentials).
async fn run_client_with(addr: std::net::SocketAddr, env: &[(&str, &str)]) -> (bool, String) {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/python/client.py");
    let mut command = tokio::process::Command::new("python3");
    command
        .arg(script)
        .arg(addr.to_string())
        .env("PELOTON_CA_FILE", &peloton_tls::testkit::shared().ca_file);
    for var in [
        "PELOTON_TOKEN",
        "PELOTON_TOKEN_FILE",
        "PELOTON_CERT_FILE",
        "PELOTON_KEY_FILE",
    ] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    let out = within("the Python client", command.output())
        .await
        .expect("python3 runs (install python3 and `pip install grpcio grpcio-tools`)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_client_connects_with_the_ca_file_and_a_token() {
    let mut s = TestServer::start(2).await;
    let addr = s.server.as_ref().expect("running").addr;
    create_pool(&mut s.clients, "/a", pool_spec(1.0, 1024.0)).await;
    create_pool(&mut s.clients, "/b", pool_spec(1.0, 1024.0)).await;

    // The admin sees every pool and the audit log.
    let (ok, text) = run_client(addr, ADMIN_TOKEN).await;
    assert!(ok, "{text}");
    assert!(
        text.contains("whoami: admin (ROLE_CLUSTER_ADMIN on /)"),
        "{text}"
    );
    assert!(text.contains("pools: / /a /b"), "{text}");
    assert!(
        text.contains("admin /peloton.v1.ResourcePoolService/Create /b code=0"),
        "{text}"
    );

    // A viewer of /a sees /a only, and is refused the audit log.
    let mut access = pb::access_service_client::AccessServiceClient::new(admin_channel(addr).await);
    let secret = access
        .create_token(pb::CreateTokenRequest {
            name: "py-viewer".into(),
            grants: vec![pb::Grant {
                role: pb::Role::Viewer as i32,
                pool: "/a".into(),
            }],
        })
        .await
        .expect("create a token")
        .into_inner()
        .secret;
    let (ok, text) = run_client(addr, &secret).await;
    assert!(ok, "{text}");
    assert!(
        text.contains("whoami: py-viewer (ROLE_VIEWER on /a)"),
        "{text}"
    );
    assert!(text.contains("pools: /a\n"), "{text}");
    assert!(
        text.contains("audit: PERMISSION_DENIED: py-viewer lacks permission audit.read"),
        "{text}"
    );

    // A made-up token is refused.
    let (ok, text) = run_client(addr, "pel_not_a_token").await;
    assert!(!ok, "{text}");
    assert!(text.contains("UNAUTHENTICATED"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_client_connects_with_a_client_certificate() {
    // A server that may sign user certificates with the tests' CA.
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = peloton_tls::testkit::shared();
    let config = peloton_gateway::config::Config {
        tls_client_ca_key: Some(pki.pki.dir.join("ca.key")),
        ..config(dir.path(), 1)
    };
    let server = within("start", peloton_gateway::server::start(&config))
        .await
        .expect("starts");
    let mut access =
        pb::access_service_client::AccessServiceClient::new(admin_channel(server.addr).await);
    access
        .create_token(pb::CreateTokenRequest {
            name: "py-cert".into(),
            grants: vec![pb::Grant {
                role: pb::Role::Viewer as i32,
                pool: "/".into(),
            }],
        })
        .await
        .expect("create a token");
    let csr = peloton_tls::user_csr("py-cert").expect("a request");
    let issued = access
        .issue_certificate(pb::IssueCertificateRequest {
            name: "py-cert".into(),
            csr_pem: csr.csr_pem,
            valid_days: 1,
        })
        .await
        .expect("issue")
        .into_inner();
    let (cert, key) = (dir.path().join("py.pem"), dir.path().join("py.key"));
    std::fs::write(&cert, &issued.certificate_pem).expect("write");
    std::fs::write(&key, &csr.key_pem).expect("write");
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());

    // No token: the certificate is the client's identity.
    let (ok, text) = run_client_with(
        server.addr,
        &[("PELOTON_CERT_FILE", cert), ("PELOTON_KEY_FILE", key)],
    )
    .await;
    assert!(ok, "{text}");
    assert!(
        text.contains("whoami: py-cert (ROLE_VIEWER on /)"),
        "{text}"
    );
    // Revoked with its token: refused.
    access
        .revoke_token(pb::RevokeTokenRequest {
            name: "py-cert".into(),
        })
        .await
        .expect("revoke");
    let (ok, text) = run_client_with(
        server.addr,
        &[("PELOTON_CERT_FILE", cert), ("PELOTON_KEY_FILE", key)],
    )
    .await;
    assert!(!ok, "{text}");
    assert!(text.contains("UNAUTHENTICATED"), "{text}");
    within("shutdown", server.shutdown())
        .await
        .expect("shutdown");
}
