//! The client contract, as any gRPC client sees it against a real server on
//! 127.0.0.1: short error messages whatever the input, gzip, both
//! reflection protocols, pages bounded by size, RESOURCE_EXHAUSTED for
//! oversize requests, refusals of bad tokens, enums and revisions, work
//! that could never be admitted refused at submission, pending reasons
//! about the task in the API's units, and watches that cannot make the
//! server hold unbounded memory. One test per point.

mod common;

use std::time::Duration;

use common::*;
use peloton_proto::v1 as pb;
use prost::Message;
use tonic::Code;
use tonic::codec::CompressionEncoding::Gzip;

/// What every status message must stay within (`status::MAX_MESSAGE_BYTES`).
const MAX_MESSAGE_BYTES: usize = 1024;

/// A default client's limit on an answer.
const CLIENT_MAX_BYTES: usize = 4 << 20;

/// Asserts `r` was refused with `code`, a message naming `field` within
/// [`MAX_MESSAGE_BYTES`], and returns the message.
#[track_caller]
fn refused<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, field: &str) -> String {
    let message = match r {
        Ok(v) => panic!("expected {code:?} naming {field:?}, got Ok({v:?})"),
        Err(s) => {
            assert_eq!(s.code(), code, "{field}: {}", s.message());
            s.message().to_string()
        }
    };
    assert!(
        message.len() <= MAX_MESSAGE_BYTES,
        "{field}: a message of {} bytes",
        message.len()
    );
    assert!(
        message.contains(field),
        "does not name {field:?}: {message}"
    );
    message
}

fn addr(s: &TestServer) -> std::net::SocketAddr {
    s.server.as_ref().expect("running").addr
}

/// A channel to `addr` as the admin: TLS with the tests' CA and the admin
/// token.
async fn channel(addr: std::net::SocketAddr) -> peloton_gateway::client::Authed {
    admin_channel(addr).await
}

fn preemptible(mut spec: pb::JobSpec) -> pb::JobSpec {
    spec.sla = Some(pb::Sla {
        preemptible: true,
        ..spec.sla.unwrap_or_default()
    });
    spec
}

async fn query_all(c: &mut Clients) -> Vec<pb::Job> {
    c.jobs
        .query(pb::QueryJobsRequest::default())
        .await
        .expect("query")
        .into_inner()
        .jobs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_megabyte_string_anywhere_gets_a_short_message_with_field_limit_and_prefix() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/a", pool_spec(4.0, 4096.0)).await;
    let mb = "x".repeat(1 << 20);
    let prefix = format!("\"{}\"…", "x".repeat(64));
    let job = |f: &dyn Fn(&mut pb::JobSpec)| {
        let mut spec = job_spec("/a", 1, 1.0, 100);
        f(&mut spec);
        pb::CreateJobRequest { spec: Some(spec) }
    };
    let specs: Vec<(&str, pb::CreateJobRequest)> = vec![
        ("spec.name", job(&|s| s.name = mb.clone())),
        ("spec.owner", job(&|s| s.owner = mb.clone())),
        ("spec.pool", job(&|s| s.pool = mb.clone())),
        (
            "spec.labels (a key)",
            job(&|s| {
                s.labels.insert(mb.clone(), "v".into());
            }),
        ),
        (
            "spec.labels.team",
            job(&|s| {
                s.labels.insert("team".into(), mb.clone());
            }),
        ),
        (
            "spec.default_task.command",
            job(&|s| task_of(s).command = mb.clone()),
        ),
        (
            "spec.default_task.env (a name)",
            job(&|s| {
                task_of(s).env.insert(mb.clone(), "v".into());
            }),
        ),
        (
            "spec.default_task.constraint",
            job(&|s| task_of(s).constraint = mb.clone()),
        ),
        (
            "spec.default_task.ports[0].name",
            job(&|s| task_of(s).ports.push(pb::PortSpec { name: mb.clone() })),
        ),
        ("spec.host_pool", job(&|s| s.host_pool = mb.clone())),
    ];
    for (field, request) in specs {
        let message = refused(c.jobs.create(request).await, Code::InvalidArgument, field);
        assert!(message.contains(&prefix), "{field}: {message}");
        // The limit: bytes, or the length names must have.
        assert!(
            message.contains("limit of") || message.contains("1–64"),
            "{field}: {message}"
        );
    }
    // Ids, paths, names and filters of every service.
    let m = mb.clone();
    refused(
        c.pools
            .create(pb::CreatePoolRequest {
                path: m.clone(),
                spec: None,
            })
            .await,
        Code::InvalidArgument,
        "path",
    );
    refused(
        c.jobs.get(pb::GetJobRequest { id: m.clone() }).await,
        Code::InvalidArgument,
        "id",
    );
    for (field, request) in [
        (
            "name",
            pb::QueryJobsRequest {
                name: m.clone(),
                ..Default::default()
            },
        ),
        (
            "pool",
            pb::QueryJobsRequest {
                pool: m.clone(),
                ..Default::default()
            },
        ),
        (
            "page_token",
            pb::QueryJobsRequest {
                page_token: m.clone(),
                ..Default::default()
            },
        ),
    ] {
        refused(c.jobs.query(request).await, Code::InvalidArgument, field);
    }
    refused(
        c.tasks
            .list(pb::ListTasksRequest {
                job_id: m.clone(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "job_id",
    );
    refused(
        c.hosts
            .list(pb::ListHostsRequest {
                after: m.clone(),
                limit: 0,
            })
            .await,
        Code::InvalidArgument,
        "after",
    );
    refused(
        c.hosts
            .start_maintenance(pb::StartMaintenanceRequest {
                hosts: vec![m.clone()],
            })
            .await,
        Code::InvalidArgument,
        "hosts[0]",
    );
    refused(
        c.host_pools
            .create(pb::CreateHostPoolRequest { name: m.clone() })
            .await,
        Code::InvalidArgument,
        "name",
    );
    refused(
        c.updates.get(pb::GetUpdateRequest { id: m.clone() }).await,
        Code::InvalidArgument,
        "id",
    );
    let mut volumes = pb::volume_service_client::VolumeServiceClient::new(channel(addr(&s)).await);
    refused(
        volumes.get(pb::GetVolumeRequest { id: m.clone() }).await,
        Code::InvalidArgument,
        "id",
    );
    refused(
        c.watch
            .watch(pb::WatchRequest {
                from_revision: 0,
                job_id: m,
            })
            .await,
        Code::InvalidArgument,
        "job_id",
    );
    // A refused request changes nothing.
    assert!(query_all(&mut c).await.is_empty());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_requests_are_accepted_and_answers_compressed_on_every_service() {
    let s = TestServer::start(2).await;
    let ch = channel(addr(&s)).await;
    let mut pools = pb::resource_pool_service_client::ResourcePoolServiceClient::new(ch.clone())
        .send_compressed(Gzip)
        .accept_compressed(Gzip);
    let mut jobs = pb::job_service_client::JobServiceClient::new(ch.clone())
        .send_compressed(Gzip)
        .accept_compressed(Gzip);
    let mut tasks = pb::task_service_client::TaskServiceClient::new(ch.clone())
        .send_compressed(Gzip)
        .accept_compressed(Gzip);
    let mut hosts = pb::host_service_client::HostServiceClient::new(ch.clone())
        .send_compressed(Gzip)
        .accept_compressed(Gzip);
    let mut host_pools = pb::host_pool_service_client::HostPoolServiceClient::new(ch.clone())
        .send_compressed(Gzip)
        .accept_compressed(Gzip);
    let mut updates = pb::update_service_client::UpdateServiceClient::new(ch.clone())
        .send_compressed(Gzip)
        .accept_compressed(Gzip);
    let mut volumes = pb::volume_service_client::VolumeServiceClient::new(ch.clone())
        .send_compressed(Gzip)
        .accept_compressed(Gzip);
    let mut watch = pb::watch_service_client::WatchServiceClient::new(ch.clone())
        .send_compressed(Gzip)
        .accept_compressed(Gzip);
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch)
        .send_compressed(Gzip)
        .accept_compressed(Gzip);

    fn gzipped<T>(r: &tonic::Response<T>) -> bool {
        r.metadata()
            .get("grpc-encoding")
            .is_some_and(|v| v == "gzip")
    }
    let r = pools
        .create(pb::CreatePoolRequest {
            path: "/a".into(),
            spec: Some(pool_spec(8.0, 8192.0)),
        })
        .await
        .expect("create pool, gzipped");
    assert!(gzipped(&r));
    // A compressible spec, well over a compression threshold.
    let mut spec = job_spec("/a", 2, 1.0, 600_000);
    task_of(&mut spec)
        .env
        .insert("BIG".into(), "y".repeat(60_000));
    let r = jobs
        .create(pb::CreateJobRequest { spec: Some(spec) })
        .await
        .expect("create job, gzipped");
    assert!(gzipped(&r));
    let id = r.into_inner().job.expect("job").id;
    let r = jobs
        .get(pb::GetJobRequest { id: id.clone() })
        .await
        .expect("get job");
    assert!(gzipped(&r));
    let env = &r.into_inner().job.expect("job").spec.expect("spec");
    assert_eq!(
        env.default_task.as_ref().expect("task").env["BIG"].len(),
        60_000
    );
    assert!(gzipped(
        &jobs
            .query(pb::QueryJobsRequest::default())
            .await
            .expect("query")
    ));
    assert!(gzipped(
        &tasks
            .list(pb::ListTasksRequest {
                job_id: id.clone(),
                ..Default::default()
            })
            .await
            .expect("list tasks")
    ));
    assert!(gzipped(
        &hosts
            .list(pb::ListHostsRequest::default())
            .await
            .expect("list hosts")
    ));
    assert!(gzipped(
        &host_pools
            .list(pb::ListHostPoolsRequest::default())
            .await
            .expect("list host pools")
    ));
    assert!(gzipped(
        &updates
            .list(pb::ListUpdatesRequest { job_id: id.clone() })
            .await
            .expect("list updates")
    ));
    assert!(gzipped(
        &volumes
            .list(pb::ListVolumesRequest::default())
            .await
            .expect("list volumes")
    ));
    assert!(gzipped(
        &pools
            .list(pb::ListPoolsRequest::default())
            .await
            .expect("list pools")
    ));
    assert!(gzipped(
        &health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "peloton.v1.JobService".into(),
            })
            .await
            .expect("health")
    ));
    // A stream: replays the job's creation, compressed.
    let mut stream = watch
        .watch(pb::WatchRequest {
            from_revision: 1,
            job_id: id.clone(),
        })
        .await
        .expect("watch");
    assert!(gzipped(&stream));
    let first = within("a gzipped watch message", stream.get_mut().message())
        .await
        .expect("watch message")
        .expect("not the end");
    assert!(!first.events.is_empty());
    drop(stream);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_reflection_answers_both_v1_and_v1alpha() {
    let s = TestServer::start(1).await;
    // TLS without a token: the schema is public.
    let ch = tls_channel(addr(&s)).await.expect("connect over TLS");
    let want = [
        "peloton.v1.JobService",
        "peloton.v1.ResourcePoolService",
        "peloton.v1.WatchService",
    ];
    {
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
        use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};
        let mut client = ServerReflectionClient::new(ch.clone());
        let ask = |m: MessageRequest| ServerReflectionRequest {
            host: String::new(),
            message_request: Some(m),
        };
        let asks = vec![
            ask(MessageRequest::ListServices(String::new())),
            ask(MessageRequest::FileContainingSymbol(
                "peloton.v1.JobService".into(),
            )),
        ];
        let answers: Vec<ServerReflectionResponse> = within("v1 reflection", async {
            let mut stream = client
                .server_reflection_info(tokio_stream::iter(asks))
                .await
                .expect("v1 reflection")
                .into_inner();
            let mut out = Vec::new();
            while let Some(a) = stream.message().await.expect("v1 answer") {
                out.push(a);
            }
            out
        })
        .await;
        let Some(MessageResponse::ListServicesResponse(list)) = &answers[0].message_response else {
            panic!("v1: {:?}", answers[0]);
        };
        let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
        for w in want {
            assert!(names.contains(&w), "v1 lists {names:?}");
        }
        let Some(MessageResponse::FileDescriptorResponse(files)) = &answers[1].message_response
        else {
            panic!("v1: {:?}", answers[1]);
        };
        assert!(!files.file_descriptor_proto.is_empty());
    }
    {
        use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
        use tonic_reflection::pb::v1alpha::{ServerReflectionRequest, ServerReflectionResponse};
        let mut client = ServerReflectionClient::new(ch);
        let ask = |m: MessageRequest| ServerReflectionRequest {
            host: String::new(),
            message_request: Some(m),
        };
        let asks = vec![
            ask(MessageRequest::ListServices(String::new())),
            ask(MessageRequest::FileContainingSymbol(
                "peloton.v1.JobService".into(),
            )),
        ];
        let answers: Vec<ServerReflectionResponse> = within("v1alpha reflection", async {
            let mut stream = client
                .server_reflection_info(tokio_stream::iter(asks))
                .await
                .expect("v1alpha reflection")
                .into_inner();
            let mut out = Vec::new();
            while let Some(a) = stream.message().await.expect("v1alpha answer") {
                out.push(a);
            }
            out
        })
        .await;
        let Some(MessageResponse::ListServicesResponse(list)) = &answers[0].message_response else {
            panic!("v1alpha: {:?}", answers[0]);
        };
        let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
        for w in want {
            assert!(names.contains(&w), "v1alpha lists {names:?}");
        }
        let Some(MessageResponse::FileDescriptorResponse(files)) = &answers[1].message_response
        else {
            panic!("v1alpha: {:?}", answers[1]);
        };
        assert!(!files.file_descriptor_proto.is_empty());
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_of_large_jobs_returns_fewer_per_page_and_each_page_fits_a_default_client() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/a", pool_spec(16.0, 16384.0)).await;
    // Jobs of about 1 MiB each (16 values of 64 KiB): three pages' worth of
    // the default page size would be 8 MiB in one answer.
    let n_jobs = 8;
    let mut ids = std::collections::BTreeSet::new();
    for j in 0..n_jobs {
        let mut spec = job_spec("/a", 1, 0.5, 600_000);
        for k in 0..16 {
            task_of(&mut spec)
                .env
                .insert(format!("V{k}"), format!("{j}").repeat(64 * 1024));
        }
        ids.insert(create_job(&mut c, spec).await.id);
    }
    // The tests' clients keep tonic's default 4 MiB limit on answers.
    let mut seen = Vec::new();
    let mut pages = 0;
    let mut page_token = String::new();
    loop {
        let page = c
            .jobs
            .query(pb::QueryJobsRequest {
                page_size: 100,
                page_token,
                ..Default::default()
            })
            .await
            .expect("a page fits a default client")
            .into_inner();
        pages += 1;
        assert!(!page.jobs.is_empty(), "page {pages} is empty");
        assert!(
            page.encoded_len() <= CLIENT_MAX_BYTES,
            "page {pages}: {} bytes",
            page.encoded_len()
        );
        seen.extend(page.jobs.into_iter().map(|j| j.id));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
        assert!(pages <= n_jobs, "more pages than jobs");
    }
    assert!(pages >= 3, "{n_jobs} jobs of 1 MiB came in {pages} pages");
    assert_eq!(seen.len(), n_jobs, "every job exactly once: {seen:?}");
    assert_eq!(
        seen.into_iter().collect::<std::collections::BTreeSet<_>>(),
        ids
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_request_is_resource_exhausted() {
    let s = TestServer::start(1).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/a", pool_spec(4.0, 4096.0)).await;
    // Job specs may be up to 16 MiB.
    let mut spec = job_spec("/a", 1, 1.0, 100);
    spec.name = "n".repeat(17 << 20);
    let message = refused(
        c.jobs
            .create(pb::CreateJobRequest { spec: Some(spec) })
            .await,
        Code::ResourceExhausted,
        "too large",
    );
    assert!(message.contains("16777216"), "{message}");
    // Other requests up to 4 MiB.
    refused(
        c.hosts
            .list(pb::ListHostsRequest {
                after: "h".repeat(5 << 20),
                limit: 0,
            })
            .await,
        Code::ResourceExhausted,
        "too large",
    );
    // Nothing changed, and the connection still serves.
    assert!(query_all(&mut c).await.is_empty());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_page_tokens_unknown_enum_filters_and_future_revisions_are_refused() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/a", pool_spec(8.0, 8192.0)).await;
    let a = create_job(&mut c, job_spec("/a", 2, 1.0, 600_000)).await;
    create_job(&mut c, job_spec("/a", 1, 1.0, 600_000)).await;

    // A real token goes on; one this server did not make is refused.
    let first = c
        .jobs
        .query(pb::QueryJobsRequest {
            page_size: 1,
            ..Default::default()
        })
        .await
        .expect("first page")
        .into_inner();
    assert_eq!(first.jobs.len(), 1);
    let second = c
        .jobs
        .query(pb::QueryJobsRequest {
            page_size: 1,
            page_token: first.next_page_token.clone(),
            ..Default::default()
        })
        .await
        .expect("second page")
        .into_inner();
    assert_eq!(second.jobs.len(), 1);
    assert_ne!(first.jobs[0].id, second.jobs[0].id);
    // The second page ends the list: real tokens take a client through.
    assert!(second.next_page_token.is_empty(), "{second:?}");
    // An edited token (another job's id in place of the position, or one
    // character changed anywhere) is refused, as is a token of an older
    // format.
    let token = first.next_page_token.clone();
    let (tagged, _) = token.rsplit_once('.').expect("a token with a position");
    let mut edited = vec![
        format!("{tagged}.{}", second.jobs[0].id),
        "p1.zzzz".to_string(),
        format!("{token}0"),
    ];
    for at in [3, token.len() / 2, token.len() - 1] {
        let mut chars: Vec<char> = token.chars().collect();
        chars[at] = if chars[at] == '0' { '1' } else { '0' };
        edited.push(chars.into_iter().collect());
    }
    for bad in edited {
        let message = refused(
            c.jobs
                .query(pb::QueryJobsRequest {
                    page_size: 1,
                    page_token: bad.clone(),
                    ..Default::default()
                })
                .await,
            Code::InvalidArgument,
            "page_token",
        );
        assert!(
            message.contains("not a token of this list"),
            "{bad}: {message}"
        );
    }
    // A token of another list is refused, naming both lists.
    let pools_page = c
        .pools
        .list(pb::ListPoolsRequest {
            page_size: 1,
            ..Default::default()
        })
        .await
        .expect("a page of pools")
        .into_inner();
    assert!(!pools_page.next_page_token.is_empty(), "{pools_page:?}");
    let message = refused(
        c.jobs
            .query(pb::QueryJobsRequest {
                page_token: pools_page.next_page_token.clone(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "page_token",
    );
    assert!(
        message.contains("not a token of this list")
            && message.contains("pools list")
            && message.contains("jobs list"),
        "{message}"
    );
    let message = refused(
        c.host_pools
            .list(pb::ListHostPoolsRequest {
                page_token: first.next_page_token.clone(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "page_token",
    );
    assert!(message.contains("jobs list"), "{message}");
    // The pools' own token goes on.
    let rest = c
        .pools
        .list(pb::ListPoolsRequest {
            page_size: 1,
            page_token: pools_page.next_page_token,
        })
        .await
        .expect("the next page of pools")
        .into_inner();
    assert_eq!(rest.pools.len(), 1);
    assert_ne!(rest.pools[0].path, pools_page.pools[0].path);
    refused(
        c.jobs
            .query(pb::QueryJobsRequest {
                page_token: a.id.clone(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "page_token",
    );
    refused(
        c.pools
            .list(pb::ListPoolsRequest {
                page_token: "/a".into(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "page_token",
    );
    let mut volumes = pb::volume_service_client::VolumeServiceClient::new(channel(addr(&s)).await);
    refused(
        volumes
            .list(pb::ListVolumesRequest {
                page_token: "garbage".into(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "page_token",
    );

    // Enum values outside the enum (and UNKNOWN, which matches nothing).
    for states in [vec![42], vec![pb::JobState::Running as i32, 0]] {
        refused(
            c.jobs
                .query(pb::QueryJobsRequest {
                    states,
                    ..Default::default()
                })
                .await,
            Code::InvalidArgument,
            "states[",
        );
    }
    refused(
        c.tasks
            .list(pb::ListTasksRequest {
                job_id: a.id.clone(),
                states: vec![99],
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "states[0]",
    );
    let mut spec = job_spec("/a", 1, 1.0, 100);
    spec.stateful = Some(pb::StatefulPolicy {
        host_down_timeout_ms: 0,
        on_host_down: 7,
    });
    refused(
        c.jobs
            .create(pb::CreateJobRequest { spec: Some(spec) })
            .await,
        Code::InvalidArgument,
        "spec.stateful.on_host_down",
    );
    let mut spec = job_spec("/a", 1, 1.0, 100);
    spec.placement = 12;
    refused(
        c.jobs
            .create(pb::CreateJobRequest { spec: Some(spec) })
            .await,
        Code::InvalidArgument,
        "spec.placement",
    );

    // Past the end: instances and revisions.
    refused(
        c.tasks
            .list(pb::ListTasksRequest {
                job_id: a.id.clone(),
                from_instance: 5,
                ..Default::default()
            })
            .await,
        Code::OutOfRange,
        "from_instance",
    );
    let message = refused(
        within(
            "a watch from the future to be refused",
            c.watch.watch(pb::WatchRequest {
                from_revision: 1_000_000,
                job_id: String::new(),
            }),
        )
        .await,
        Code::OutOfRange,
        "from_revision",
    );
    assert!(message.contains("ahead"), "{message}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_that_could_never_be_admitted_is_refused_at_create_scale_and_update() {
    // Two hosts of 16 cores.
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/np", pool_spec(2.0, 4096.0)).await;
    create_pool(
        &mut c,
        "/ctl",
        pb::PoolSpec {
            limit: Some(res(4.0, 0.0)),
            controller_limit_pct: 25.0,
            ..Default::default()
        },
    )
    .await;

    // Non-preemptible work above the reservation, alone or as a gang.
    let message = refused(
        c.jobs
            .create(pb::CreateJobRequest {
                spec: Some(job_spec("/np", 1, 3.0, 100)),
            })
            .await,
        Code::InvalidArgument,
        "spec.default_task.resources.cpu",
    );
    for words in ["3 cores", "reservation", "2 cores", "/np", "preemptible"] {
        assert!(message.contains(words), "no {words:?} in: {message}");
    }
    let mut gang = job_spec("/np", 2, 1.5, 100);
    gang.sla = Some(pb::Sla {
        min_running_instances: 2,
        ..Default::default()
    });
    let message = refused(
        c.jobs
            .create(pb::CreateJobRequest { spec: Some(gang) })
            .await,
        Code::InvalidArgument,
        "spec.sla.min_running_instances",
    );
    assert!(message.contains("3 cores in all"), "{message}");
    // Above every host. (A controller above its pool's controller limit is
    // not refused: a pool's first controller runs whatever the limit.)
    let message = refused(
        c.jobs
            .create(pb::CreateJobRequest {
                spec: Some(preemptible(job_spec("/np", 1, 40.0, 100))),
            })
            .await,
        Code::InvalidArgument,
        "spec.default_task.resources.cpu",
    );
    assert!(message.contains("no host"), "{message}");
    assert!(query_all(&mut c).await.is_empty(), "a refused job was kept");

    // Within the reservation: accepted. One holds it all, one waits.
    let holder = create_job(&mut c, job_spec("/np", 1, 2.0, 600_000)).await;
    wait_job(&c, &holder.id, pb::JobState::Running).await;
    let waiting = create_job(&mut c, job_spec("/np", 1, 1.0, 600_000)).await;
    let mut service = job_spec("/np", 1, 0.5, 600_000);
    service.r#type = pb::JobType::Service as i32;
    let service = create_job(&mut c, service).await;

    // The pool shrinks below what the waiting job needs.
    c.pools
        .update(pb::UpdatePoolRequest {
            path: "/np".into(),
            spec: Some(pool_spec(0.5, 4096.0)),
            version: 0,
        })
        .await
        .expect("shrink /np");
    let mut cc = c.clone();
    let reason = eventually("the waiting task to say why", TIMEOUT, async || {
        let t = get_task(&mut cc, &waiting.id, 0).await;
        if t.pending_reason.starts_with("can never be admitted") {
            Ok(t.pending_reason)
        } else {
            Err(t.pending_reason)
        }
    })
    .await;
    assert!(
        reason.contains("0.5 cores") && reason.contains("1 core"),
        "{reason}"
    );
    // Scaling it up, or updating the service above the new reservation,
    // is refused and changes nothing.
    refused(
        c.jobs
            .scale(pb::ScaleJobRequest {
                id: waiting.id.clone(),
                instance_count: 2,
                version: 0,
            })
            .await,
        Code::InvalidArgument,
        "resources.cpu",
    );
    let mut bigger = job_spec("/np", 1, 1.0, 600_000);
    bigger.r#type = pb::JobType::Service as i32;
    // An update keeps the job's name.
    bigger.name = service.spec.as_ref().expect("spec").name.clone();
    refused(
        c.updates
            .create(pb::UpdateJobRequest {
                job_id: service.id.clone(),
                version: 0,
                spec: Some(bigger),
                update: None,
            })
            .await,
        Code::InvalidArgument,
        "spec.default_task.resources.cpu",
    );
    let after = get_job(&mut c, &waiting.id).await.expect("job");
    assert_eq!(
        after.version, waiting.version,
        "a refused scale changed the job"
    );
    let after = get_job(&mut c, &service.id).await.expect("job");
    assert_eq!(after.status.expect("status").config_version, 1);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_tasks_reason_is_about_that_task_in_cores_and_mib() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/r", pool_spec(2.0, 4096.0)).await;
    let holder = create_job(&mut c, job_spec("/r", 1, 2.0, 600_000)).await;
    wait_job(&c, &holder.id, pb::JobState::Running).await;
    // The head of the queue, then a small task behind it.
    let head = create_job(&mut c, job_spec("/r", 1, 1.5, 600_000)).await;
    let behind = create_job(&mut c, job_spec("/r", 1, 0.25, 600_000)).await;
    let reason_of = async |c: &mut Clients, id: &str| {
        let id = id.to_string();
        eventually("a pending reason from admission", TIMEOUT, async || {
            let t = get_task(c, &id, 0).await;
            if t.pending_reason.starts_with("not admitted") {
                Ok(t.pending_reason)
            } else {
                Err(t.pending_reason)
            }
        })
        .await
    };
    let at_head = reason_of(&mut c, &head.id).await;
    let queued = reason_of(&mut c, &behind.id).await;
    for r in [&at_head, &queued] {
        assert!(!r.contains("milli"), "internal units in: {r}");
        assert!(r.contains("pool /r's reservation"), "{r}");
        assert!(r.contains("2 cores, with 2 cores in use"), "{r}");
    }
    assert!(
        at_head.contains("it needs cpu 1.5 cores, memory 256 MiB"),
        "{at_head}"
    );
    assert!(!at_head.contains("behind"), "{at_head}");
    assert!(
        queued.contains("it needs cpu 0.25 cores, memory 256 MiB"),
        "{queued}"
    );
    assert!(queued.contains("waits behind"), "{queued}");
    assert!(
        queued.contains("1.5 cores"),
        "names what the head needs: {queued}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_is_never_read_ends_resource_exhausted_and_frees_its_buffer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = common::config(dir.path(), 4);
    config.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"));
    let server = within("start", peloton_gateway::server::start(&config))
        .await
        .expect("server");
    let metrics = server.metrics_addr.expect("metrics");
    let mut c = Clients::connect(server.addr).await;

    // On its own connection (a stalled stream must not stall the others'
    // connection window), with HTTP/2's default 64 KiB windows (hyper's
    // are megabytes, which would take all the events into the client's
    // memory instead): a watch nobody reads.
    let small_windows = tls_endpoint(server.addr)
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .expect("connect");
    let mut stalled =
        pb::watch_service_client::WatchServiceClient::new(with_token(small_windows, ADMIN_TOKEN))
            .watch(pb::WatchRequest::default())
            .await
            .expect("watch")
            .into_inner();
    // A watch that reads everything, as a well-behaved client.
    let mut reader = c
        .watch
        .watch(pb::WatchRequest::default())
        .await
        .expect("watch")
        .into_inner();

    // About 30,000 events: 5,000 short tasks.
    create_reserved_pool(&mut c, "/w").await;
    let mut spec = job_spec("/w", 5000, 0.01, 0);
    task_of(&mut spec).resources = Some(res(0.01, 1.0));
    let job = create_job(&mut c, spec).await;
    let id = job.id.clone();
    let events = collect_events(&mut reader, |events| {
        events.iter().any(|e| {
            matches!(&e.kind, Some(pb::event::Kind::Job(j))
                if j.job_id == id && j.state() == pb::JobState::Succeeded)
        })
    })
    .await;
    assert!(events.len() > 25_000, "{} events", events.len());

    // More commits, each with events: the stalled client takes nothing.
    for _ in 0..70 {
        create_job(&mut c, job_spec("/w", 1, 0.01, 0)).await;
    }
    // The stalled watch's buffer was dropped (nothing is held for it) ...
    eventually(
        "the stalled watch's buffer to be dropped",
        TIMEOUT,
        async || match common::metric(metrics, "peloton_watch_buffered_events").await? {
            0 => Ok(()),
            n => Err(format!("{n} events buffered")),
        },
    )
    .await;
    // ... and its client, reading at last, gets what was already on the
    // wire, then RESOURCE_EXHAUSTED.
    let end = within("the stalled watch to end", async {
        let mut n = 0;
        loop {
            match stalled.message().await {
                Ok(Some(m)) => n += m.events.len(),
                Ok(None) => panic!("the stalled watch ended without an error after {n} events"),
                Err(e) => return (n, e),
            }
        }
    })
    .await;
    assert_eq!(end.1.code(), Code::ResourceExhausted, "{:?}", end.1);
    let message = end.1.message();
    assert!(message.contains("read nothing"), "{message}");
    assert!(message.contains("watch again from revision"), "{message}");
    assert!(
        end.0 < events.len(),
        "it got {} of {} events",
        end.0,
        events.len()
    );

    // Others are served as before: reads, and a new watch replaying history.
    assert_eq!(query_all(&mut c).await.len(), 71);
    let mut replay = c
        .watch
        .watch(pb::WatchRequest {
            from_revision: 1,
            job_id: String::new(),
        })
        .await
        .expect("watch")
        .into_inner();
    let replayed = collect_events(&mut replay, |e| e.len() >= 100).await;
    assert_eq!(replayed[0].revision, 1);
    drop((stalled, reader, replay));
    eventually(
        "every watch stream to be gone",
        TIMEOUT,
        async || match common::metric(metrics, "peloton_watch_streams").await? {
            0 => Ok(()),
            n => Err(format!("{n} streams")),
        },
    )
    .await;
    assert_eq!(
        common::metric(metrics, "peloton_watch_buffered_events").await,
        Ok(0)
    );
    tokio::time::timeout(Duration::from_secs(30), server.shutdown())
        .await
        .expect("shutdown in time")
        .expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_pools_are_paged_by_size_and_a_pool_continues_on_the_next_page() {
    // 13,000 hosts with names of about 250 bytes: 3.2 MB of names in
    // "default", more than one page.
    let dir = tempfile::tempdir().expect("temp dir");
    let long = "h".repeat(240);
    let file = dir.path().join("hosts.yaml");
    std::fs::write(
        &file,
        format!(
            "hosts:\n  - {{name: {long}, count: 13000, cpu: 1, memory_mb: 1024, attributes: {{host: x}}}}\n"
        ),
    )
    .expect("host file");
    let mut config = common::config(&dir.path().join("data"), 0);
    config.sim_hosts_file = Some(file);
    let server = within("start", peloton_gateway::server::start(&config))
        .await
        .expect("server");
    let mut c = Clients::connect(server.addr).await;
    for name in ["a", "b"] {
        c.host_pools
            .create(pb::CreateHostPoolRequest { name: name.into() })
            .await
            .expect("create host pool");
    }
    let moved = format!("{long}-7");
    c.host_pools
        .move_hosts(pb::MoveHostsRequest {
            hosts: vec![moved.clone()],
            to: "b".into(),
            force: false,
        })
        .await
        .expect("move a host");

    // Without a count limit: pages end by size, "default" (after "a" and
    // "b") spans two.
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .host_pools
            .list(pb::ListHostPoolsRequest {
                page_size: 0,
                page_token: token,
            })
            .await
            .expect("a page of host pools")
            .into_inner();
        // Within a default client's limit; the items within a page's 3 MiB.
        assert!(page.encoded_len() <= CLIENT_MAX_BYTES);
        let items: usize = page.pools.iter().map(|p| p.encoded_len() + 6).sum();
        assert!(items <= 3 << 20, "{items} bytes of items");
        token = page.next_page_token.clone();
        pages.push(page);
        if token.is_empty() {
            break;
        }
        assert!(pages.len() < 10, "the pages never end");
    }
    let names = |p: &pb::ListHostPoolsResponse| -> Vec<String> {
        p.pools.iter().map(|p| p.name.clone()).collect()
    };
    assert_eq!(pages.len(), 2);
    assert_eq!(names(&pages[0]), ["a", "b", "default"]);
    assert_eq!(names(&pages[1]), ["default"]);
    let default: Vec<String> = pages
        .iter()
        .flat_map(|p| p.pools.iter())
        .filter(|p| p.name == "default")
        .flat_map(|p| p.hosts.iter().cloned())
        .collect();
    assert_eq!(default.len(), 12_999);
    assert!(
        default.windows(2).all(|w| w[0] < w[1]),
        "in name order, without repeats"
    );
    assert!(!default.contains(&moved));
    assert!(pages[0].pools[0].hosts.is_empty());
    assert_eq!(pages[0].pools[1].hosts, [moved]);

    // A count limit: one pool per page, then the end.
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .host_pools
            .list(pb::ListHostPoolsRequest {
                page_size: 1,
                page_token: token,
            })
            .await
            .expect("a page of one host pool")
            .into_inner();
        assert_eq!(page.pools.len(), 1, "{:?}", names(&page));
        seen.extend(names(&page));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen, ["a", "b", "default", "default"]);
    tokio::time::timeout(Duration::from_secs(30), server.shutdown())
        .await
        .expect("shutdown in time")
        .expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_host_names_at_most_1000_of_its_tasks_and_counts_them_all() {
    let s = TestServer::start(1).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/many", pool_spec(8.0, 8192.0)).await;
    let mut spec = job_spec("/many", 1200, 0.001, 600_000);
    task_of(&mut spec).resources = Some(res(0.001, 1.0));
    let job = create_job(&mut c, spec).await;
    wait_job_where(&c, &job.id, "1200 tasks running", |j| {
        count_in(j, pb::TaskState::Running) == 1200
    })
    .await;
    let hosts = list_hosts(&mut c).await;
    assert_eq!(hosts.len(), 1);
    let host = &hosts[0];
    assert_eq!(host.tasks_total, 1200);
    assert_eq!(host.tasks.len(), 1000);
    let instances: Vec<u32> = host.tasks.iter().map(|t| t.instance).collect();
    assert_eq!(instances, (0..1000).collect::<Vec<_>>(), "the first 1000");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_its_shrunk_pool_can_never_admit_does_not_block_the_tasks_behind_it() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    create_pool(&mut c, "/s", pool_spec(4.0, 4096.0)).await;
    let holder = create_job(&mut c, job_spec("/s", 1, 2.0, 600_000)).await;
    wait_job(&c, &holder.id, pb::JobState::Running).await;
    // Non-preemptible: 3 cores fit the reservation of 4, not beside the
    // holder's 2; a small task waits behind it.
    let big = create_job(&mut c, job_spec("/s", 1, 3.0, 600_000)).await;
    let small = create_job(&mut c, job_spec("/s", 1, 0.5, 600_000)).await;
    let mut cc = c.clone();
    eventually(
        "the small task to wait behind the big one",
        TIMEOUT,
        async || {
            let t = get_task(&mut cc, &small.id, 0).await;
            if t.pending_reason.contains("waits behind") {
                Ok(())
            } else {
                Err(t.pending_reason)
            }
        },
    )
    .await;

    // The reservation shrinks below the big task: the small one runs.
    let shrink = |cpu: f64| pb::UpdatePoolRequest {
        path: "/s".into(),
        spec: Some(pool_spec(cpu, 4096.0)),
        version: 0,
    };
    c.pools.update(shrink(2.5)).await.expect("shrink /s");
    wait_job(&c, &small.id, pb::JobState::Running).await;
    let t = get_task(&mut c, &big.id, 0).await;
    assert_eq!(task_state(&t), pb::TaskState::Pending);
    let reason = t.pending_reason;
    for words in [
        "can never be admitted as its pool is now",
        "3 cores",
        "2.5 cores",
        "reservation",
        "change the pool",
    ] {
        assert!(reason.contains(words), "no {words:?} in: {reason}");
    }

    // Grown again, the pool admits it.
    c.pools.update(shrink(6.0)).await.expect("grow /s");
    wait_job(&c, &big.id, pb::JobState::Running).await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_trimmed_revision_is_refused_before_the_stream_starts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = common::config(dir.path(), 2);
    config.event_retention = 10;
    let server = within("start", peloton_gateway::server::start(&config))
        .await
        .expect("server");
    let mut c = Clients::connect(server.addr).await;
    create_reserved_pool(&mut c, "/t").await;
    let job = create_job(&mut c, job_spec("/t", 10, 0.1, 0)).await;
    wait_job(&c, &job.id, pb::JobState::Succeeded).await;

    // gRPC: the call itself is refused (no stream whose first item is the
    // error), naming the oldest revision kept.
    let message = refused(
        within(
            "a watch from a trimmed revision",
            c.watch.watch(pb::WatchRequest {
                from_revision: 1,
                job_id: String::new(),
            }),
        )
        .await,
        Code::OutOfRange,
        "from_revision",
    );
    assert!(message.contains("no longer kept"), "{message}");
    let oldest: u64 = message
        .split("the oldest kept is ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no oldest revision in: {message}"));
    assert!(oldest > 1, "{message}");

    // HTTP: the answer's status says so.
    let answer = https_request(
        server.addr,
        format!(
            "GET /v1/watch?fromRevision=1 HTTP/1.1\r\nHost: x\r\n{}Connection: close\r\n\r\n",
            admin_header()
        )
        .as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("OUT_OF_RANGE"), "{answer}");

    // From the oldest kept revision (when the retention kept nothing, the
    // next one), the watch replays, then goes on live.
    let mut stream = c
        .watch
        .watch(pb::WatchRequest {
            from_revision: oldest,
            job_id: String::new(),
        })
        .await
        .expect("a watch from the oldest kept revision")
        .into_inner();
    create_job(&mut c, job_spec("/t", 1, 0.1, 0)).await;
    let events = collect_events(&mut stream, |e| !e.is_empty()).await;
    assert_eq!(events[0].revision, oldest);
    drop(stream);
    tokio::time::timeout(Duration::from_secs(30), server.shutdown())
        .await
        .expect("shutdown in time")
        .expect("shutdown");
}

/// A call with more metadata than the server takes (64 KiB) fails alone,
/// with RESOURCE_EXHAUSTED naming the limit: the connection stays up (a
/// watch open on it goes on) and the next call on it succeeds. (Above
/// about 1 MiB h2 itself refuses the stream, with 431, and above about
/// 1.25 MiB as sent it closes the connection: see
/// `server::MAX_HEADER_LIST_BYTES`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_metadata_fails_the_call_not_the_connection() {
    let s = TestServer::start(1).await;
    let addr = s.server.as_ref().expect("running").addr;
    // One connection for everything below.
    let channel = tls_endpoint(addr).connect().await.expect("connect");
    let mut c = Clients::with_channel(with_token(channel, ADMIN_TOKEN));
    let mut watch = c
        .watch
        .watch(pb::WatchRequest::default())
        .await
        .expect("watch")
        .into_inner();
    // One large entry, then many small ones (not compressible to less
    // than the limit on the wire: HPACK's Huffman code packs letters).
    let text = |n: usize| -> String {
        (0..n)
            .map(|i| char::from(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"[i * 7 % 46]))
            .collect()
    };
    let large: Vec<Vec<(String, String)>> = vec![
        vec![("x-padding".into(), text(100 * 1024))],
        vec![("x-padding".into(), text(900 * 1024))],
        (0..2000)
            .map(|i| (format!("x-padding-{i}"), text(64)))
            .collect(),
    ];
    for (n, entries) in large.iter().enumerate() {
        let mut request = tonic::Request::new(pb::ListHostsRequest::default());
        for (k, v) in entries {
            request.metadata_mut().insert(
                tonic::metadata::MetadataKey::from_bytes(k.as_bytes()).expect("a key"),
                v.parse().expect("a value"),
            );
        }
        let answer = c.hosts.list(request).await.map(drop);
        assert_status(answer, Code::ResourceExhausted, "request metadata");
        // The next call on the connection succeeds.
        c.hosts
            .list(pb::ListHostsRequest::default())
            .await
            .unwrap_or_else(|e| panic!("the call after oversize metadata #{n}: {e:?}"));
    }
    // Over HTTP/1.1, 431 in the mirror's error shape.
    let answer = https_request(
        addr,
        format!(
            "GET /v1/hosts HTTP/1.1\r\nHost: localhost\r\n{}X-Padding: {}\r\nConnection: close\r\n\r\n",
            admin_header(),
            text(100 * 1024)
        )
        .as_bytes(),
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 431 ") && answer.contains("request metadata: "),
        "{answer}"
    );
    // The watch opened before is still up: it sees a new job.
    create_reserved_pool(&mut c, "/m").await;
    let job = create_job(&mut c, job_spec("/m", 1, 0.1, 0)).await;
    collect_events(&mut watch, |events| {
        events
            .iter()
            .any(|e| matches!(&e.kind, Some(pb::event::Kind::Job(j)) if j.job_id == job.id))
    })
    .await;
    drop(watch);
    s.shutdown().await;
}
