// The console's only way to the server: the JSON/HTTP mirror under /v1
// (GET /v1 lists its routes) and the watch stream as server-sent events.

// Bounds on what one view reads, so a large cluster cannot freeze the page:
// lists stop after this many items and say so.
export const MAX_LIST_ITEMS = 5000;

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// One call; the answer's JSON, or an ApiError with the server's message.
export async function call(method, path, body) {
  const init = { method, headers: {} };
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
    throw new ApiError(response.status, message);
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

// A run's log (stdout, or stderr), as text: the stream's JSON lines, each
// with base64 `data`, read to its end (no follow). At most `maxBytes`.
export async function readLog(jobId, instance, runId, stderr, maxBytes = 1 << 20) {
  const path =
    `/v1/jobs/${encodeURIComponent(jobId)}/tasks/${instance}/logs` +
    `?runId=${runId}&stderr=${stderr ? "true" : "false"}`;
  const response = await fetch(path);
  const text = await response.text();
  const bytes = [];
  let total = 0;
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    const json = JSON.parse(line);
    if (json.error) throw new ApiError(json.error.code || response.status, `${json.error.status}: ${json.error.message}`);
    const chunk = Uint8Array.from(atob(json.data || ""), (c) => c.charCodeAt(0));
    bytes.push(chunk);
    total += chunk.length;
    if (total >= maxBytes) break;
  }
  const joined = new Uint8Array(total);
  let at = 0;
  for (const b of bytes) {
    joined.set(b, at);
    at += b.length;
  }
  return new TextDecoder().decode(joined.slice(0, maxBytes));
}

// Follows /v1/watch from now on as server-sent events. `onEvents(events)`
// gets each batch; `onState("live" | "reconnecting")` the stream's state.
// The browser's EventSource reconnects by itself after an error.
export function watch(onEvents, onState) {
  const source = new EventSource("/v1/watch");
  source.onopen = () => onState("live");
  source.onerror = () => onState("reconnecting");
  source.onmessage = (m) => {
    onState("live");
    let json;
    try {
      json = JSON.parse(m.data);
    } catch {
      return;
    }
    if (json.events && json.events.length) onEvents(json.events);
  };
  return source;
}
