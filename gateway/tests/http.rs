//! The JSON/HTTP mirror, driven with a minimal HTTP/1.1 client over TLS
//! (with the admin's bearer token) against a real, secure server: the
//! same scenarios through gRPC and through HTTP give the same answers,
//! errors carry the gRPC code name and the matching HTTP status, and
//! streams arrive as JSON lines or server-sent events.

mod common;

use std::time::Duration;

use common::*;
use peloton_proto::v1 as pb;
use prost_reflect::{DescriptorPool, DynamicMessage};
use serde_json::{Value as Json, json};

/// An HTTP/1.1 client of one server, over TLS (as the secure server
/// wants), one connection per call, sending a bearer token.
#[derive(Clone)]
struct Http {
    addr: std::net::SocketAddr,
    token: Option<String>,
}

/// An HTTP answer: status and JSON body.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Json,
}

impl Answer {
    /// The gRPC code name and message of an error answer.
    fn error(&self) -> (&str, &str) {
        let e = &self.body["error"];
        (
            e["status"]
                .as_str()
                .unwrap_or_else(|| panic!("not an error: {self:?}")),
            e["message"].as_str().expect("message"),
        )
    }
    fn ok(self) -> Json {
        assert_eq!(self.status, 200, "{:?}", self.body);
        self.body
    }
}

/// An answer's head: status, headers (names in lower case) and what came
/// after them.
fn split_head(raw: &str) -> (u16, Vec<(String, String)>, &str) {
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers in: {raw:.2000}"));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP/1.1 status line: {status_line:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A chunked body's content.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body
            .split_once("\r\n")
            .unwrap_or_else(|| panic!("a chunk without its size line: {body:.200}"));
        let size = usize::from_str_radix(size.split(';').next().unwrap_or_default().trim(), 16)
            .unwrap_or_else(|e| panic!("chunk size {size:?}: {e}"));
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = rest[size..]
            .strip_prefix("\r\n")
            .expect("a chunk ends with CRLF");
    }
}

impl Http {
    /// A client sending the admin token.
    fn new(addr: std::net::SocketAddr) -> Http {
        Http {
            addr,
            token: Some(ADMIN_TOKEN.to_string()),
        }
    }

    /// A client sending no token.
    fn anonymous(addr: std::net::SocketAddr) -> Http {
        Http { addr, token: None }
    }

    /// The request line and headers of a call (body excluded).
    fn head(&self, method: &str, path: &str, extra: &str) -> String {
        let auth = self
            .token
            .as_ref()
            .map(|t| format!("authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}{extra}Connection: close\r\n\r\n"
        )
    }

    /// One call with a JSON body (or none).
    async fn call(&self, method: &str, path: &str, body: Option<Json>) -> Answer {
        self.send(method, path, body.map(|b| b.to_string())).await
    }

    /// One call with `body` as it is.
    async fn raw(&self, method: &str, path: &str, body: String) -> Answer {
        self.send(method, path, Some(body)).await
    }

    async fn send(&self, method: &str, path: &str, body: Option<String>) -> Answer {
        let extra = match &body {
            Some(b) => format!(
                "content-type: application/json\r\ncontent-length: {}\r\n",
                b.len()
            ),
            None => String::new(),
        };
        let mut request = self.head(method, path, &extra).into_bytes();
        if let Some(b) = body {
            request.extend_from_slice(b.as_bytes());
        }
        let raw = https_request(self.addr, &request).await;
        let (status, headers, rest) = split_head(&raw);
        let text = if header(&headers, "transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            dechunk(rest)
        } else {
            rest.to_string()
        };
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}: {text:.2000}"));
        Answer { status, body }
    }
}

/// Decodes canonical JSON into a generated message (through the proto's
/// descriptors, independently of the server's transcoding).
fn decode<T: prost::Message + Default>(name: &str, json: &Json) -> T {
    let pool = DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET).expect("descriptors");
    let desc = pool
        .get_message_by_name(&format!("peloton.v1.{name}"))
        .unwrap_or_else(|| panic!("no message {name}"));
    DynamicMessage::deserialize(desc, json)
        .unwrap_or_else(|e| panic!("{name}: {e}: {json}"))
        .transcode_to::<T>()
        .expect("transcode")
}

fn job_json(pool: &str, instances: u32, duration_ms: u64) -> Json {
    json!({
        "spec": {
            "name": "http-job",
            "owner": "tests",
            "type": "JOB_TYPE_BATCH",
            "pool": pool,
            "instanceCount": instances,
            "defaultTask": {
                "command": "/bin/true",
                "resources": {"cpu": 0.5, "memoryMb": 256},
                "sim": {"durationMs": duration_ms, "exitCode": 0},
            },
        }
    })
}

#[tokio::test]
async fn http_and_grpc_give_the_same_answers() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    let http = Http::new(s.server.as_ref().expect("running").addr);

    // Pools: created over HTTP, read both ways.
    let created = http
        .call(
            "POST",
            "/v1/pools",
            Some(json!({"path": "/p", "spec": {"reservation": {"cpu": 4, "memoryMb": 2048}}})),
        )
        .await
        .ok();
    let via_http: pb::GetPoolResponse = decode(
        "GetPoolResponse",
        &http.call("GET", "/v1/pools/p", None).await.ok(),
    );
    let via_grpc = c
        .pools
        .get(pb::GetPoolRequest { path: "/p".into() })
        .await
        .expect("get pool")
        .into_inner();
    assert_eq!(
        via_http.pool.as_ref().expect("pool").spec,
        via_grpc.pool.as_ref().expect("pool").spec
    );
    assert_eq!(
        via_http.pool.as_ref().expect("pool").version,
        via_grpc.pool.as_ref().expect("pool").version
    );
    let created: pb::CreatePoolResponse = decode("CreatePoolResponse", &created);
    assert_eq!(created.pool.expect("pool").path, "/p");

    // Nested pool paths keep their leading '/'.
    http.call(
        "POST",
        "/v1/pools",
        Some(json!({"path": "/p/child", "spec": {"reservation": {"cpu": 2, "memoryMb": 1024}}})),
    )
    .await
    .ok();
    let child = http.call("GET", "/v1/pools/p/child", None).await.ok();
    assert_eq!(child["pool"]["path"], "/p/child");
    let listed: pb::ListPoolsResponse = decode(
        "ListPoolsResponse",
        &http.call("GET", "/v1/pools", None).await.ok(),
    );
    let mut http_paths: Vec<String> = listed.pools.iter().map(|p| p.path.clone()).collect();
    let mut grpc_paths: Vec<String> = list_pools(&mut c)
        .await
        .iter()
        .map(|p| p.path.clone())
        .collect();
    http_paths.sort();
    grpc_paths.sort();
    assert_eq!(http_paths, grpc_paths);

    // A job created over HTTP has the spec a gRPC client reads, and a
    // gRPC-created job with that spec reads the same over HTTP.
    let job = http
        .call("POST", "/v1/jobs", Some(job_json("/p/child", 3, 600_000)))
        .await
        .ok();
    let id = job["job"]["id"].as_str().expect("id").to_string();
    let grpc_job = get_job(&mut c, &id).await.expect("get job");
    let http_job: pb::GetJobResponse = decode(
        "GetJobResponse",
        &http.call("GET", &format!("/v1/jobs/{id}"), None).await.ok(),
    );
    assert_eq!(http_job.job.as_ref().expect("job").spec, grpc_job.spec);
    assert_eq!(
        http_job.job.as_ref().expect("job").version,
        grpc_job.version
    );
    // (Its twin has a name of its own: a pool's unfinished jobs have
    // distinct names.)
    let twin_spec = pb::JobSpec {
        name: "http-job-twin".into(),
        ..grpc_job.spec.clone().expect("spec")
    };
    let twin = create_job(&mut c, twin_spec.clone()).await;
    let twin_http: pb::GetJobResponse = decode(
        "GetJobResponse",
        &http
            .call("GET", &format!("/v1/jobs/{}", twin.id), None)
            .await
            .ok(),
    );
    assert_eq!(twin_http.job.expect("job").spec, Some(twin_spec));

    // Query with filters in the query string.
    let q: pb::QueryJobsResponse = decode(
        "QueryJobsResponse",
        &http
            .call(
                "GET",
                "/v1/jobs?pool=/p/child&states=JOB_STATE_PENDING&states=JOB_STATE_RUNNING",
                None,
            )
            .await
            .ok(),
    );
    let mut ids: Vec<String> = q.jobs.iter().map(|j| j.id.clone()).collect();
    ids.sort();
    let mut want = vec![id.clone(), twin.id.clone()];
    want.sort();
    assert_eq!(ids, want);

    // The same refusals, word for word.
    let stale = json!({"instanceCount": 6, "version": "1"});
    // A scale moves the job past version 1, which is then stale.
    c.jobs
        .scale(pb::ScaleJobRequest {
            id: id.clone(),
            instance_count: 5,
            version: 0,
        })
        .await
        .expect("scale");
    let grpc_err = c
        .jobs
        .scale(pb::ScaleJobRequest {
            id: id.clone(),
            instance_count: 6,
            version: 1,
        })
        .await
        .expect_err("stale version");
    let a = http
        .call("POST", &format!("/v1/jobs/{id}/scale"), Some(stale))
        .await;
    assert_eq!(a.status, 400);
    assert_eq!(a.error(), ("FAILED_PRECONDITION", grpc_err.message()));

    let missing = "00000000-0000-0000-0000-000000000000";
    let grpc_err = get_job(&mut c, missing).await.expect_err("missing job");
    let a = http.call("GET", &format!("/v1/jobs/{missing}"), None).await;
    assert_eq!(a.status, 404);
    assert_eq!(a.error(), ("NOT_FOUND", grpc_err.message()));

    let mut bad = job_json("/p/child", 1, 10);
    bad["spec"]["defaultTask"]["resources"]["cpu"] = json!(-1);
    let grpc_err = c
        .jobs
        .create(decode::<pb::CreateJobRequest>("CreateJobRequest", &bad))
        .await
        .expect_err("negative cpu");
    let a = http.call("POST", "/v1/jobs", Some(bad)).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.error(), ("INVALID_ARGUMENT", grpc_err.message()));

    // Kill over HTTP; both sides see the same tasks.
    http.call("POST", &format!("/v1/jobs/{id}/kill"), Some(json!({})))
        .await
        .ok();
    wait_job(&c, &id, pb::JobState::Killed).await;
    let grpc_tasks = list_tasks(&mut c, &id).await;
    let http_tasks: pb::ListTasksResponse = decode(
        "ListTasksResponse",
        &http
            .call("GET", &format!("/v1/jobs/{id}/tasks"), None)
            .await
            .ok(),
    );
    assert_eq!(http_tasks.tasks, grpc_tasks);
    let one: pb::GetTaskResponse = decode(
        "GetTaskResponse",
        &http
            .call("GET", &format!("/v1/jobs/{id}/tasks/1"), None)
            .await
            .ok(),
    );
    // A read of one task adds its ended runs' accounts (lists do not).
    let mut one = one.task.expect("task");
    assert_eq!(one.usage.len(), 1, "{one:?}");
    one.usage.clear();
    assert_eq!(one, grpc_tasks[1]);

    // Hosts.
    let hosts: pb::ListHostsResponse = decode(
        "ListHostsResponse",
        &http.call("GET", "/v1/hosts", None).await.ok(),
    );
    let mut names: Vec<String> = hosts.hosts.iter().map(|h| h.name.clone()).collect();
    let mut grpc_names: Vec<String> = list_hosts(&mut c)
        .await
        .iter()
        .map(|h| h.name.clone())
        .collect();
    names.sort();
    grpc_names.sort();
    assert_eq!(names, grpc_names);
    assert_eq!(names.len(), 2);

    // Delete over HTTP: gone for gRPC too.
    http.call("DELETE", &format!("/v1/jobs/{id}"), None)
        .await
        .ok();
    let e = get_job(&mut c, &id).await.expect_err("deleted");
    assert_eq!(e.code(), tonic::Code::NotFound);
    s.shutdown().await;
}

/// A plan over the mirror carries whom the job would preempt, as gRPC's
/// answer does (`victims`, each with `jobId`, `atMs` and the rest).
#[tokio::test]
async fn a_plan_over_http_names_its_victims() {
    let s = TestServer::start(2).await;
    let mut c = s.clients.clone();
    let http = Http::new(s.server.as_ref().expect("running").addr);
    let total = cluster_capacity(&mut c).await;
    create_pool(&mut c, "/prod", pool_spec(total.cpu, total.memory_mb)).await;
    create_pool(&mut c, "/batch", pool_spec(0.0, 0.0)).await;
    let n = total.cpu as u32;
    let mut batch = job_spec("/batch", n, 1.0, 600_000);
    batch.sla = Some(pb::Sla {
        preemptible: true,
        ..Default::default()
    });
    let batch = create_job(&mut c, batch).await;
    wait_job_where(&c, &batch.id, "batch to fill the cluster", |j| {
        count_in(j, pb::TaskState::Running) == n
    })
    .await;
    let mut plan = job_json("/prod", 2, 1_000);
    plan["spec"]["defaultTask"]["resources"]["cpu"] = json!(1);
    let answer = http
        .call("POST", "/v1/jobs/plan", Some(plan.clone()))
        .await
        .ok();
    let victims = answer["victims"].as_array().expect("victims");
    assert_eq!(victims.len(), 2, "{answer:#}");
    assert_eq!(victims[0]["jobId"], json!(batch.id), "{answer:#}");
    assert_eq!(victims[0]["pool"], json!("/batch"), "{answer:#}");
    let via_http: pb::PlanJobResponse = decode("PlanJobResponse", &answer);
    let via_grpc = c
        .jobs
        .plan(decode::<pb::PlanJobRequest>("PlanJobRequest", &plan))
        .await
        .expect("planned")
        .into_inner();
    let key = |v: &pb::PlannedVictim| (v.job_id.clone(), v.instance, v.host.clone(), v.priority);
    assert_eq!(
        via_http.victims.iter().map(key).collect::<Vec<_>>(),
        via_grpc.victims.iter().map(key).collect::<Vec<_>>()
    );
    s.shutdown().await;
}

#[tokio::test]
async fn http_errors_name_the_code_and_the_status() {
    let s = TestServer::start(1).await;
    let http = Http::new(s.server.as_ref().expect("running").addr);

    let a = http.call("GET", "/v1/nothing-here", None).await;
    assert_eq!((a.status, a.error().0), (404, "NOT_FOUND"));
    // A call without a token is refused before its service sees it.
    let a = Http::anonymous(http.addr)
        .call("GET", "/v1/jobs", None)
        .await;
    assert_eq!((a.status, a.error().0), (401, "UNAUTHENTICATED"), "{a:?}");
    assert!(a.error().1.contains("no token"), "{a:?}");
    let a = http.call("PATCH", "/v1/jobs", None).await;
    assert_eq!((a.status, a.error().0), (405, "UNIMPLEMENTED"));
    let a = http.raw("POST", "/v1/jobs", "{not json".into()).await;
    assert_eq!((a.status, a.error().0), (400, "INVALID_ARGUMENT"));
    assert!(a.error().1.contains("not JSON"), "{a:?}");
    let a = http.call("POST", "/v1/jobs", Some(json!([1, 2]))).await;
    assert_eq!((a.status, a.error().0), (400, "INVALID_ARGUMENT"));
    // An unknown field is named with its path.
    let mut j = job_json("/", 1, 1);
    j["spec"]["defaultTask"]["image"] = json!("docker.io/x");
    let a = http.call("POST", "/v1/jobs", Some(j)).await;
    assert_eq!((a.status, a.error().0), (400, "INVALID_ARGUMENT"));
    assert!(
        a.error().1.contains("spec.defaultTask") && a.error().1.contains("image"),
        "{a:?}"
    );
    // A field of the wrong type is named too.
    let mut j = job_json("/", 1, 1);
    j["spec"]["instanceCount"] = json!("many");
    let a = http.call("POST", "/v1/jobs", Some(j)).await;
    assert!(a.error().1.contains("spec.instanceCount"), "{a:?}");
    // Query parameters: unknown ones and unknown enum names are refused.
    let a = http.call("GET", "/v1/jobs?colour=red", None).await;
    assert_eq!((a.status, a.error().0), (400, "INVALID_ARGUMENT"));
    assert!(a.error().1.contains("colour"), "{a:?}");
    let a = http
        .call("GET", "/v1/jobs?states=JOB_STATE_ASLEEP", None)
        .await;
    assert_eq!((a.status, a.error().0), (400, "INVALID_ARGUMENT"));
    // A GET takes no body.
    let a = http
        .raw("GET", "/v1/jobs", "{\"pool\": \"/\"}".into())
        .await;
    assert_eq!((a.status, a.error().0), (400, "INVALID_ARGUMENT"));
    // An oversize body is refused before it is parsed; the message is short.
    let big = format!("{{\"spec\": {{\"name\": \"{}\"}}}}", "x".repeat(33 << 20));
    let a = http.raw("POST", "/v1/jobs", big).await;
    assert_eq!((a.status, a.error().0), (413, "RESOURCE_EXHAUSTED"));
    assert!(a.error().1.len() < 200);
    // The service's own contract holds over HTTP: a megabyte name gets a
    // short message naming the field; a watch from a future revision is
    // OUT_OF_RANGE at once instead of a stream that never speaks.
    let mut j = job_json("/", 1, 1);
    j["spec"]["name"] = json!("n".repeat(1 << 20));
    let a = http.call("POST", "/v1/jobs", Some(j)).await;
    assert_eq!((a.status, a.error().0), (400, "INVALID_ARGUMENT"));
    assert!(
        a.error().1.len() <= 1024 && a.error().1.contains("spec.name"),
        "{a:?}"
    );
    let a = http
        .call("GET", "/v1/watch?fromRevision=1000000", None)
        .await;
    assert_eq!((a.status, a.error().0), (400, "OUT_OF_RANGE"));
    let a = http.call("GET", "/v1/jobs?pageToken=forged", None).await;
    assert_eq!((a.status, a.error().0), (400, "INVALID_ARGUMENT"));
    // Query parameters: only on calls without a body, each scalar once.
    let a = http
        .call("POST", "/v1/jobs?pool=/", Some(job_json("/", 1, 1)))
        .await;
    assert_eq!((a.status, a.error().0), (400, "INVALID_ARGUMENT"));
    assert!(a.error().1.contains("JSON body"), "{a:?}");
    let a = http.call("GET", "/v1/jobs?pool=/a&pool=/b", None).await;
    assert_eq!((a.status, a.error().0), (400, "INVALID_ARGUMENT"));
    assert!(a.error().1.contains("set twice"), "{a:?}");
    // Nothing was created by any of these.
    let q = http.call("GET", "/v1/jobs", None).await.ok();
    assert_eq!(q["jobs"], json!([]));
    // The health check for HTTP probes.
    let a = http.call("GET", "/v1/health", None).await.ok();
    assert_eq!(a["status"], "SERVING");
    let a = http
        .call("GET", "/v1/health?service=peloton.v1.JobService", None)
        .await
        .ok();
    assert_eq!(a["status"], "SERVING");
    let a = http.call("GET", "/v1/health?service=nope", None).await;
    assert_eq!((a.status, a.error().0), (404, "NOT_FOUND"));
    // The index lists every binding.
    let index = http.call("GET", "/v1", None).await.ok();
    let routes = index["routes"].as_array().expect("routes");
    assert!(
        routes
            .iter()
            .any(|r| r["http"] == "POST /v1/jobs" && r["grpc"] == "peloton.v1.JobService/Create")
    );
    assert!(
        routes
            .iter()
            .any(|r| r["http"] == "GET /v1/watch" && r["streaming"] == true)
    );
    s.shutdown().await;
}

/// Reads a streaming answer line by line until `want` holds for the
/// collected lines; returns its content type and the lines as JSON.
async fn read_stream(
    http: &Http,
    path: &str,
    sse: bool,
    want: impl Fn(&[Json]) -> bool,
) -> (String, Vec<Json>) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let accept = if sse {
        "accept: text/event-stream\r\n"
    } else {
        ""
    };
    let mut stream = https_connect(http.addr)
        .await
        .unwrap_or_else(|e| panic!("connect over TLS: {e}"));
    stream
        .write_all(http.head("GET", path, accept).as_bytes())
        .await
        .expect("send");
    stream.flush().await.expect("send");
    let mut reader = tokio::io::BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await.expect("a header line");
        assert!(
            !line.is_empty(),
            "GET {path}: the answer ended in its headers: {head}"
        );
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    head.push_str("\r\n");
    let (status, headers, _) = split_head(&head);
    assert_eq!(status, 200, "GET {path}: {head}");
    let content_type = header(&headers, "content-type")
        .unwrap_or_default()
        .to_string();
    let chunked =
        header(&headers, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    // The body as it comes, cut into lines.
    let mut pending = Vec::new();
    let mut items = Vec::new();
    loop {
        if chunked {
            let mut size = String::new();
            reader.read_line(&mut size).await.expect("a chunk's size");
            let size = usize::from_str_radix(size.split(';').next().unwrap_or_default().trim(), 16)
                .unwrap_or_else(|e| panic!("chunk size {size:?}: {e}"));
            assert!(size > 0, "GET {path}: the stream ended after {items:?}");
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).await.expect("a chunk");
            pending.extend_from_slice(&chunk[..size]);
        } else {
            let mut buf = [0u8; 4096];
            let n = reader.read(&mut buf).await.expect("the body");
            assert!(n > 0, "GET {path}: the stream ended after {items:?}");
            pending.extend_from_slice(&buf[..n]);
        }
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8(line).expect("UTF-8");
            let line = line.trim_end_matches(['\r', '\n']);
            let text = if sse {
                match line.strip_prefix("data: ") {
                    Some(t) => t,
                    None => continue,
                }
            } else {
                line
            };
            items.push(serde_json::from_str(text).expect("json line"));
            if want(&items) {
                return (content_type, items);
            }
        }
    }
}

fn saw_task_state(items: &[Json], state: &str) -> bool {
    items.iter().any(|m| {
        m["events"]
            .as_array()
            .is_some_and(|evs| evs.iter().any(|e| e["task"]["state"] == state))
    })
}

#[tokio::test]
async fn watch_streams_json_lines_and_server_sent_events() {
    let s = TestServer::start(1).await;
    let http = Http::new(s.server.as_ref().expect("running").addr);
    let job = http
        .call("POST", "/v1/jobs", Some(job_json("/", 2, 50)))
        .await
        .ok();
    let id = job["job"]["id"].as_str().expect("id").to_string();
    wait_job(&s.clients, &id, pb::JobState::Succeeded).await;

    let h = http.clone();
    let path = format!("/v1/watch?fromRevision=1&jobId={id}");
    let (ct, items) = within(
        "the watch over HTTP",
        read_stream(&h, &path, false, |items| {
            saw_task_state(items, "TASK_STATE_SUCCEEDED")
        }),
    )
    .await;
    assert_eq!(ct, "application/x-ndjson");
    assert!(saw_task_state(&items, "TASK_STATE_PENDING"), "{items:?}");
    // Every event is this job's, in revision order.
    let revs: Vec<u64> = items
        .iter()
        .flat_map(|m| m["events"].as_array().cloned().unwrap_or_default())
        .map(|e| {
            let job = e["task"]["jobId"]
                .as_str()
                .or(e["job"]["jobId"].as_str())
                .unwrap_or_default()
                .to_string();
            assert_eq!(job, id);
            e["revision"]
                .as_str()
                .expect("64-bit integers are strings")
                .parse()
                .expect("revision")
        })
        .collect();
    assert!(revs.windows(2).all(|w| w[0] < w[1]), "{revs:?}");

    let h = http.clone();
    let path = format!("/v1/watch?from_revision=1&job_id={id}");
    let (ct, items) = within(
        "the watch as server-sent events",
        read_stream(&h, &path, true, |items| {
            saw_task_state(items, "TASK_STATE_SUCCEEDED")
        }),
    )
    .await;
    assert_eq!(ct, "text/event-stream");
    assert!(saw_task_state(&items, "TASK_STATE_SUCCEEDED"));

    // A live watch sees a job created after it opened.
    let h = http.clone();
    let live = tokio::spawn(async move {
        read_stream(&h, "/v1/watch", false, |items| {
            items.iter().any(|m| {
                m["events"].as_array().is_some_and(|evs| {
                    evs.iter()
                        .any(|e| e["job"]["state"] == "JOB_STATE_SUCCEEDED")
                })
            })
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let job = http
        .call("POST", "/v1/jobs", Some(job_json("/", 1, 10)))
        .await
        .ok();
    let second = job["job"]["id"].as_str().expect("id").to_string();
    let (_, items) = within("the live watch to see the new job finish", live)
        .await
        .expect("live watch");
    let last = items.last().expect("an event");
    assert!(last.to_string().contains(&second), "{last}");
    s.shutdown().await;
}

/// Every binding `GET /v1` lists reaches its service: the answer is the
/// service's (a result, or a refusal such as NOT_FOUND for a made-up id),
/// never the mirror's "no such route" or a wrong-method refusal.
#[tokio::test]
async fn every_route_reaches_its_service() {
    let s = TestServer::start(1).await;
    let http = Http::new(s.server.as_ref().expect("running").addr);
    let index = http.call("GET", "/v1", None).await.ok();
    let routes = index["routes"].as_array().expect("routes").clone();
    assert!(routes.len() >= 30, "{routes:?}");
    for r in routes {
        let (verb, template) = r["http"]
            .as_str()
            .expect("http")
            .split_once(' ')
            .expect("verb path");
        if r["streaming"] == true {
            continue; // Streams: see the watch test (and they would not end).
        }
        let path = template
            .replace("{path=**}", "no/such/pool")
            .replace("{instance}", "0")
            .replace("{id}", "nope")
            .replace("{job_id}", "nope")
            .replace("{name}", "nope")
            .replace("{to}", "nope")
            .replace("{host}", "nope")
            .replace("{fingerprint}", &"0".repeat(64))
            .replace("{app_id}", "nope");
        assert!(!path.contains('{'), "{path}");
        let body = (verb == "POST" || verb == "PUT").then(|| json!({}));
        let a = http.call(verb, &path, body).await;
        let grpc = r["grpc"].as_str().expect("grpc");
        if a.status != 200 {
            let (code, message) = a.error();
            assert!(
                !message.contains("no such route") && code != "UNIMPLEMENTED",
                "{verb} {path} ({grpc}): {a:?}"
            );
        }
    }
    s.shutdown().await;
}
