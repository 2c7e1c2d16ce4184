//! The server's side of agents, with a fake agent speaking the session
//! protocol: launches carry the job's secrets (to the agent running its
//! task), agent hosts are tagged with their host pool (an agent may not
//! set it), and an agent host keeps its host pool across a restart.

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
    _tx: mpsc::Sender<pb::AgentMessage>,
    rx: tonic::Streaming<pb::ServerMessage>,
}

async fn register(
    addr: std::net::SocketAddr,
    host: &str,
    attributes: &[(&str, &str)],
) -> Result<FakeAgent, tonic::Status> {
    let mut client =
        pb::agent_service_client::AgentServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("connect");
    let (tx, rx) = mpsc::channel(16);
    tx.send(pb::AgentMessage {
        kind: Some(pb::agent_message::Kind::Register(pb::AgentRegister {
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
        })),
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
    Ok(FakeAgent { _tx: tx, rx })
}

impl FakeAgent {
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
