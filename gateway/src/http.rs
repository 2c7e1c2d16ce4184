//! The JSON/HTTP mirror of the gRPC API.
//!
//! Every RPC of the public services that carries a `google.api.http`
//! binding in `proto/peloton/v1/peloton.proto` is also served as JSON over
//! HTTP, on the gRPC port: `POST /v1/jobs`, `GET /v1/jobs/{id}`,
//! `GET /v1/pools`, … The route table is read at start-up from the
//! descriptor set compiled into `peloton-proto`; nothing here knows a
//! message's fields.
//!
//! A call is transcoded, not re-implemented:
//! 1. the JSON body, the path variables and the query parameters become one
//!    JSON object, which prost-reflect parses into the request message with
//!    protobuf's canonical JSON mapping (lowerCamelCase or proto field
//!    names; 64-bit integers as numbers or strings; enums by name or
//!    number; unknown fields refused);
//! 2. the message is encoded and handed, as a gRPC request, to the same
//!    tonic services the gRPC clients reach (in process, no socket), so
//!    validation, limits, versions and answers are the service's own;
//! 3. the answer is decoded and printed as canonical JSON (every field,
//!    defaults included); a refusal becomes
//!    `{"error": {"code": <HTTP status>, "status": "INVALID_ARGUMENT",
//!    "message": "..."}}` (the shape of Google's JSON APIs) with the HTTP
//!    status that matches the gRPC code.
//!
//! Server-streaming calls (`GET /v1/watch`, task logs) answer a stream of
//! JSON lines (`application/x-ndjson`), or server-sent events when the
//! client accepts `text/event-stream`; an error after the stream started is
//! its last line, `{"error": {...}}` (an `error` event for SSE). The stream
//! is pulled by the HTTP connection, so a client that stops reading stops
//! the gRPC stream behind it and the watch's own bound applies.
//!
//! A stream's first message is awaited briefly before the headers go out,
//! so an error that comes at once (a watch revision out of range, an
//! unknown run) answers with its own HTTP status.
//!
//! Path templates follow `google.api.http`: `{field}` binds one segment;
//! `{field=**}` binds the rest of the path. Pool paths are absolute, so a
//! `**` variable keeps the path's leading '/': `GET /v1/pools/batch/ml`
//! reads the pool `/batch/ml` (and `GET /v1/pools/` the root). Query
//! parameters set top-level fields of calls without a body, by proto or
//! JSON name (repeat a parameter for a repeated field; `labels.KEY=VALUE`
//! sets a map entry; a scalar set twice, a nested message field or a query
//! parameter on a call whose body is the request is refused).
//!
//! Limits: a body of at most [`MAX_JSON_BODY_BYTES`] (413
//! RESOURCE_EXHAUSTED beyond; the service's own message limit applies after
//! transcoding), and at most `BODY_BUDGET_MIB` of bodies held by all calls
//! together (a call waits for its share before reading its body).
//!
//! `GET /v1/health` is the standard gRPC health check for HTTP probes (200
//! when serving, 503 otherwise).

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor,
    SerializeOptions,
};
use serde_json::{Map, Value as Json};
use tonic::Code;

use crate::convert::shown;
use tonic::codegen::Service;
use tonic::service::Routes;

/// Largest JSON request body read (a JSON job spec is larger than its
/// protobuf form; the service's own message limit applies after
/// transcoding).
pub const MAX_JSON_BODY_BYTES: usize = 32 << 20;

/// Request bodies held by all mirror calls together, in MiB: a call takes
/// its body's size (rounded up; the full limit when the client does not say
/// it) before reading it, so many large bodies wait their turn instead of
/// growing memory without bound. Bounds memory, not speed: small calls
/// take one unit each.
const BODY_BUDGET_MIB: u32 = 128;

/// An oversize body is read and dropped up to this many bytes before the
/// refusal, so that the client, still writing, reads the answer instead of
/// a reset connection.
const MAX_DRAIN_BYTES: usize = 2 * MAX_JSON_BODY_BYTES;

/// How long a stream's first message is awaited before its headers are
/// sent: an error that comes at once (a bad revision, an unknown run) gets
/// its own HTTP status instead of a 200 with an error line.
const FIRST_MESSAGE_WAIT: std::time::Duration = std::time::Duration::from_millis(300);

/// One HTTP binding of an RPC.
#[derive(Debug)]
struct Binding {
    verb: Method,
    template: Vec<Segment>,
    /// "*" (the body is the request) or "" (no body; query parameters).
    body_is_request: bool,
    /// `/peloton.v1.JobService/Create`.
    grpc_path: String,
    /// `GET /v1/jobs/{id}`, for the index.
    pattern: String,
    input: MessageDescriptor,
    output: MessageDescriptor,
    streaming: bool,
}

#[derive(Debug, PartialEq)]
enum Segment {
    Literal(String),
    /// One path segment binds this field.
    Field(String),
    /// The rest of the path (with its leading '/') binds this field.
    Rest(String),
}

/// The mirror: its route table and the gRPC services it calls.
#[derive(Clone, Debug)]
pub struct Mirror {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    bindings: Vec<Binding>,
    grpc: Routes,
    body_budget: Arc<tokio::sync::Semaphore>,
}

/// A call refused before or by the service.
#[derive(Debug)]
struct Failure {
    code: Code,
    message: String,
    /// An HTTP status other than the code's usual one (413, 405).
    http: Option<StatusCode>,
}

impl Failure {
    fn new(code: Code, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: crate::status::truncate(&message.into(), crate::status::MAX_MESSAGE_BYTES)
                .into_owned(),
            http: None,
        }
    }
    /// An HTTP status other than the code's usual one.
    fn with_http(mut self, status: StatusCode) -> Failure {
        self.http = Some(status);
        self
    }
    fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(Code::InvalidArgument, message)
    }
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Failure {
        Failure::new(s.code(), s.message().to_string())
    }
}

impl Mirror {
    /// Reads the bindings of every service in `descriptors` (an encoded
    /// file descriptor set) and calls `grpc` to serve them.
    pub fn new(descriptors: &[u8], grpc: Routes) -> anyhow::Result<Mirror> {
        let pool = DescriptorPool::decode(descriptors)?;
        let http = pool
            .get_extension_by_name("google.api.http")
            .ok_or_else(|| anyhow::anyhow!("the descriptors lack google.api.http"))?;
        let mut bindings = Vec::new();
        for service in pool.services() {
            for method in service.methods() {
                let options = method.options();
                if !options.has_extension(&http) {
                    continue;
                }
                let rule = options.get_extension(&http);
                let Some(rule) = rule.as_message() else {
                    continue;
                };
                let (verb, path) = ["get", "put", "post", "delete", "patch"]
                    .iter()
                    .find_map(|v| {
                        let value = rule.get_field_by_name(v)?;
                        let path = value.as_str()?;
                        (!path.is_empty()).then(|| (*v, path.to_string()))
                    })
                    .ok_or_else(|| {
                        anyhow::anyhow!("{}: an HTTP rule without a verb", method.full_name())
                    })?;
                let body = rule
                    .get_field_by_name("body")
                    .and_then(|b| b.as_str().map(str::to_string))
                    .unwrap_or_default();
                if !body.is_empty() && body != "*" {
                    anyhow::bail!(
                        "{}: only body \"*\" or none is supported",
                        method.full_name()
                    );
                }
                let template = parse_template(&path)
                    .map_err(|e| anyhow::anyhow!("{}: {path}: {e}", method.full_name()))?;
                for s in &template {
                    if let Segment::Field(f) | Segment::Rest(f) = s
                        && method.input().get_field_by_name(f).is_none()
                    {
                        anyhow::bail!("{}: {path}: no field {f}", method.full_name());
                    }
                }
                let verb = Method::from_bytes(verb.to_ascii_uppercase().as_bytes())?;
                bindings.push(Binding {
                    pattern: format!("{verb} {path}"),
                    verb,
                    template,
                    body_is_request: body == "*",
                    grpc_path: format!("/{}/{}", service.full_name(), method.name()),
                    input: method.input(),
                    output: method.output(),
                    streaming: method.is_server_streaming(),
                });
            }
        }
        Ok(Mirror {
            inner: Arc::new(Inner {
                bindings,
                grpc,
                body_budget: Arc::new(tokio::sync::Semaphore::new(BODY_BUDGET_MIB as usize)),
            }),
        })
    }

    /// `(HTTP pattern, gRPC method)` of every binding, in proto order.
    pub fn routes(&self) -> impl Iterator<Item = (&str, &str)> {
        self.inner
            .bindings
            .iter()
            .map(|b| (b.pattern.as_str(), b.grpc_path.as_str()))
    }

    /// Adds the mirror's routes (`/v1/...`) to an axum router.
    pub fn mount(self, router: axum::Router) -> axum::Router {
        let index = self.clone();
        let health = self.clone();
        router
            .route(
                "/v1/health",
                axum::routing::get(move |req: Request<Body>| {
                    let m = health.clone();
                    async move { m.health(req.uri().query()).await }
                }),
            )
            .route(
                "/v1",
                axum::routing::get(move || {
                    let m = index.clone();
                    async move { m.index() }
                }),
            )
            .route(
                "/v1/{*rest}",
                axum::routing::any(move |req: Request<Body>| {
                    let m = self.clone();
                    async move { Ok::<_, Infallible>(m.handle(req).await) }
                }),
            )
    }

    /// `GET /v1`: the route table, so a client can discover the API.
    fn index(&self) -> Response<Body> {
        let routes: Vec<Json> = self
            .inner
            .bindings
            .iter()
            .map(|b| {
                serde_json::json!({
                    "http": b.pattern,
                    "grpc": b.grpc_path.trim_start_matches('/'),
                    "streaming": b.streaming,
                })
            })
            .collect();
        json_response(StatusCode::OK, &serde_json::json!({ "routes": routes }))
    }

    /// `GET /v1/health[?service=peloton.v1.JobService]`: the standard gRPC
    /// health check, for load balancers and HTTP probes: 200 and
    /// `{"status": "SERVING"}`, or 503 with the status.
    async fn health(&self, query: Option<&str>) -> Response<Body> {
        use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse, health_check_response};
        let mut service = String::new();
        for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            if k != "service" {
                return error_response(&Failure::invalid(format!(
                    "query parameter {}: only service is accepted",
                    shown(&k)
                )));
            }
            service = v.into_owned();
        }
        let request = HealthCheckRequest { service };
        let answer = async {
            let mut frames = self
                .invoke_path(
                    "/grpc.health.v1.Health/Check",
                    request.encode_to_vec(),
                    Credentials::default(),
                )
                .await?;
            let message = frames
                .next()
                .await
                .ok_or_else(|| Failure::new(Code::Internal, "the service sent no answer"))??;
            HealthCheckResponse::decode(message)
                .map_err(|e| Failure::new(Code::Internal, format!("undecodable answer: {e}")))
        };
        match answer.await {
            Ok(r) => {
                let status = health_check_response::ServingStatus::try_from(r.status)
                    .unwrap_or(health_check_response::ServingStatus::Unknown);
                let http = if status == health_check_response::ServingStatus::Serving {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                json_response(http, &serde_json::json!({ "status": status.as_str_name() }))
            }
            Err(f) => error_response(&f),
        }
    }

    async fn handle(&self, req: Request<Body>) -> Response<Body> {
        match self.call(req).await {
            Ok(r) => r,
            Err(f) => error_response(&f),
        }
    }

    async fn call(&self, req: Request<Body>) -> Result<Response<Body>, Failure> {
        let (parts, body) = req.into_parts();
        let segments: Vec<String> = parts
            .uri
            .path()
            .split('/')
            .skip(1)
            .map(|s| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8()
                    .map(|c| c.into_owned())
                    .map_err(|_| Failure::invalid("the URL path is not UTF-8"))
            })
            .collect::<Result<_, _>>()?;
        let mut path_matched = false;
        let mut found = None;
        for b in &self.inner.bindings {
            if let Some(vars) = match_template(&b.template, &segments) {
                path_matched = true;
                if b.verb == parts.method {
                    found = Some((b, vars));
                    break;
                }
            }
        }
        let Some((binding, vars)) = found else {
            return Err(if path_matched {
                Failure::new(
                    Code::Unimplemented,
                    format!("{} is not served on this path", parts.method),
                )
                .with_http(StatusCode::METHOD_NOT_ALLOWED)
            } else {
                Failure::new(Code::NotFound, "no such route (GET /v1 lists them)")
            });
        };
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let units = declared
            .unwrap_or(MAX_JSON_BODY_BYTES)
            .min(MAX_JSON_BODY_BYTES)
            .div_ceil(1 << 20)
            .max(1);
        let _budget = self
            .inner
            .body_budget
            .clone()
            .acquire_many_owned(u32::try_from(units).unwrap_or(BODY_BUDGET_MIB))
            .await
            .map_err(|_| Failure::new(Code::Unavailable, "the server is stopping"))?;
        let body = read_body(body, units << 20).await?;
        let request = build_request(binding, &body, parts.uri.query(), vars)?;
        drop(body);
        let sse = accepts_sse(&parts.headers);
        // The caller's token goes with the call (checked by the services'
        // own authentication layer).
        // So does its client certificate, but not a browser's: a browser
        // presents a certificate it holds on any page's requests, so a
        // certificate would let another site's page act as its owner.
        // Browsers use tokens (the console does).
        let auth = Credentials {
            header: parts.headers.get(header::AUTHORIZATION).cloned(),
            tls: if from_a_browser(&parts.headers) {
                None
            } else {
                parts.extensions.get::<crate::access::TlsInfo>().cloned()
            },
        };
        let mut frames = self.invoke(binding, request.encode_to_vec(), auth).await?;
        drop(_budget);
        if binding.streaming {
            // An error that comes at once answers with its own status.
            let first = match tokio::time::timeout(FIRST_MESSAGE_WAIT, frames.next()).await {
                Ok(Some(Err(f))) => return Err(f),
                Ok(first) => Some(first),
                Err(_) => None,
            };
            return Ok(stream_response(frames, first, binding.output.clone(), sse));
        }
        let message = match frames.next().await {
            Some(m) => m?,
            None => return Err(Failure::new(Code::Internal, "the service sent no answer")),
        };
        // A unary call's status follows its message.
        if let Some(Err(e)) = frames.next().await {
            return Err(e);
        }
        let answer = DynamicMessage::decode(binding.output.clone(), message)
            .map_err(|e| Failure::new(Code::Internal, format!("undecodable answer: {e}")))?;
        Ok(json_response(StatusCode::OK, &to_json(&answer)))
    }

    /// Sends one encoded request to the gRPC service and returns its answer
    /// frames.
    async fn invoke(
        &self,
        binding: &Binding,
        message: Vec<u8>,
        auth: Credentials,
    ) -> Result<Frames, Failure> {
        self.invoke_path(&binding.grpc_path, message, auth).await
    }

    async fn invoke_path(
        &self,
        grpc_path: &str,
        message: Vec<u8>,
        auth: Credentials,
    ) -> Result<Frames, Failure> {
        let len = u32::try_from(message.len())
            .map_err(|_| Failure::new(Code::ResourceExhausted, "the request is too large"))?;
        let mut framed = BytesMut::with_capacity(5 + message.len());
        framed.put_u8(0);
        framed.put_u32(len);
        framed.put_slice(&message);
        let mut req = Request::builder();
        if let Some(header) = auth.header {
            req = req.header(header::AUTHORIZATION, header);
        }
        if let Some(tls) = auth.tls {
            req = req.extension(tls);
        }
        let req = req
            .method(Method::POST)
            .uri(grpc_path)
            .version(axum::http::Version::HTTP_2)
            .header(header::CONTENT_TYPE, "application/grpc")
            .header("te", "trailers")
            .body(Body::from(framed.freeze()))
            .map_err(|e| Failure::new(Code::Internal, e.to_string()))?;
        let mut grpc = self.inner.grpc.clone();
        let resp = match grpc.call(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        // A call refused at once answers with its status in the headers.
        if let Some(status) = tonic::Status::from_header_map(resp.headers())
            && status.code() != Code::Ok
        {
            return Err(status.into());
        }
        Ok(Frames {
            body: resp.into_body(),
            buf: BytesMut::new(),
            done: false,
        })
    }
}

/// The length-prefixed messages of a gRPC answer body, then its status.
struct Frames {
    body: tonic::body::Body,
    buf: BytesMut,
    done: bool,
}

impl Frames {
    /// The next message; `None` at a clean end; an error for a non-OK
    /// status.
    async fn next(&mut self) -> Option<Result<Bytes, Failure>> {
        loop {
            if self.buf.len() >= 5 {
                let compressed = self.buf[0];
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if compressed != 0 {
                    self.done = true;
                    return Some(Err(Failure::new(Code::Internal, "a compressed answer")));
                }
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    return Some(Ok(self.buf.split_to(len).freeze()));
                }
            }
            if self.done {
                return None;
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if frame.is_data() {
                        if let Ok(data) = frame.into_data() {
                            self.buf.extend_from_slice(&data);
                        }
                    } else if let Ok(trailers) = frame.into_trailers() {
                        self.done = true;
                        if let Some(s) = tonic::Status::from_header_map(&trailers)
                            && s.code() != Code::Ok
                        {
                            return Some(Err(s.into()));
                        }
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(Failure::new(Code::Internal, e.to_string())));
                }
                None => {
                    self.done = true;
                    if !self.buf.is_empty() {
                        return Some(Err(Failure::new(Code::Internal, "a truncated answer")));
                    }
                    return None;
                }
            }
        }
    }
}

/// The request body, at most `limit` bytes. A larger body is read on and
/// dropped (up to [`MAX_DRAIN_BYTES`]) before the refusal, so that the
/// client reads the answer rather than a reset.
async fn read_body(mut body: Body, limit: usize) -> Result<Bytes, Failure> {
    let mut buf = BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| Failure::invalid(format!("reading the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len();
        if seen <= limit {
            buf.extend_from_slice(&data);
        } else {
            buf = BytesMut::new();
            if seen > MAX_DRAIN_BYTES {
                break;
            }
        }
    }
    if seen > limit {
        return Err(Failure::new(
            Code::ResourceExhausted,
            if limit < MAX_JSON_BODY_BYTES {
                format!("the request body is longer than its Content-Length ({limit} bytes)")
            } else {
                format!("the request body is larger than {MAX_JSON_BODY_BYTES} bytes")
            },
        )
        .with_http(StatusCode::PAYLOAD_TOO_LARGE));
    }
    Ok(buf.freeze())
}

fn parse_template(path: &str) -> Result<Vec<Segment>, String> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err("must start with '/'".into());
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let mut out = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        if let Some(var) = p.strip_prefix('{').and_then(|v| v.strip_suffix('}')) {
            match var.split_once('=') {
                None => out.push(Segment::Field(var.to_string())),
                Some((field, "**")) if i + 1 == parts.len() => {
                    out.push(Segment::Rest(field.to_string()));
                }
                Some((_, pattern)) => {
                    return Err(format!("unsupported variable pattern {pattern}"));
                }
            }
        } else if p.contains(['{', '}', '*']) {
            return Err(format!("unsupported segment {p}"));
        } else {
            out.push(Segment::Literal((*p).to_string()));
        }
    }
    Ok(out)
}

/// The variables bound by `template` on `segments`, if it matches.
fn match_template(template: &[Segment], segments: &[String]) -> Option<Vec<(String, String)>> {
    let mut vars = Vec::new();
    for (i, t) in template.iter().enumerate() {
        match t {
            Segment::Literal(l) => {
                if segments.get(i)? != l {
                    return None;
                }
            }
            Segment::Field(f) => {
                let s = segments.get(i)?;
                if s.is_empty() {
                    return None;
                }
                vars.push((f.clone(), s.clone()));
            }
            Segment::Rest(f) => {
                if segments.len() <= i {
                    return None;
                }
                vars.push((f.clone(), format!("/{}", segments[i..].join("/"))));
                return Some(vars);
            }
        }
    }
    (segments.len() == template.len()).then_some(vars)
}

/// The request message: the body (for `body: "*"`), then query
/// parameters, then path variables, parsed together as canonical JSON.
fn build_request(
    binding: &Binding,
    body: &[u8],
    query: Option<&str>,
    vars: Vec<(String, String)>,
) -> Result<DynamicMessage, Failure> {
    let desc = &binding.input;
    let mut object = if binding.body_is_request && !body.iter().all(u8::is_ascii_whitespace) {
        match serde_json::from_slice::<Json>(body) {
            Ok(Json::Object(m)) => m,
            Ok(_) => return Err(Failure::invalid("the request body must be a JSON object")),
            Err(e) => {
                return Err(Failure::invalid(format!(
                    "the request body is not JSON: {e}"
                )));
            }
        }
    } else if !body.iter().all(u8::is_ascii_whitespace) {
        return Err(Failure::invalid(format!(
            "{} takes no body: pass its fields as query parameters",
            binding.pattern
        )));
    } else {
        Map::new()
    };
    let query = query.unwrap_or_default();
    if binding.body_is_request && !query.is_empty() {
        return Err(Failure::invalid(format!(
            "{} takes its fields in the JSON body, not as query parameters",
            binding.pattern
        )));
    }
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        set_param(desc, &mut object, &key, &value, true)?;
    }
    for (field, value) in vars {
        set_param(desc, &mut object, &field, &value, false)?;
    }
    let options = DeserializeOptions::new().deny_unknown_fields(true);
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(Json::Object(object), &mut track);
    DynamicMessage::deserialize_with_options(desc.clone(), de, &options).map_err(|e| {
        let path = track.path().to_string();
        if path.is_empty() || path == "." {
            Failure::invalid(format!("request: {e}"))
        } else {
            Failure::invalid(format!("{path}: {e}"))
        }
    })
}

/// Sets one field of the JSON request from a string parameter.
fn set_param(
    desc: &MessageDescriptor,
    object: &mut Map<String, Json>,
    key: &str,
    value: &str,
    from_query: bool,
) -> Result<(), Failure> {
    let what = if from_query {
        "query parameter"
    } else {
        "path variable"
    };
    let field_of = |name: &str| {
        desc.get_field_by_name(name)
            .or_else(|| desc.get_field_by_json_name(name))
    };
    if let Some(field) = field_of(key) {
        let name = field.json_name().to_string();
        let v =
            scalar(&field, value).map_err(|e| Failure::invalid(format!("{what} {key}: {e}")))?;
        if field.is_list() {
            match object
                .entry(name)
                .or_insert_with(|| Json::Array(Vec::new()))
            {
                Json::Array(items) => items.push(v),
                _ => return Err(Failure::invalid(format!("{what} {key}: set twice"))),
            }
        } else if field.is_map() {
            return Err(Failure::invalid(format!(
                "{what} {key}: a map field; use {key}.KEY=VALUE"
            )));
        } else if object.insert(name, v).is_some() {
            return Err(Failure::invalid(format!(
                "{what} {key}: set twice (it is not a repeated field)"
            )));
        }
        return Ok(());
    }
    if let Some((map, entry)) = key.split_once('.')
        && let Some(field) = field_of(map)
        && field.is_map()
        && let Kind::Message(m) = field.kind()
    {
        let v = scalar(&m.map_entry_value_field(), value)
            .map_err(|e| Failure::invalid(format!("{what} {key}: {e}")))?;
        let slot = object
            .entry(field.json_name().to_string())
            .or_insert_with(|| Json::Object(Map::new()));
        if let Json::Object(entries) = slot
            && entries.insert(entry.to_string(), v).is_some()
        {
            return Err(Failure::invalid(format!(
                "{what} {}: set twice",
                shown(key)
            )));
        }
        return Ok(());
    }
    Err(Failure::invalid(format!(
        "{what} {}: {} has no such field",
        shown(key),
        desc.name()
    )))
}

/// A parameter's text as the JSON value canonical parsing expects for
/// the field's type (integers and floats may be strings; booleans may not).
fn scalar(field: &FieldDescriptor, value: &str) -> Result<Json, String> {
    Ok(match field.kind() {
        Kind::Bool => match value {
            "true" | "1" | "" => Json::Bool(true),
            "false" | "0" => Json::Bool(false),
            _ => return Err(format!("{} is not true or false", shown(value))),
        },
        Kind::Enum(_) => match value.parse::<i64>() {
            Ok(n) => Json::from(n),
            Err(_) => Json::String(value.to_string()),
        },
        Kind::Message(m) => {
            return Err(format!("a message ({}); send it in a JSON body", m.name()));
        }
        _ => Json::String(value.to_string()),
    })
}

fn to_json(message: &DynamicMessage) -> Json {
    let options = SerializeOptions::new().skip_default_fields(false);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
}

fn accepts_sse(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

/// A streaming answer; `first` is the first message if it was already
/// read (`Some(None)`: the stream ended before any).
fn stream_response(
    frames: Frames,
    first: Option<Option<Result<Bytes, Failure>>>,
    output: MessageDescriptor,
    sse: bool,
) -> Response<Body> {
    let line = move |json: &Json, error: bool| -> Bytes {
        let text = json.to_string();
        Bytes::from(match (sse, error) {
            (true, false) => format!("data: {text}\n\n"),
            (true, true) => format!("event: error\ndata: {text}\n\n"),
            (false, _) => format!("{text}\n"),
        })
    };
    let stream = futures::stream::unfold((Some(frames), first), move |(state, first)| {
        let output = output.clone();
        async move {
            let mut frames = state?;
            let next = match first {
                Some(first) => first,
                None => frames.next().await,
            };
            let item = match next? {
                Ok(bytes) => match DynamicMessage::decode(output, bytes) {
                    Ok(m) => Some(line(&to_json(&m), false)),
                    Err(e) => {
                        let f = Failure::new(Code::Internal, format!("undecodable answer: {e}"));
                        return Some((
                            Ok::<_, Infallible>(line(&error_json(&f), true)),
                            (None, None),
                        ));
                    }
                },
                Err(f) => return Some((Ok(line(&error_json(&f), true)), (None, None))),
            };
            item.map(|b| (Ok(b), (Some(frames), None)))
        }
    });
    let content_type = if sse {
        "text/event-stream"
    } else {
        "application/x-ndjson"
    };
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// The HTTP status of a gRPC code (the mapping gRPC's HTTP gateways use).
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::from_u16(499).expect("valid"),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The gRPC code's name as in the gRPC spec (`INVALID_ARGUMENT`).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn error_json(f: &Failure) -> Json {
    let http = f.http.unwrap_or_else(|| http_status(f.code));
    serde_json::json!({
        "error": {
            "code": http.as_u16(),
            "status": code_name(f.code),
            "message": f.message,
        }
    })
}

fn error_response(f: &Failure) -> Response<Body> {
    json_response(
        f.http.unwrap_or_else(|| http_status(f.code)),
        &error_json(f),
    )
}

fn json_response(status: StatusCode, json: &Json) -> Response<Body> {
    let mut text = json.to_string();
    text.push('\n');
    let mut resp = Response::new(Body::from(text));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Whether a request comes from a web browser: browsers send `Origin` on
/// every request that can change something and `Sec-Fetch-Site` on all of
/// them (`none` only for what the user typed in the address bar); other
/// clients send neither.
fn from_a_browser(headers: &HeaderMap) -> bool {
    headers.contains_key(header::ORIGIN)
        || headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes() != b"none")
}

/// What the mirror passes on of an HTTP request's credentials to the
/// gRPC call it makes in process: the bearer header and the TLS
/// connection's record (its client certificate), which the services'
/// authentication layer reads.
#[derive(Clone, Default)]
struct Credentials {
    header: Option<HeaderValue>,
    tls: Option<crate::access::TlsInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_and_match() {
        let t = parse_template("/v1/jobs/{id}/kill").unwrap();
        let seg = |p: &str| -> Vec<String> { p.split('/').skip(1).map(String::from).collect() };
        assert_eq!(
            match_template(&t, &seg("/v1/jobs/abc/kill")),
            Some(vec![("id".into(), "abc".into())])
        );
        assert_eq!(match_template(&t, &seg("/v1/jobs//kill")), None);
        assert_eq!(match_template(&t, &seg("/v1/jobs/abc")), None);
        assert_eq!(match_template(&t, &seg("/v1/jobs/abc/kill/x")), None);
        let rest = parse_template("/v1/pools/{path=**}").unwrap();
        assert_eq!(
            match_template(&rest, &seg("/v1/pools/batch/ml")),
            Some(vec![("path".into(), "/batch/ml".into())])
        );
        assert_eq!(
            match_template(&rest, &seg("/v1/pools/")),
            Some(vec![("path".into(), "/".into())])
        );
        assert_eq!(match_template(&rest, &seg("/v1/pools")), None);
        assert!(parse_template("/v1/{a=*}/b").is_err());
        assert!(parse_template("v1").is_err());
    }

    #[test]
    fn every_public_rpc_has_a_binding() {
        let m = Mirror::new(peloton_proto::v1::FILE_DESCRIPTOR_SET, Routes::default()).unwrap();
        let pool = DescriptorPool::decode(peloton_proto::v1::FILE_DESCRIPTOR_SET).unwrap();
        let bound: Vec<&str> = m.routes().map(|(_, g)| g).collect();
        for s in pool.services() {
            if s.full_name() == "peloton.v1.AgentService" || !s.full_name().starts_with("peloton.")
            {
                continue;
            }
            for method in s.methods() {
                let path = format!("/{}/{}", s.full_name(), method.name());
                assert!(bound.contains(&path.as_str()), "{path} has no HTTP binding");
            }
        }
        // No two bindings answer the same verb and path.
        let patterns: Vec<&str> = m.routes().map(|(p, _)| p).collect();
        let mut sorted = patterns.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), patterns.len());
    }

    #[test]
    fn codes_map_to_http() {
        assert_eq!(http_status(Code::InvalidArgument), StatusCode::BAD_REQUEST);
        assert_eq!(http_status(Code::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(
            http_status(Code::FailedPrecondition),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            http_status(Code::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(code_name(Code::OutOfRange), "OUT_OF_RANGE");
    }
}
