// The console's only way to the server: the JSON/HTTP mirror under /v1
// (GET /v1 lists its routes) and the watch stream as server-sent events.

// Bounds on what one view reads, so a large cluster cannot freeze the page:
// lists stop after this many items and say so.
export const MAX_LIST_ITEMS = 5000;

// A secure server wants a bearer token on every call. The console keeps
// the one typed in for this tab only (sessionStorage: gone when the tab
// closes) and sends it as the `authorization` header; never in a URL.
const TOKEN_KEY = "peloton-token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value.trim());
  else sessionStorage.removeItem(TOKEN_KEY);
}

// Headers every call carries.
function authHeaders(extra = {}) {
  const t = token();
  return t ? { ...extra, Authorization: `Bearer ${t}` } : extra;
}

// Called with the error when the server refuses the token (HTTP 401):
// the shell asks for one.
let onUnauthenticated = () => {};
export function whenUnauthenticated(f) {
  onUnauthenticated = f;
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// One call; the answer's JSON, or an ApiError with the server's message.
export async function call(method, path, body) {
  const init = { method, headers: authHeaders() };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : {};
  } catch {
    throw new ApiError(response.status, `${method} ${path}: ${response.status} ${text.slice(0, 200)}`);
  }
  if (!response.ok || json.error) {
    const message = json.error ? `${json.error.status}: ${json.error.message}` : `HTTP ${response.status}`;
    const error = new ApiError(response.status, message);
    if (response.status === 401) onUnauthenticated(error);
    throw error;
  }
  return json;
}

export const get = (path) => call("GET", path);

// Every page of a list, up to MAX_LIST_ITEMS: `page(token)` returns the
// path of one page, `items(json)` its items, `next(json)` the next token
// ("" or 0 at the end). Returns { items, truncated }.
export async function listAll(page, items, next) {
  const all = [];
  let token = "";
  for (;;) {
    const json = await get(page(token));
    all.push(...items(json));
    token = next(json);
    if (!token) return { items: all, truncated: false };
    if (all.length >= MAX_LIST_ITEMS) return { items: all.slice(0, MAX_LIST_ITEMS), truncated: true };
  }
}

export const listHosts = () =>
  listAll(
    (after) => `/v1/hosts?limit=1000${after ? `&after=${encodeURIComponent(after)}` : ""}`,
    (j) => j.hosts || [],
    (j) => j.nextAfter,
  );

export const listPools = () =>
  listAll(
    (token) => `/v1/pools?pageSize=1000${token ? `&pageToken=${encodeURIComponent(token)}` : ""}`,
    (j) => j.pools || [],
    (j) => j.nextPageToken,
  );

export const listJobs = () =>
  listAll(
    (token) => `/v1/jobs?pageSize=1000${token ? `&pageToken=${encodeURIComponent(token)}` : ""}`,
    (j) => j.jobs || [],
    (j) => j.nextPageToken,
  );

export const listTasks = (jobId) =>
  listAll(
    (from) => `/v1/jobs/${encodeURIComponent(jobId)}/tasks?limit=1000${from ? `&fromInstance=${from}` : ""}`,
    (j) => j.tasks || [],
    (j) => j.nextInstance,
  );

export const post = (path, body) => call("POST", path, body);

// Reads a stream of JSON lines (the mirror's answer to a server-streaming
// call) as it arrives: `onJson(object)` for each line, until the stream
// ends (resolves) or fails (rejects with an ApiError; an error before the
// stream started is the HTTP answer's, after it a last `{"error"}` line).
// `signal` (an AbortSignal) stops it quietly; `onOpen()` is called once
// the server accepted the call.
export async function streamLines(path, onJson, signal, onOpen = () => {}) {
  let response;
  try {
    response = await fetch(path, { signal, headers: authHeaders({ Accept: "application/x-ndjson" }) });
  } catch (e) {
    if (signal && signal.aborted) return;
    throw new ApiError(0, `${path}: ${e.message}`);
  }
  if (!response.ok) {
    const text = await response.text();
    let message = `HTTP ${response.status}`;
    try {
      const json = JSON.parse(text);
      if (json.error) message = `${json.error.status}: ${json.error.message}`;
    } catch {
      // not JSON: keep the status
    }
    const error = new ApiError(response.status, message);
    if (response.status === 401) onUnauthenticated(error);
    throw error;
  }
  onOpen();
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        if (!line.trim()) continue;
        const json = JSON.parse(line);
        if (json.error) throw new ApiError(json.error.code || 500, `${json.error.status}: ${json.error.message}`);
        onJson(json);
      }
    }
  } catch (e) {
    if (signal && signal.aborted) return;
    throw e;
  }
}

// Base64 (the JSON mapping of bytes) to bytes.
export function bytesOf(base64) {
  return Uint8Array.from(atob(base64 || ""), (c) => c.charCodeAt(0));
}

// Follows a run's log (stdout, or stderr) from byte `offset` while the run
// goes on (the Logs call with `follow`, which ends when the run ends):
// `onBytes(bytes, nextOffset)` for each chunk as it comes.
export function followLog(jobId, instance, runId, stderr, offset, onBytes, signal) {
  const path =
    `/v1/jobs/${encodeURIComponent(jobId)}/tasks/${instance}/logs` +
    `?runId=${runId}&stderr=${stderr ? "true" : "false"}&offset=${offset}&follow=true`;
  return streamLines(path, (json) => {
    const bytes = bytesOf(json.data);
    onBytes(bytes, Number(json.offset || 0) + bytes.length);
  }, signal);
}

// A job's events from the oldest kept on, then live: the watch filtered to
// the job. `onEvents(events)` for each batch. When the oldest revisions
// are no longer kept, starts again from the oldest that is; when the
// stream breaks (a server restart, a new leader), goes on from the next
// revision after a pause (1 s, doubling to 10 s), until `signal` aborts.
// `onState(message)` says why it waits ("" once it streams again).
export async function jobEvents(jobId, onEvents, signal, onState = () => {}) {
  let from = 1;
  let pause = 1000;
  while (!(signal && signal.aborted)) {
    const path = `/v1/watch?jobId=${encodeURIComponent(jobId)}&fromRevision=${from}`;
    try {
      await streamLines(path, (json) => {
        pause = 1000;
        onState("");
        if (json.events && json.events.length) {
          from = Number(json.events[json.events.length - 1].revision) + 1;
          onEvents(json.events);
        }
      }, signal);
      if (signal && signal.aborted) return;
      onState("the event stream ended; following again…");
    } catch (e) {
      const oldest = /oldest(?: kept)? is (\d+)/.exec(e.message || "");
      if (oldest && Number(oldest[1]) > from) {
        from = Number(oldest[1]);
        continue;
      }
      onState(`events: ${e.message}; trying again…`);
    }
    await new Promise((resolve) => setTimeout(resolve, pause));
    pause = Math.min(10000, pause * 2);
  }
}

// Follows /v1/watch from now on (JSON lines through fetch, so that it
// carries the token like every other call). `onEvents(events)` gets each
// batch; `onState("live" | "reconnecting")` the stream's state. A broken
// stream is followed again from now after a pause (1 s, doubling to 10 s):
// the page is read again then, so nothing missed meanwhile stays unseen.
// Returns an object whose close() stops it.
export function watch(onEvents, onState) {
  const stop = new AbortController();
  (async () => {
    let pause = 1000;
    while (!stop.signal.aborted) {
      try {
        await streamLines("/v1/watch", (json) => {
          pause = 1000;
          onState("live");
          if (json.events && json.events.length) onEvents(json.events);
        }, stop.signal, () => {
          pause = 1000;
          onState("live");
        });
      } catch {
        // reported as the state below
      }
      if (stop.signal.aborted) return;
      onState("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, pause));
      pause = Math.min(10000, pause * 2);
    }
  })();
  return { close: () => stop.abort() };
}
