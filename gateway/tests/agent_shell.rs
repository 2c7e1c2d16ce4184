//! The server's side of agents, with a fake agent speaking the session
//! protocol: launches carry the job's secrets (to the agent running its
//! task), agent hosts are tagged with their host pool (an agent may not
//! set it), and an agent host keeps its host pool across a restart; a
//! second agent claiming a host is refused (the holder keeps it) unless it
//! is the same agent or the host was declared lost; registrations
//! out of bounds are refused naming their field; an agent registers only
//! the host its client certificate names.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::*;
use peloton_gateway::server::{self, Server};
use peloton_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

const TOKEN: &str = "agent-token-for-tests";

async fn start(dir: &Path) -> (Server, Clients) {
    let mut config = config(dir, 0);
    config.agent_token = Some(TOKEN.into());
    let server = within("the server to start", server::start(&config))
        .await
        .expect("server starts");
    let clients = Clients::connect(server.addr).await;
    (server, clients)
}

struct FakeAgent {
    tx: mpsc::Sender<pb::AgentMessage>,
    rx: tonic::Streaming<pb::ServerMessage>,
}

fn registration(host: &str, attributes: &[(&str, &str)]) -> pb::AgentRegister {
    pb::AgentRegister {
        token: TOKEN.into(),
        host: host.into(),
        resources: Some(res(4.0, 4096.0)),
        attributes: attributes
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
        isolation: "rlimit".into(),
        ports: 10,
        ..Default::default()
    }
}

async fn register(
    addr: std::net::SocketAddr,
    host: &str,
    attributes: &[(&str, &str)],
) -> Result<FakeAgent, tonic::Status> {
    register_with(addr, registration(host, attributes)).await
}

/// Registers `register` over TLS with a client certificate naming its
/// host (as a secure server wants; for a name no certificate can carry,
/// one naming "h").
async fn register_with(
    addr: std::net::SocketAddr,
    register: pb::AgentRegister,
) -> Result<FakeAgent, tonic::Status> {
    let host = if register.host.len() <= 63 {
        register.host.clone()
    } else {
        "h".to_string()
    };
    let channel = agent_channel(addr, &host).await.expect("connect");
    register_on(channel, register).await
}

/// Registers `register` on `channel`.
async fn register_on(
    channel: tonic::transport::Channel,
    register: pb::AgentRegister,
) -> Result<FakeAgent, tonic::Status> {
    let mut client = pb::agent_service_client::AgentServiceClient::new(channel);
    let (tx, rx) = mpsc::channel(16);
    tx.send(pb::AgentMessage {
        kind: Some(pb::agent_message::Kind::Register(register)),
    })
    .await
    .expect("queued");
    let mut rx = within("the session", client.session(ReceiverStream::new(rx)))
        .await?
        .into_inner();
    let first = within("registered", rx.message())
        .await?
        .expect("a message");
    assert!(
        matches!(first.kind, Some(pb::server_message::Kind::Registered(_))),
        "{first:?}"
    );
    Ok(FakeAgent { tx, rx })
}

impl FakeAgent {
    /// Heartbeats every 20 ms until the session's stream closes.
    fn keep_alive(&self) -> tokio::task::JoinHandle<()> {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let beat = pb::AgentMessage {
                kind: Some(pb::agent_message::Kind::Heartbeat(pb::AgentHeartbeat {})),
            };
            while tx.send(beat.clone()).await.is_ok() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
    }

    /// The status that ended this session's stream (messages before it
    /// are skipped).
    async fn ended(&mut self) -> tonic::Status {
        within("the session to end", async {
            loop {
                match self.rx.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => return tonic::Status::ok("ended"),
                    Err(s) => return s,
                }
            }
        })
        .await
    }

    /// Whether a message (other than a launch, which is returned) comes
    /// within `ms`: `Err` if the stream ended.
    async fn quiet_for(&mut self, ms: u64) -> Result<Option<pb::ServerMessage>, tonic::Status> {
        match tokio::time::timeout(std::time::Duration::from_millis(ms), self.rx.message()).await {
            Err(_) => Ok(None),
            Ok(Ok(Some(m))) => Ok(Some(m)),
            Ok(Ok(None)) => Err(tonic::Status::ok("ended")),
            Ok(Err(s)) => Err(s),
        }
    }

    /// The next launch sent to this agent.
    async fn next_launch(&mut self) -> pb::LaunchRun {
        within("a launch", async {
            loop {
                let m = self.rx.message().await.expect("stream").expect("open");
                if let Some(pb::server_message::Kind::Launch(l)) = m.kind {
                    return l.runs.into_iter().next().expect("one run");
                }
            }
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launches_carry_secrets_and_agent_hosts_keep_their_host_pool() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, mut c) = start(dir.path()).await;

    // The host pool attribute is the server's.
    assert_status(
        register(server.addr, "evil", &[("peloton.host_pool", "other")])
            .await
            .map(|_| ()),
        Code::InvalidArgument,
        "register.attributes.peloton.host_pool",
    );
    let mut a1 = register(server.addr, "a1", &[("zone", "z1")])
        .await
        .expect("a1");
    let a2 = register(server.addr, "a2", &[("zone", "z2")])
        .await
        .expect("a2");
    let hosts = list_hosts(&mut c).await;
    assert_eq!(hosts.len(), 2);
    for h in &hosts {
        assert_eq!(h.host_pool, "default");
        assert_eq!(h.attributes.len(), 2, "{:?}", h.attributes); // zone, host
    }

    c.host_pools
        .create(pb::CreateHostPoolRequest { name: "p".into() })
        .await
        .expect("create");
    c.host_pools
        .move_hosts(pb::MoveHostsRequest {
            hosts: vec!["a1".into()],
            to: "p".into(),
            force: false,
        })
        .await
        .expect("move");
    create_reserved_pool(&mut c, "/a").await;
    let mut spec = job_spec("/a", 1, 1.0, 0);
    spec.host_pool = "p".into();
    spec.secrets = vec![pb::Secret {
        name: "token".into(),
        value: b"s3cr3t-value".to_vec(),
        size: 0,
    }];
    let job = create_job(&mut c, spec).await;
    let launch = a1.next_launch().await;
    assert_eq!(launch.key.expect("key").job_id, job.id);
    assert_eq!(
        launch.secrets,
        [pb::Secret {
            name: "token".into(),
            value: b"s3cr3t-value".to_vec(),
            size: 12,
        }]
    );

    // After a restart, a1 is back in "p" before and after its agent
    // registers again.
    drop((a1, a2));
    within("shutdown", server.shutdown())
        .await
        .expect("shutdown");
    let (server, mut c) = start(dir.path()).await;
    let pools: Vec<String> = list_hosts(&mut c)
        .await
        .into_iter()
        .map(|h| format!("{}={}", h.name, h.host_pool))
        .collect();
    assert_eq!(pools, ["a1=p", "a2=default"]);
    let _a1 = register(server.addr, "a1", &[("zone", "z1")])
        .await
        .expect("a1 again");
    let hosts = list_hosts(&mut c).await;
    assert_eq!(hosts[0].host_pool, "p");
    assert!(hosts[0].connected);
    drop(_a1);
    within("shutdown", server.shutdown())
        .await
        .expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_registers_only_the_host_its_certificate_names() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, mut c) = start(dir.path()).await;
    // A certificate of the right CA, for another host: refused, naming
    // what the certificate vouches for.
    let other = agent_channel(server.addr, "other").await.expect("connect");
    let refused = register_on(other, registration("h", &[]))
        .await
        .map(|_| ())
        .expect_err("a certificate for another host");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("its certificate names [\"other\"]"),
        "{refused:?}"
    );
    // A user's certificate (CN=user:h), signed by the same CA: never an
    // agent's, even for a host of that very name.
    let pki = peloton_tls::testkit::shared();
    let csr = peloton_tls::user_csr("h").expect("a request");
    let user = pki.pki.sign_user_csr("h", &csr.csr_pem, 1).expect("signed");
    let ca = std::fs::read_to_string(&pki.ca_file).expect("the test CA");
    let as_user = tls_channel_as(server.addr, &ca, &user.cert_pem, &csr.key_pem)
        .await
        .expect("connect");
    let refused = register_on(as_user, registration("user:h", &[]))
        .await
        .map(|_| ());
    assert_status(refused, Code::PermissionDenied, "a user certificate");
    // No certificate at all (TLS, the right agent token): refused.
    let bare = tls_channel(server.addr).await.expect("connect");
    let refused = register_on(bare, registration("h", &[])).await.map(|_| ());
    assert_status(refused, Code::Unauthenticated, "client certificate");
    assert!(list_hosts(&mut c).await.is_empty());
    // Its own certificate: registered.
    let h = register(server.addr, "h", &[]).await.expect("h registers");
    let hosts = list_hosts(&mut c).await;
    assert_eq!(hosts.len(), 1);
    assert_eq!(hosts[0].name, "h");
    drop(h);
    within("shutdown", server.shutdown())
        .await
        .expect("shutdown");
}

async fn start_with_heartbeat(dir: &Path, heartbeat_ms: u64) -> (Server, Clients) {
    let mut config = config(dir, 0);
    config.agent_token = Some(TOKEN.into());
    config.agent_heartbeat_ms = heartbeat_ms;
    config.host_lost_after_ms = 1_000.max(2 * heartbeat_ms);
    let server = within("the server to start", server::start(&config))
        .await
        .expect("server starts");
    let clients = Clients::connect(server.addr).await;
    (server, clients)
}

fn with_id(host: &str, agent_id: &str) -> pb::AgentRegister {
    pb::AgentRegister {
        agent_id: agent_id.into(),
        ..registration(host, &[])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_claiming_a_connected_host_is_refused_and_the_first_keeps_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Heartbeats every 100 ms; a host silent for 1 s is lost (once the
    // server's 10 s reconnect slack after its start has passed).
    let (server, mut c) = start_with_heartbeat(dir.path(), 100).await;
    let mut first = register_with(server.addr, with_id("h", "agent-a"))
        .await
        .expect("the first agent registers");
    let beating = first.keep_alive();
    create_reserved_pool(&mut c, "/a").await;
    let job = create_job(&mut c, job_spec("/a", 1, 1.0, 0)).await;
    let launch = first.next_launch().await;
    let key = launch.key.expect("key");
    assert_eq!(key.job_id, job.id);

    // Another agent (another work directory, or another machine given the
    // same --host) is refused again and again while the first is alive.
    for _ in 0..5 {
        assert_status(
            register_with(server.addr, with_id("h", "agent-b"))
                .await
                .map(|_| ()),
            Code::AlreadyExists,
            "host h belongs to another agent",
        );
    }
    // An agent that sends no id is another agent too.
    assert_status(
        register_with(server.addr, with_id("h", ""))
            .await
            .map(|_| ()),
        Code::AlreadyExists,
        "give each agent its own --host",
    );
    // The first keeps its session and its run: no kill, no new launch.
    match first.quiet_for(500).await {
        Ok(None) => {}
        Ok(Some(m)) => {
            assert!(
                !matches!(
                    m.kind,
                    Some(pb::server_message::Kind::Launch(_) | pb::server_message::Kind::Kill(_))
                ),
                "{m:?}"
            );
        }
        Err(s) => panic!("the holder's session ended: {s:?}"),
    }
    let task = get_task(&mut c, &job.id, 0).await;
    let run = task.current.expect("current run");
    assert_eq!(run.run_id, key.run_id, "the run was not started again");
    let hosts = list_hosts(&mut c).await;
    assert!(hosts[0].connected, "{hosts:?}");

    // The same agent (restarted on its work directory before its old
    // connection was seen to close) takes its host back at once.
    let mut again = register_with(server.addr, with_id("h", "agent-a"))
        .await
        .expect("the same agent takes its host back");
    let ended = first.ended().await;
    assert_eq!(ended.code(), Code::Aborted, "{ended:?}");
    assert!(ended.message().contains("replaced"), "{ended:?}");
    beating.abort();
    let beating = again.keep_alive();
    assert!(again.quiet_for(200).await.is_ok());

    // A silent holder (its connection open) is still the host's holder
    // until the host is declared lost: another agent is refused meanwhile
    // and the run is not started again; once the host is lost, another
    // agent may take it (the run was lost with it).
    // (The fake agent listed no runs when it came back: its run was lost
    // and a new one went to it.)
    let current = get_task(&mut c, &job.id, 0)
        .await
        .current
        .expect("current")
        .run_id;
    beating.abort();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_status(
        register_with(server.addr, with_id("h", "agent-b"))
            .await
            .map(|_| ()),
        Code::AlreadyExists,
        "host h belongs to another agent",
    );
    let task = get_task(&mut c, &job.id, 0).await;
    assert_eq!(task.current.expect("current").run_id, current);
    let taken = eventually("the lost host to be taken", TIMEOUT, async || {
        register_with(server.addr, with_id("h", "agent-b"))
            .await
            .map_err(|s| format!("{s:?}"))
    })
    .await;
    let ended = again.ended().await;
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
    let task = get_task(&mut c, &job.id, 0).await;
    assert!(
        task.history
            .iter()
            .any(|r| r.state() == pb::TaskState::Lost && r.run_id == current),
        "{task:?}"
    );
    drop(taken);
    within("shutdown", server.shutdown())
        .await
        .expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_out_of_bounds_are_refused_naming_their_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, mut c) = start(dir.path()).await;
    let long = "x".repeat(300);
    let cases: Vec<(pb::AgentRegister, &str)> = vec![
        (
            pb::AgentRegister {
                ports: 4_000_000_000,
                ..registration("h", &[])
            },
            "register.ports",
        ),
        (
            pb::AgentRegister {
                resources: Some(res(1e12, 4096.0)),
                ..registration("h", &[])
            },
            "register.resources.cpu",
        ),
        (
            pb::AgentRegister {
                resources: Some(res(4.0, f64::INFINITY)),
                ..registration("h", &[])
            },
            "register.resources.memory_mb",
        ),
        (
            pb::AgentRegister {
                resources: Some(pb::Resources {
                    disk_mb: 1e18,
                    ..res(4.0, 4096.0)
                }),
                ..registration("h", &[])
            },
            "register.resources.disk_mb",
        ),
        (
            pb::AgentRegister {
                resources: Some(pb::Resources {
                    gpu: 1e9,
                    ..res(4.0, 4096.0)
                }),
                ..registration("h", &[])
            },
            "register.resources.gpu",
        ),
        (
            pb::AgentRegister {
                attributes: (0..63)
                    .map(|i| (format!("k{i}"), "v".to_string()))
                    .collect(),
                ..registration("h", &[])
            },
            "register.attributes: 63 entries; the limit is 62",
        ),
        (
            registration("h", &[("k", &long)]),
            "register.attributes.\"k\"",
        ),
        (
            registration("h", &[("k", "a b")]),
            "register.attributes.\"k\"",
        ),
        (
            pb::AgentRegister {
                agent_version: long.clone(),
                ..registration("h", &[])
            },
            "register.agent_version",
        ),
        (
            pb::AgentRegister {
                agent_id: long.clone(),
                ..registration("h", &[])
            },
            "register.agent_id",
        ),
        (
            pb::AgentRegister {
                isolation: long.clone(),
                ..registration("h", &[])
            },
            "register.isolation",
        ),
        (
            pb::AgentRegister {
                volumes: vec![long.clone()],
                ..registration("h", &[])
            },
            "register.volumes[0]",
        ),
        (
            pb::AgentRegister {
                volumes: vec![String::new(); 100_001],
                ..registration("h", &[])
            },
            "register.volumes: 100001 entries",
        ),
        (
            pb::AgentRegister {
                runs: vec![pb::RunReport {
                    key: Some(pb::RunKey {
                        job_id: long.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..registration("h", &[])
            },
            "register.runs[0].key.job_id",
        ),
        (
            pb::AgentRegister {
                runs: vec![pb::RunReport {
                    ports: (0..65).map(|i| (format!("p{i}"), 1)).collect(),
                    ..Default::default()
                }],
                ..registration("h", &[])
            },
            "register.runs[0].ports",
        ),
        (registration(&long, &[]), "register.host"),
    ];
    for (register, field) in cases {
        assert_status(
            register_with(server.addr, register).await.map(|_| ()),
            Code::InvalidArgument,
            field,
        );
    }
    // A wrong token of any length, even far longer than the server's.
    for token in [
        "",
        "agent-token-for-test",
        "agent-token-for-testz",
        &"t".repeat(100_000),
    ] {
        assert_status(
            register_with(
                server.addr,
                pb::AgentRegister {
                    token: token.into(),
                    ..registration("h", &[])
                },
            )
            .await
            .map(|_| ()),
            Code::Unauthenticated,
            "the token does not match",
        );
    }
    // Nothing was registered; a registration at the bounds is accepted.
    assert!(list_hosts(&mut c).await.is_empty());
    let edge = pb::AgentRegister {
        ports: 65_535,
        resources: Some(pb::Resources {
            cpu: 65_536.0,
            memory_mb: (1u64 << 27) as f64,
            disk_mb: (1u64 << 30) as f64,
            gpu: 16.0,
        }),
        attributes: (0..62)
            .map(|i| (format!("k{i}"), "v".repeat(128)))
            .collect(),
        ..registration("h", &[])
    };
    let _agent = register_with(server.addr, edge)
        .await
        .expect("at the bounds");
    assert_eq!(list_hosts(&mut c).await.len(), 1);
    within("shutdown", server.shutdown())
        .await
        .expect("shutdown");
}
