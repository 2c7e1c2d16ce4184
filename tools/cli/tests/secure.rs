//! The `peloton` binary against a real secure server (TLS with its private
//! CA, bearer tokens, roles on pool subtrees, the audit log): the CA file
//! and the token from the environment or a config file, tokens created,
//! used, refused and revoked, and the audit log of what a token tried.

use std::path::{Path, PathBuf};
use std::process::Output;

use peloton_gateway::config::Config;
use serde_json::Value;

const ADMIN: &str = "pel_cli_test_admin_token_0123";

/// Every variable the CLI reads, cleared for each run so that the
/// developer's own settings never leak in.
const CLI_VARS: &[&str] = &[
    "PELOTON_SERVER",
    "PELOTON_CA_FILE",
    "PELOTON_CONFIG",
    "PELOTON_TOKEN",
    "PELOTON_TOKEN_FILE",
    "PELOTON_CERT_FILE",
    "PELOTON_KEY_FILE",
];

/// A secure server and where its CLI runs.
struct Cluster {
    _server: peloton_gateway::server::Server,
    dir: tempfile::TempDir,
    url: String,
    ca: PathBuf,
}

impl Cluster {
    async fn start() -> Cluster {
        Cluster::start_with(4).await
    }

    /// With `sim_hosts` simulated hosts; none: it takes real agents.
    async fn start_with(sim_hosts: u32) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("data");
        let server = peloton_gateway::server::start(&Config {
            secure: true,
            admin_token: Some(ADMIN.into()),
            data_dir: data_dir.clone(),
            listen: "127.0.0.1:0".parse().unwrap(),
            metrics_listen: None,
            sim_hosts,
            cycle_interval_ms: 5,
            ..Config::default()
        })
        .await
        .unwrap();
        std::fs::create_dir(dir.path().join("home")).unwrap();
        Cluster {
            url: format!("https://{}", server.addr),
            ca: data_dir.join("tls").join("ca.pem"),
            _server: server,
            dir,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CLI with only `env` set of its variables (HOME and
    /// XDG_CONFIG_HOME point into the test's directory).
    async fn run(&self, env: &[(&str, &str)], args: &[&str]) -> Output {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_peloton"));
        for var in CLI_VARS {
            cmd.env_remove(var);
        }
        cmd.env("HOME", self.path("home"))
            .env("XDG_CONFIG_HOME", self.path("home/.config"));
        for (name, value) in env {
            cmd.env(name, value);
        }
        cmd.args(args).output().await.expect("the CLI runs")
    }

    /// The CLI with the server, its CA and `token` in the environment.
    async fn as_token(&self, token: &str, args: &[&str]) -> Output {
        let ca = self.ca.to_str().unwrap();
        self.run(
            &[
                ("PELOTON_SERVER", &self.url),
                ("PELOTON_CA_FILE", ca),
                ("PELOTON_TOKEN", token),
            ],
            args,
        )
        .await
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[track_caller]
fn json(out: &Output) -> Value {
    let stdout = ok(out);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// Fails with `code` and a message on stderr containing each of `wanted`.
#[track_caller]
fn fails(out: &Output, code: i32, wanted: &[&str]) {
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}{stderr}",
        text(&out.stdout)
    );
    for w in wanted {
        assert!(stderr.contains(w), "{w:?} not in: {stderr}");
    }
}

fn write(path: &Path, content: &str) {
    std::fs::write(path, content).unwrap();
}

#[cfg(unix)]
fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_roles_config_files_and_the_audit_log() {
    let c = Cluster::start().await;
    let pools = c.path("pools.yaml");
    write(
        &pools,
        "pools:\n  - {path: /a, reservation: {cpu: 1, memory_mb: 1024}}\n  - {path: /b, reservation: {cpu: 1, memory_mb: 1024}}\n",
    );
    let job = c.path("job.yaml");
    write(
        &job,
        "name: hi\npool: /a\ninstances: 1\n\
         task: {command: /bin/true, resources: {cpu: 0.1, memory_mb: 32}, \
         sim: {duration_ms: 10, exit_code: 0}}\n",
    );
    let pools = pools.to_str().unwrap();
    let job = job.to_str().unwrap();

    // The admin (the bootstrap token) creates pools and a job.
    ok(&c.as_token(ADMIN, &["respool", "create", pools]).await);
    let created = json(
        &c.as_token(ADMIN, &["-o", "json", "job", "create", job])
            .await,
    );
    assert!(created["job"]["id"].as_str().is_some(), "{created}");
    let me = json(&c.as_token(ADMIN, &["-o", "json", "whoami"]).await);
    assert_eq!(me["token"]["name"], "admin", "{me}");
    assert_eq!(me["token"]["grants"][0]["role"], "cluster-admin", "{me}");

    // A token for alice: the secret once, with the note.
    let out = c
        .as_token(
            ADMIN,
            &[
                "-o",
                "json",
                "token",
                "create",
                "alice",
                "--grant",
                "submitter:/a",
            ],
        )
        .await;
    let alice = json(&out);
    assert!(
        text(&out.stderr).contains("not shown again"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(alice["token"]["name"], "alice");
    assert_eq!(alice["token"]["grants"][0]["role"], "submitter");
    assert_eq!(alice["token"]["grants"][0]["pool"], "/a");
    let secret = alice["secret"].as_str().expect("a secret").to_owned();
    assert!(!secret.is_empty());
    // In a table too.
    let out = c
        .as_token(ADMIN, &["token", "create", "bob", "--grant", "VIEWER:/b"])
        .await;
    let table = ok(&out);
    assert!(table.starts_with("created token bob\n"), "{table}");
    assert!(
        table.contains("viewer:/b") && table.contains("SECRET: "),
        "{table}"
    );
    let listed = ok(&c.as_token(ADMIN, &["token", "list"]).await);
    assert!(
        listed.contains("alice  submitter:/a") && listed.contains("bob    viewer:/b"),
        "{listed}"
    );
    assert!(!listed.contains(&secret), "{listed}");

    // Alice: who she is, what she may do, what not.
    let who = ok(&c.as_token(&secret, &["whoami"]).await);
    assert!(
        who.contains("alice") && who.contains("submitter:/a"),
        "{who}"
    );
    ok(&c.as_token(&secret, &["job", "create", "/a", job]).await);
    fails(
        &c.as_token(&secret, &["job", "create", "/b", job]).await,
        1,
        &["permission denied", "jobs.write", "/b"],
    );
    fails(
        &c.as_token(&secret, &["token", "list"]).await,
        1,
        &["permission denied", "alice"],
    );

    // Alice's token from a config file: its CA and token file relative to
    // it; an address without a scheme is https:// once a CA is configured.
    let cfg_dir = c.path("cfg");
    std::fs::create_dir(&cfg_dir).unwrap();
    std::fs::copy(&c.ca, cfg_dir.join("ca.pem")).unwrap();
    write(&cfg_dir.join("alice.token"), &format!("{secret}\n"));
    let addr = c.url.strip_prefix("https://").unwrap();
    let config = cfg_dir.join("config.yaml");
    write(
        &config,
        &format!("server: {addr}\nca_file: ca.pem\ntoken_file: alice.token\n"),
    );
    let config = config.to_str().unwrap();
    let out = c
        .run(&[("PELOTON_CONFIG", config)], &["-o", "json", "whoami"])
        .await;
    assert_eq!(json(&out)["token"]["name"], "alice");
    // --config too; the environment's token beats the file's.
    let out = c
        .run(
            &[("PELOTON_TOKEN", ADMIN)],
            &["--config", config, "-o", "json", "whoami"],
        )
        .await;
    assert_eq!(json(&out)["token"]["name"], "admin");
    // The default file, holding `token:`: a warning while others may read it.
    let default_dir = c.path("home/.config/peloton");
    std::fs::create_dir_all(&default_dir).unwrap();
    let default_file = default_dir.join("config.yaml");
    write(
        &default_file,
        &format!(
            "server: {addr}\nca_file: {}\ntoken: {ADMIN}\n",
            c.ca.display()
        ),
    );
    #[cfg(unix)]
    {
        chmod(&default_file, 0o644);
        let out = c.run(&[], &["whoami"]).await;
        assert!(ok(&out).contains("admin"));
        assert!(
            text(&out.stderr).contains("warning") && text(&out.stderr).contains("chmod 600"),
            "{}",
            text(&out.stderr)
        );
        chmod(&default_file, 0o600);
    }
    let out = c.run(&[], &["whoami"]).await;
    assert!(ok(&out).contains("admin"));
    assert_eq!(text(&out.stderr), "");
    // An unknown key is refused, naming it and the file.
    write(&default_file, "server: x:1\ntokens: abc\n");
    fails(
        &c.run(&[], &["whoami"]).await,
        2,
        &["unknown key `tokens`", "config.yaml"],
    );
    std::fs::remove_file(&default_file).unwrap();

    // No token: unauthenticated (exit 1).
    let ca = c.ca.to_str().unwrap();
    fails(
        &c.run(
            &[("PELOTON_SERVER", &c.url), ("PELOTON_CA_FILE", ca)],
            &["job", "query"],
        )
        .await,
        1,
        &["unauthenticated", "no token"],
    );
    // An https:// server without a CA file: a usage error naming the ways
    // to give one.
    fails(
        &c.run(
            &[("PELOTON_SERVER", &c.url), ("PELOTON_TOKEN", ADMIN)],
            &["whoami"],
        )
        .await,
        2,
        &["--ca-file", "PELOTON_CA_FILE", "ca_file"],
    );
    // A token that is not printable ASCII: a usage error.
    fails(
        &c.as_token("tok en", &["whoami"]).await,
        2,
        &["PELOTON_TOKEN", "not printable ASCII"],
    );
    // A file holding no certificate is a usage error; a CA that did not
    // sign the server's certificate cannot connect (exit 1).
    let junk = c.path("junk.pem");
    write(&junk, "not a certificate\n");
    let admin_at_url = [("PELOTON_SERVER", c.url.as_str()), ("PELOTON_TOKEN", ADMIN)];
    fails(
        &c.run(
            &admin_at_url,
            &["--ca-file", junk.to_str().unwrap(), "whoami"],
        )
        .await,
        2,
        &["no PEM certificate"],
    );
    peloton_tls::ensure_local_ca(&c.path("other-ca")).unwrap();
    let other = c.path("other-ca/ca.pem");
    fails(
        &c.run(
            &admin_at_url,
            &["--ca-file", other.to_str().unwrap(), "whoami"],
        )
        .await,
        1,
        &["cannot connect", &c.url],
    );
    // The flag beats PELOTON_CA_FILE.
    let with_env_ca = [
        ("PELOTON_SERVER", c.url.as_str()),
        ("PELOTON_TOKEN", ADMIN),
        ("PELOTON_CA_FILE", other.to_str().unwrap()),
    ];
    ok(&c.run(&with_env_ca, &["--ca-file", ca, "whoami"]).await);

    // Revoked: alice's next call is refused.
    let out = ok(&c.as_token(ADMIN, &["token", "revoke", "alice"]).await);
    assert_eq!(out.trim(), "revoked token alice");
    fails(
        &c.as_token(&secret, &["whoami"]).await,
        1,
        &["unauthenticated", "not valid"],
    );
    let listed = ok(&c.as_token(ADMIN, &["token", "list"]).await);
    assert!(!listed.contains("alice"), "{listed}");

    // The audit log: alice's attempts, newest first.
    let audit = json(
        &c.as_token(ADMIN, &["-o", "json", "audit", "--principal", "alice"])
            .await,
    );
    let entries = audit["entries"].as_array().expect("entries");
    let creates: Vec<(i64, &str)> = entries
        .iter()
        .filter(|e| e["method"] == "/peloton.v1.JobService/Create")
        .map(|e| (e["code"].as_i64().unwrap(), e["message"].as_str().unwrap()))
        .collect();
    assert_eq!(creates.len(), 2, "{audit}");
    // Newest first: refused in /b (PERMISSION_DENIED), then allowed in /a.
    assert_eq!(creates[0].0, 7, "{audit}");
    assert!(creates[0].1.contains("jobs.write"), "{audit}");
    assert_eq!(creates[1].0, 0, "{audit}");
    assert!(entries.iter().all(|e| e["principal"] == "alice"), "{audit}");
    let seqs: Vec<u64> = entries.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] > w[1]), "{seqs:?}");
    let table = ok(&c.as_token(ADMIN, &["audit", "--principal", "alice"]).await);
    let header = table.lines().next().unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "SEQ",
            "TIME",
            "PRINCIPAL",
            "METHOD",
            "TARGET",
            "CODE",
            "MESSAGE"
        ],
        "{table}"
    );
    assert!(
        table.contains("JobService/Create") && table.contains("permission_denied"),
        "{table}"
    );
    // --limit and --before page through it.
    let one = json(
        &c.as_token(ADMIN, &["-o", "json", "audit", "--limit", "1"])
            .await,
    );
    let newest = one["entries"][0]["seq"].as_u64().unwrap();
    assert_eq!(one["entries"].as_array().unwrap().len(), 1, "{one}");
    let before = json(
        &c.as_token(
            ADMIN,
            &["-o", "json", "audit", "--before", &newest.to_string()],
        )
        .await,
    );
    let before = before["entries"].as_array().unwrap();
    assert!(!before.is_empty());
    assert!(before.iter().all(|e| e["seq"].as_u64().unwrap() < newest));
    // Only cluster admins read it.
    let bob = c
        .as_token(
            ADMIN,
            &[
                "-o", "json", "token", "create", "carol", "--grant", "viewer:/",
            ],
        )
        .await;
    let carol = json(&bob)["secret"].as_str().unwrap().to_owned();
    fails(
        &c.as_token(&carol, &["audit"]).await,
        1,
        &["permission denied"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insecure_server_still_works_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let server = peloton_gateway::server::start(&Config {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: None,
        sim_hosts: 1,
        cycle_interval_ms: 5,
        secure: false,
        ..Config::default()
    })
    .await
    .unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_peloton"));
    for var in CLI_VARS {
        cmd.env_remove(var);
    }
    // A scheme-less address is http:// without a CA; a token is sent and
    // ignored.
    let out = cmd
        .env("HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path())
        .env("PELOTON_TOKEN", "whatever")
        .args(["--server", &server.addr.to_string(), "-o", "json", "whoami"])
        .output()
        .await
        .unwrap();
    let me = json(&out);
    assert_eq!(me["token"]["name"], "anonymous", "{me}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_made_by_token_cert_stands_for_the_token() {
    let c = Cluster::start().await;
    let ca = c.ca.to_str().unwrap().to_owned();
    ok(&c
        .as_token(ADMIN, &["token", "create", "carol", "--grant", "viewer:/"])
        .await);
    let out_dir = c.path("certs");
    let out_dir = out_dir.to_str().unwrap();

    // The key is made here; the server signs and records the certificate.
    let issued = json(
        &c.as_token(
            ADMIN,
            &[
                "-o", "json", "token", "cert", "carol", "--out", out_dir, "--days", "3",
            ],
        )
        .await,
    );
    let fingerprint = issued["certificate"]["fingerprint"]
        .as_str()
        .expect("a fingerprint")
        .to_owned();
    assert_eq!(fingerprint.len(), 64, "{issued}");
    let cert = c.path("certs/carol.pem");
    let key = c.path("certs/carol.key");
    assert_eq!(issued["certificate_file"], cert.to_str().unwrap());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the key's mode");
    }
    let listed = json(&c.as_token(ADMIN, &["-o", "json", "token", "list"]).await);
    assert_eq!(
        listed["tokens"][0]["certificates"][0]["fingerprint"], fingerprint,
        "{listed}"
    );
    // The files are not overwritten.
    fails(
        &c.as_token(ADMIN, &["token", "cert", "carol", "--out", out_dir])
            .await,
        2,
        &["exists"],
    );

    // With the certificate and no token: carol.
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let by_cert = [
        ("PELOTON_SERVER", c.url.as_str()),
        ("PELOTON_CA_FILE", ca.as_str()),
        ("PELOTON_CERT_FILE", cert),
        ("PELOTON_KEY_FILE", key),
    ];
    let me = json(&c.run(&by_cert, &["-o", "json", "whoami"]).await);
    assert_eq!(me["token"]["name"], "carol", "{me}");
    // A viewer: reads, but changes nothing.
    ok(&c.run(&by_cert, &["respool", "list"]).await);
    fails(
        &c.run(&by_cert, &["token", "list"]).await,
        1,
        &["permission denied", "carol"],
    );
    // The flags work as the variables do; half a pair is a usage error.
    let me = ok(&c
        .run(
            &[("PELOTON_SERVER", c.url.as_str()), ("PELOTON_CA_FILE", &ca)],
            &["--cert-file", cert, "--key-file", key, "whoami"],
        )
        .await);
    assert!(me.contains("carol"), "{me}");
    fails(
        &c.run(
            &[("PELOTON_SERVER", c.url.as_str()), ("PELOTON_CA_FILE", &ca)],
            &["--cert-file", cert, "whoami"],
        )
        .await,
        2,
        &["give its key too"],
    );
    // A certificate from the command line replaces a token from anywhere.
    let mut with_token = by_cert.to_vec();
    with_token.push(("PELOTON_TOKEN", ADMIN));
    let me = json(&c.run(&with_token, &["-o", "json", "whoami"]).await);
    assert_eq!(me["token"]["name"], "carol", "{me}");
    // A non-admin caller: refused, and no key is left.
    let other_dir = c.path("other");
    fails(
        &c.run(
            &by_cert,
            &[
                "token",
                "cert",
                "carol",
                "--out",
                other_dir.to_str().unwrap(),
            ],
        )
        .await,
        1,
        &["permission denied", "tokens.admin"],
    );
    assert!(!c.path("other/carol.key").exists());
    // A made-up name: refused, and no key is left.
    fails(
        &c.as_token(ADMIN, &["token", "cert", "nobody", "--out", out_dir])
            .await,
        1,
        &["not found", "nobody"],
    );
    assert!(!c.path("certs/nobody.key").exists());

    // Revoked: the next call with it is refused.
    ok(&c
        .as_token(ADMIN, &["token", "cert-revoke", "carol", &fingerprint])
        .await);
    fails(
        &c.run(&by_cert, &["whoami"]).await,
        1,
        &["unauthenticated", "not recorded"],
    );
}

/// `peloton agent cert HOST` (cluster admins): the files for an agent on
/// another machine and the command to run there. Run as printed (with a
/// work dir of the test's), the agent joins the cluster as HOST: the
/// server accepted its certificate as naming that host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_certificate_lets_an_agent_join_as_its_host() {
    let c = Cluster::start_with(0).await;
    let files = c.path("far-host-files");
    let work = c.path("far-host-work");
    let args = |token| {
        let files = files.to_str().unwrap().to_owned();
        let work = work.to_str().unwrap().to_owned();
        (
            token,
            ["agent", "cert", "far-host", "--out"]
                .map(String::from)
                .into_iter()
                .chain([files, "--work-dir".into(), work])
                .collect::<Vec<_>>(),
        )
    };
    // Not for everyone: a submitter is refused, and nothing is written.
    let secret = json(
        &c.as_token(
            ADMIN,
            &[
                "-o",
                "json",
                "token",
                "create",
                "sub",
                "--grant",
                "submitter:/",
            ],
        )
        .await,
    )["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let (token, a) = args(secret.as_str());
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    fails(&c.as_token(token, &a).await, 1, &["permission denied"]);
    assert!(!files.exists());
    // A bad host name is refused naming the field.
    fails(
        &c.as_token(
            ADMIN,
            &[
                "agent",
                "cert",
                "bad host",
                "--out",
                files.to_str().unwrap(),
            ],
        )
        .await,
        1,
        &["host"],
    );

    let (token, a) = args(ADMIN);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let out = c.as_token(token, &a).await;
    let line = ok(&out).trim().to_owned();
    let words: Vec<&str> = line.split(' ').collect();
    assert_eq!(words[0], "peloton-agent", "{line}");
    assert!(line.contains(&format!("--server {}", c.url)), "{line}");
    assert!(line.contains("--host far-host"), "{line}");
    let cert = std::fs::read(files.join("far-host.pem")).unwrap();
    use peloton_tls::rustls::pki_types::pem::PemObject as _;
    let der = peloton_tls::rustls::pki_types::CertificateDer::from_pem_slice(&cert).unwrap();
    assert_eq!(peloton_tls::cert_names(&der).unwrap(), ["far-host"]);
    #[cfg(unix)]
    for secret in ["far-host.key", "agent-token"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(files.join(secret))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{secret}");
    }
    assert_eq!(
        std::fs::read(files.join("ca.pem")).unwrap(),
        std::fs::read(&c.ca).unwrap()
    );
    // Again into the same directory: refused, the files kept.
    fails(&c.as_token(ADMIN, &a).await, 2, &["exists"]);

    // The agent, as printed.
    let agent = PathBuf::from(env!("CARGO_BIN_EXE_peloton")).with_file_name("peloton-agent");
    assert!(
        agent.exists(),
        "build it first: cargo build -p peloton-agent"
    );
    let mut child = tokio::process::Command::new(agent)
        .args(&words[1..])
        .arg("--resources")
        .arg("cpu=1,mem=256")
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let hosts = json(&c.as_token(ADMIN, &["-o", "json", "host", "list"]).await);
        let names: Vec<&str> = hosts["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["name"].as_str().unwrap())
            .collect();
        if names == ["far-host"] {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            use tokio::io::AsyncReadExt as _;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .await
                .unwrap();
            panic!("the agent exited ({status}): {err}");
        }
        assert!(std::time::Instant::now() < deadline, "no far-host: {hosts}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    child.start_kill().unwrap();
    child.wait().await.unwrap();
}
