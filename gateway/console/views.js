// The console's pages. Each view is { title, mount(root, params) } where
// mount draws the page's fixed parts once and returns `refresh()`, which
// reads the API again and redraws the data (called on every live update).
// Everything is built with `h` (text is always set as text, never as HTML).

import * as api from "./api.js";

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style") el.style.cssText = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const DIMENSIONS = [
  ["cpu", "cpu", (v) => `${round(v)}`],
  ["memoryMb", "mem", (v) => mib(v)],
  ["diskMb", "disk", (v) => mib(v)],
  ["gpu", "gpu", (v) => `${round(v)}`],
];

function round(v) {
  return Number.isInteger(v) ? String(v) : Number(v).toFixed(2).replace(/\.?0+$/, "");
}

function mib(v) {
  if (v >= 1024 * 1024) return `${round(v / 1024 / 1024)} TiB`;
  if (v >= 1024) return `${round(v / 1024)} GiB`;
  return `${round(v)} MiB`;
}

// "TASK_STATE_RUNNING" → "RUNNING".
export function stateName(s) {
  return String(s || "").replace(/^(TASK|JOB|HOST|UPDATE)_STATE_/, "");
}

function stateBadge(s) {
  const name = stateName(s);
  return h("span", { class: `state s-${name.toLowerCase()}` }, name);
}

function time(ms) {
  const n = Number(ms);
  if (!n) return "";
  return new Date(n).toLocaleString();
}

// One bar: `value` of `max`, with a label.
function bar(value, max, label, cls) {
  const pct = max > 0 ? Math.min(100, (100 * value) / max) : 0;
  return h(
    "div",
    { class: `bar ${cls || ""}`, title: label },
    h("div", { class: "fill", style: `width:${pct.toFixed(1)}%` }),
    h("span", { class: "bar-label" }, label),
  );
}

function message(text, cls) {
  return h("p", { class: cls || "muted" }, text);
}

function truncatedNote(truncated) {
  return truncated ? message(`Only the first ${api.MAX_LIST_ITEMS} are shown.`, "warn") : null;
}

// Tells the shell that the console changed something: the page is read
// again at once (some changes bring no event on the watch stream).
export function changed() {
  window.dispatchEvent(new Event("peloton:changed"));
}

// Replaces `el`'s children.
function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

// ---------------------------------------------------------------- Cluster

// Task refs shown in a host's row before "+N more".
const HOST_TASKS_SHOWN = 8;

export const cluster = {
  title: "Cluster",
  mount(root) {
    const state = h("select", { id: "host-state" },
      h("option", { value: "" }, "any state"),
      ...["UP", "DRAINING", "DOWN"].map((s) => h("option", { value: s }, s)));
    const text = h("input", { id: "host-filter", type: "search", placeholder: "filter: name or attribute (zone=z1)" });
    const body = h("div", { id: "hosts" });
    const note = h("p", { class: "error", id: "host-error" });
    let hosts = [];
    let names = new Map();
    let truncated = false;
    // Hosts whose full task list is open (kept across refreshes).
    const expanded = new Set();
    let draw = () => {};
    // Drain (maintenance start) or up (maintenance complete), after a
    // confirmation that says what happens to the host's tasks.
    const act = async (host, drain) => {
      const n = Number(host.tasksTotal || 0);
      const question = drain
        ? `Drain host ${host.name}? Its ${n} task(s) are stopped and placed elsewhere, and nothing new is placed on it.`
        : `Bring host ${host.name} up? New tasks may be placed on it again.` +
          (host.isolation !== "simulated" && !host.connected ? " Its agent is not connected: it comes up when its agent registers." : "");
      if (!confirm(question)) return;
      try {
        await api.post(`/v1/hosts/maintenance/${drain ? "start" : "complete"}`, { hosts: [host.name] });
        note.textContent = "";
        changed();
      } catch (e) {
        note.textContent = `${drain ? "Drain" : "Up"} of ${host.name} failed: ${e.message}`;
      }
    };
    draw = () => {
      const want = state.value;
      const words = text.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
      const shown = hosts.filter((host) => {
        if (want && stateName(host.state) !== want) return false;
        const hay = [host.name, host.hostPool, ...Object.entries(host.attributes || {}).map(([k, v]) => `${k}=${v}`)]
          .join(" ")
          .toLowerCase();
        return words.every((w) => hay.includes(w));
      });
      const row = (host) => hostRow(host, names, expanded.has(host.name), act, () => {
        if (expanded.has(host.name)) expanded.delete(host.name);
        else expanded.add(host.name);
        draw();
      });
      fill(body,
        message(`${shown.length} of ${hosts.length} hosts`),
        truncatedNote(truncated),
        h("table", { class: "grid" },
          h("thead", {}, h("tr", {},
            ["Host", "State", "Agent", "Pool", ...DIMENSIONS.filter(([k]) => k !== "gpu").map(([, n]) => `${n} allocated / capacity`),
              "Used", "GPU devices", "Tasks", "Attributes", ""]
              .map((c) => h("th", {}, c)))),
          h("tbody", {}, shown.map(row))));
    };
    state.addEventListener("change", draw);
    text.addEventListener("input", draw);
    fill(root, h("h1", {}, "Cluster"), h("div", { class: "filters" }, state, text), note, body);
    return async () => {
      ({ items: hosts, truncated } = await api.listHosts());
      // Job names for the hosts' task links: the job list is read again
      // only when a host names a job not seen yet.
      if (hosts.some((host) => (host.tasks || []).some((r) => !names.has(r.jobId)))) {
        const { items } = await api.listJobs();
        names = new Map(items.map((x) => [x.id, x.spec?.name || x.id]));
        // Not in the list (past its bound, or just deleted): the id.
        for (const host of hosts) for (const r of host.tasks || []) if (!names.has(r.jobId)) names.set(r.jobId, r.jobId);
      }
      draw();
    };
  },
};

// A host's agent: connected or not (and when it was last heard from), or
// a simulated host.
function agentCell(host) {
  if (host.isolation === "simulated") return h("span", { class: "muted", "data-agent": "simulated" }, "simulated");
  const seen = Number(host.lastSeenMs || 0);
  const title = seen ? `last heard from ${time(seen)}${host.isolation ? `; isolation ${host.isolation}` : ""}` : "";
  return host.connected
    ? h("span", { class: "state s-up", title, "data-agent": "connected" }, "connected")
    : h("span", { class: "state s-down", title, "data-agent": "disconnected" }, "disconnected");
}

// What a host's runs use, as its agent measured it (or its simulation
// says), beside what they are allocated: cores, memory and its peak.
function usedCell(host) {
  const u = host.used;
  if (!u) return h("span", { class: "muted" }, "—");
  const memory = Number(u.memoryMb || 0);
  const peak = Number(u.memoryPeakMb || 0);
  const reported = Number(u.reportedAtMs || 0);
  return h("span", { class: "nowrap", "data-used": "", title: reported ? `reported ${time(reported)}` : "" },
    `${round(Number(u.cpu || 0))} cpu, ${mib(memory)}`,
    peak >= memory + 1 ? h("span", { class: "small muted" }, ` (peak ${mib(peak)})`) : null);
}

// A host's GPUs as one square per device, filled for what is allocated
// (GPUs may be shared in fractions: a partly used device is half-filled).
function gpuCell(host) {
  const total = Math.round(host.capacity?.gpu || 0);
  if (!total) return h("span", { class: "muted" }, "—");
  const used = Math.max(0, (host.capacity?.gpu || 0) - (host.free?.gpu || 0));
  const devices = [];
  for (let i = 0; i < total; i += 1) {
    const part = Math.max(0, Math.min(1, used - i));
    devices.push(h("span", { class: `gpu ${part >= 1 ? "full" : part > 0 ? "part" : ""}` }));
  }
  return h("div", { class: "gpus", title: `${round(used)} of ${total} GPU(s) allocated` },
    devices, h("span", { class: "small muted" }, ` ${round(used)}/${total}`));
}

function hostRow(host, names, expanded, act, toggle) {
  const cap = host.capacity || {};
  const free = host.free || {};
  const refs = host.tasks || [];
  const total = Number(host.tasksTotal || refs.length);
  const shown = expanded ? refs : refs.slice(0, HOST_TASKS_SHOWN);
  const st = stateName(host.state);
  const reserved = host.reservedFor || [];
  return h("tr", { "data-host": host.name },
    h("td", { class: "nowrap" }, host.name,
      reserved.length
        ? h("span", {
          class: "badge reserved",
          "data-reserved": reserved.map((r) => `${(r.head || {}).jobId}/${(r.head || {}).instance}`).join(" "),
          title: reserved.map((r) => `held for ${names.get((r.head || {}).jobId) || (r.head || {}).jobId}/${(r.head || {}).instance} (${r.tasks} task(s), pool ${r.pool}) from ${time(Number(r.fromMs))}; until then it takes only work that ends before`).join("\n"),
        }, " reserved")
        : null),
    h("td", {}, stateBadge(host.state)),
    h("td", {}, agentCell(host)),
    h("td", {}, host.hostPool),
    DIMENSIONS.filter(([k]) => k !== "gpu").map(([k, , f]) => {
      const c = cap[k] || 0;
      const used = Math.max(0, c - (free[k] || 0));
      return h("td", {}, c > 0 ? bar(used, c, `${f(used)} / ${f(c)}`) : h("span", { class: "muted" }, "—"));
    }),
    h("td", {}, usedCell(host)),
    h("td", {}, gpuCell(host)),
    h("td", { class: "host-tasks" },
      h("span", { class: "count" }, total),
      shown.map((r) => h("a", {
        class: "task-ref",
        href: `#/tasks/${encodeURIComponent(r.jobId)}/${r.instance}`,
        title: `${r.jobId} instance ${r.instance}`,
      }, `${names.get(r.jobId) || r.jobId}/${r.instance}`)),
      refs.length > HOST_TASKS_SHOWN
        ? h("button", { class: "link", onclick: toggle }, expanded ? "fewer" : `+${refs.length - HOST_TASKS_SHOWN} more`)
        : null,
      total > refs.length && expanded ? h("span", { class: "muted small" }, ` (${total - refs.length} not listed)`) : null),
    h("td", { class: "attrs" }, Object.entries(host.attributes || {}).map(([k, v]) => h("code", {}, `${k}=${v}`))),
    h("td", {}, st === "UP"
      ? h("button", { class: "drain", onclick: () => act(host, true) }, "Drain")
      : h("button", { class: "up", onclick: () => act(host, false) }, "Up")));
}

// ---------------------------------------------------------------- Pools

// Pending tasks shown per pool queue.
const QUEUE_SHOWN = 10;
// Pools whose queues are read on one refresh (each is a few calls).
const QUEUE_POOLS_READ = 50;

export const pools = {
  title: "Pools",
  mount(root) {
    const body = h("div", { id: "pools" });
    fill(root, h("h1", {}, "Pools"),
      message("Each bar is drawn against the largest of the pool's figures in that dimension; " +
        "allocation above reservation is borrowed, entitlement below demand is waiting. " +
        "Share is the pool's weight for capacity beyond reservations."),
      body);
    return async () => {
      const { items, truncated } = await api.listPools();
      const byPath = new Map(items.map((p) => [p.path, p]));
      // Queues of the leaf pools that have pending tasks, read in parallel
      // (a parent's pending count is its subtree's; work queues in leaves).
      const parentOf = (path) => {
        const i = path.lastIndexOf("/");
        return i <= 0 ? "/" : path.slice(0, i);
      };
      const parents = new Set(items.filter((p) => p.path !== "/").map((p) => parentOf(p.path)));
      const waiting = items.filter((p) => !parents.has(p.path)
        && Number(p.status?.pendingTasks || 0) > 0);
      const queues = new Map(await Promise.all(waiting.slice(0, QUEUE_POOLS_READ)
        .map(async (p) => [p.path, await poolQueue(p.path)])));
      const rows = [];
      const add = (pool, depth) => {
        rows.push(poolRows(pool, depth));
        const q = queues.get(pool.path);
        if (q) rows.push(queueRow(pool, q, depth));
      };
      const walk = (path, depth) => {
        const pool = byPath.get(path);
        if (!pool || depth > 64) return;
        add(pool, depth);
        for (const child of [...(pool.children || [])].sort()) walk(child, depth + 1);
      };
      walk("/", 0);
      // Pools not reached from the root (should not happen) still show.
      const reached = new Set();
      const mark = (p, d) => { const pool = byPath.get(p); if (!pool || d > 64) return; reached.add(p); (pool.children || []).forEach((c) => mark(c, d + 1)); };
      mark("/", 0);
      for (const p of items) if (!reached.has(p.path)) add(p, 0);
      fill(body, truncatedNote(truncated),
        waiting.length > QUEUE_POOLS_READ
          ? message(`${waiting.length} pools have pending tasks; the queues of the first ${QUEUE_POOLS_READ} are shown.`, "warn")
          : null,
        h("table", { class: "grid pools" },
          h("thead", {}, h("tr", {}, ["Pool", "Share", "Pending", "Running", "Dimension", "Reservation", "Limit", "Entitlement", "Allocation", "Demand"].map((c) => h("th", {}, c)))),
          h("tbody", {}, rows)));
    };
  },
};

// A pool's queue in the engine's admission order (ListQueue: priority,
// then arrival, over the pool's four queues; a task queued again is at the
// back of its priority): its first QUEUE_SHOWN entries, each named by its
// job's name (read once per job and kept), and the head's reason, which
// says what holds the queue (lists carry no reasons: it is read on its own).
const jobNames = new Map();
async function poolQueue(path) {
  const segments = path.split("/").filter(Boolean).map(encodeURIComponent).join("/");
  const { entries = [], queuedTasks = 0 } = await api.get(`/v1/queues/${segments}?limit=${QUEUE_SHOWN}`);
  const unknown = [...new Set(entries.map((e) => e.task?.jobId).filter((id) => id && !jobNames.has(id)))];
  await Promise.all(unknown.map(async (id) => {
    try {
      const { job } = await api.get(`/v1/jobs/${encodeURIComponent(id)}`);
      jobNames.set(id, job.spec?.name || id);
    } catch {
      // Gone since: shown by id.
    }
  }));
  let head = null;
  if (entries[0]?.task) {
    const t = entries[0].task;
    ({ task: head } = await api.get(`/v1/jobs/${encodeURIComponent(t.jobId)}/tasks/${t.instance}`));
  }
  return { entries, queuedTasks: Number(queuedTasks), head };
}

function queueRow(pool, queue, depth) {
  const { entries, queuedTasks, head } = queue;
  const shown = entries.reduce((n, e) => n + Number(e.tasks || 1), 0);
  return h("tr", { class: "queue", "data-queue": pool.path },
    h("td", { colspan: 10, style: `padding-left:${1.5 + depth * 1.2}rem` },
      h("div", { class: "small" },
        h("strong", {}, `Queue (${queuedTasks} pending, in admission order): `),
        entries.length ? entries.map((e, i) => {
          const t = e.task || {};
          const gang = Number(e.tasks || 1) > 1 ? ` +${Number(e.tasks) - 1} (gang)` : "";
          return [i ? " → " : "", h("a", {
            class: "task-ref",
            "data-entry": `${t.jobId}/${t.instance}`,
            title: `priority ${e.priority || 0}, ${e.taskClass} queue`,
            href: `#/tasks/${encodeURIComponent(t.jobId)}/${t.instance}`,
          }, `${jobNames.get(t.jobId) || t.jobId}/${t.instance}${gang}`),
          h("span", { class: "muted" }, ` p${e.priority || 0}`)];
        }) : h("span", { class: "muted" }, "(nothing queued for admission)"),
        queuedTasks > shown && entries.length ? h("span", { class: "muted" }, ` … ${queuedTasks - shown} more`) : null),
      head?.pendingReason ? h("div", { class: "pending small queue-head" }, h("strong", {}, "Head: "), head.pendingReason) : null));
}

// A pool's share: one weight, or one per dimension when they differ.
function shareText(pool) {
  const shares = pool.spec?.shares;
  if (shares && DIMENSIONS.some(([k]) => (shares[k] || 0) > 0)) {
    return DIMENSIONS.map(([k, label]) => `${label} ${round(shares[k] || 1)}`).join(", ");
  }
  return round(pool.spec?.share || 1);
}

const POOL_FIGURES = [
  ["reservation", (p) => p.spec?.reservation, "b-res"],
  ["limit", (p) => p.spec?.limit, "b-limit"],
  ["entitlement", (p) => p.status?.entitlement, "b-ent"],
  ["allocation", (p) => p.status?.allocation, "b-alloc"],
  ["demand", (p) => p.status?.demand, "b-demand"],
];

// A pool's rows: one per dimension where any figure is non-zero (cpu
// always), the name and counts spanning them.
function poolRows(pool, depth) {
  const dims = DIMENSIONS.filter(([k], i) => i === 0 || POOL_FIGURES.some(([, get]) => (get(pool)?.[k] || 0) > 0));
  const name = pool.path === "/" ? "/" : pool.path.split("/").pop();
  return dims.map(([k, label, f], i) => {
    const values = POOL_FIGURES.map(([, get]) => get(pool)?.[k] || 0);
    const max = Math.max(...values, 0);
    return h("tr", { "data-pool": pool.path, class: i === 0 ? "first" : "" },
      i === 0 ? [
        h("td", { rowspan: dims.length, class: "pool-name", style: `padding-left:${0.5 + depth * 1.2}rem`, title: pool.path },
          name, h("div", { class: "muted small" }, pool.path)),
        h("td", { rowspan: dims.length, class: "num share" }, shareText(pool)),
        h("td", { rowspan: dims.length, class: "num" }, pool.status?.pendingTasks ?? 0),
        h("td", { rowspan: dims.length, class: "num" }, pool.status?.runningTasks ?? 0),
      ] : null,
      h("td", { class: "muted" }, label),
      POOL_FIGURES.map(([fig, , cls], j) => {
        const v = values[j];
        const shown = fig === "limit" && v === 0 ? "none" : f(v);
        return h("td", {}, bar(v, max, shown, cls));
      }));
  });
}

// ---------------------------------------------------------------- Jobs

export const jobs = {
  title: "Jobs",
  mount(root) {
    const text = h("input", { id: "job-filter", type: "search", placeholder: "search: name, id, owner, pool, state, label" });
    const body = h("div", { id: "jobs" });
    let list = [];
    let truncated = false;
    const draw = () => {
      const words = text.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
      const shown = list.filter((j) => {
        const s = j.spec || {};
        const hay = [j.id, s.name, s.owner, s.pool, stateName(j.status?.state),
          ...Object.entries(s.labels || {}).map(([k, v]) => `${k}=${v}`)].join(" ").toLowerCase();
        return words.every((w) => hay.includes(w));
      });
      shown.sort((a, b) => Number(b.status?.createdAtMs || 0) - Number(a.status?.createdAtMs || 0));
      fill(body,
        message(`${shown.length} of ${list.length} jobs`),
        truncatedNote(truncated),
        h("table", { class: "grid" },
          h("thead", {}, h("tr", {}, ["Name", "State", "Pool", "Owner", "Instances", "Tasks", "Created"].map((c) => h("th", {}, c)))),
          h("tbody", {}, shown.map(jobRow))));
    };
    text.addEventListener("input", draw);
    fill(root, h("h1", {}, "Jobs"), h("div", { class: "filters" }, text), body);
    return async () => {
      ({ items: list, truncated } = await api.listJobs());
      draw();
    };
  },
};

/** A start forecast in words: ~time, host, queue position (or why none). */
function forecastText(f) {
  const start = f.startMs && f.startMs !== "0" ? `~${time(f.startMs)}` : "not foreseen (waits for work with no runtime estimate)";
  const host = f.host ? ` on ${f.host}` : "";
  const pos = f.queuePosition ? `, queue position ${f.queuePosition}` : "";
  return `${start}${host}${pos}`;
}

function taskCounts(job) {
  return (job.status?.taskCounts || []).filter((c) => c.count > 0).map((c) =>
    h("span", { class: `count s-${stateName(c.state).toLowerCase()}` }, `${c.count} ${stateName(c.state).toLowerCase()}`));
}

function jobRow(job) {
  const s = job.spec || {};
  return h("tr", { "data-job": job.id },
    h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(job.id)}` }, s.name || job.id),
      h("div", { class: "muted small" }, job.id)),
    h("td", {}, stateBadge(job.status?.state)),
    h("td", {}, s.pool),
    h("td", {}, s.owner),
    h("td", { class: "num" }, s.instanceCount),
    h("td", {}, taskCounts(job)),
    h("td", { class: "small" }, time(job.status?.createdAtMs)));
}

// YAML-ish text of a JSON value: readable, not meant to be parsed back.
export function yamlish(value, indent = "") {
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    return value.map((v) => `\n${indent}- ${yamlish(v, indent + "  ").replace(/^\n\s*/, "")}`).join("");
  }
  if (value && typeof value === "object") {
    const entries = Object.entries(value);
    if (!entries.length) return "{}";
    return entries.map(([k, v]) => {
      const inner = yamlish(v, indent + "  ");
      return `\n${indent}${k}:${inner.startsWith("\n") ? "" : " "}${inner}`;
    }).join("");
  }
  if (typeof value === "string") return /^[\w./:@-]*$/.test(value) && value !== "" ? value : JSON.stringify(value);
  return String(value);
}

// Events shown on a job's page (the newest).
const JOB_EVENTS_SHOWN = 200;

const UPDATE_DONE = ["SUCCEEDED", "FAILED", "ROLLED_BACK", "ABORTED"];

export const job = {
  title: "Job",
  mount(root, [id]) {
    const head = h("div", {});
    const grid = h("div", { id: "instances" });
    const spec = h("pre", { id: "spec", class: "spec" });
    const format = h("select", { id: "spec-format" }, h("option", { value: "yaml" }, "YAML"), h("option", { value: "json" }, "JSON"));
    const note = h("p", { class: "error", id: "job-error" });
    const updateBox = h("div", { id: "update" });
    const eventsBox = h("div", { id: "events" }, message("reading the job's events…"));
    let current = null;
    const drawSpec = () => {
      if (!current) return;
      spec.textContent = format.value === "json" ? JSON.stringify(current.spec, null, 2) : yamlish(current.spec).replace(/^\n/, "");
    };
    format.addEventListener("change", drawSpec);
    // A call that changes the job, sent with the version the page shows
    // (a stale one is refused by the server: someone else changed the job).
    const act = async (what, path, body) => {
      try {
        await api.post(path, body);
        note.textContent = "";
        changed();
      } catch (e) {
        // Refused (a stale version: someone else changed the job): the
        // page reads the job again, so a second try names its version.
        note.textContent = `${what} failed: ${e.message}`;
        changed();
      }
    };
    const name = () => current?.spec?.name || id;
    const kill = h("button", { id: "kill", class: "danger", onclick: async () => {
      if (!current) return;
      if (!confirm(`Kill job ${name()} (${id})? Its running tasks are stopped.`)) return;
      await act("Kill", `/v1/jobs/${encodeURIComponent(id)}/kill`, { version: current.version });
    } }, "Kill job");
    const restart = h("button", { id: "restart", onclick: async () => {
      if (!current) return;
      if (!confirm(`Restart every instance of ${name()} (${id})? Each is stopped and started again.`)) return;
      await act("Restart", `/v1/jobs/${encodeURIComponent(id)}/restart`, { version: current.version });
    } }, "Restart");
    const count = h("input", { id: "scale-count", type: "number", min: "0", step: "1", style: "width:6rem" });
    const scale = h("button", { id: "scale", onclick: async () => {
      if (!current) return;
      const n = Number(count.value);
      if (!Number.isInteger(n) || n < 0) {
        note.textContent = `Scale: instance count must be a whole number ≥ 0 (got ${JSON.stringify(count.value)})`;
        return;
      }
      if (!confirm(`Scale ${name()} (${id}) from ${current.spec?.instanceCount} to ${n} instance(s)?`)) return;
      await act("Scale", `/v1/jobs/${encodeURIComponent(id)}/scale`, { instanceCount: n, version: current.version });
    } }, "Scale");
    const actions = h("div", { class: "actions" }, restart, " ", h("label", {}, "instances ", count), " ", scale);

    // The job's event history, then its new events, on one stream for as
    // long as the page is open.
    const events = [];
    const aborter = new AbortController();
    const drawEvents = () => fill(eventsBox, events.length ? [
      message(events.length >= JOB_EVENTS_SHOWN ? `The newest ${JOB_EVENTS_SHOWN} events:` : `${events.length} event(s), newest first:`, "muted small"),
      h("table", { class: "grid events" },
        h("thead", {}, h("tr", {}, ["Revision", "Time", "What", "Instance", "Run", "State", "Host", "Reason"].map((c) => h("th", {}, c)))),
        h("tbody", {}, [...events].reverse().map(eventRow))),
    ] : message("no events"));
    const eventsState = h("span", { id: "events-state", class: "warn small" });
    api.jobEvents(id, (batch) => {
      events.push(...batch);
      if (events.length > JOB_EVENTS_SHOWN) events.splice(0, events.length - JOB_EVENTS_SHOWN);
      drawEvents();
    }, aborter.signal, (why) => {
      eventsState.textContent = why ? ` ${why}` : "";
    });

    fill(root, h("p", {}, h("a", { href: "#/jobs" }, "← Jobs")), head, note, actions,
      updateBox,
      h("h2", {}, "Instances"), grid,
      h("h2", {}, "Events", eventsState), eventsBox,
      h("h2", {}, "Spec ", format), spec);
    const refresh = async () => {
      const [{ job: j }, { items: tasks, truncated }] = await Promise.all([
        api.get(`/v1/jobs/${encodeURIComponent(id)}`),
        api.listTasks(id),
      ]);
      const update = j.status?.updateId ? (await api.get(`/v1/updates/${encodeURIComponent(j.status.updateId)}`)).update : null;
      const first = current === null;
      current = j;
      const s = j.spec || {};
      if (first || document.activeElement !== count) count.value = s.instanceCount ?? 0;
      const done = ["SUCCEEDED", "FAILED", "KILLED"].includes(stateName(j.status?.state));
      kill.disabled = done || j.status?.killRequested;
      restart.disabled = done || j.status?.killRequested;
      scale.disabled = done || j.status?.killRequested;
      fill(head,
        h("h1", {}, s.name || id, " ", stateBadge(j.status?.state), " ", kill),
        h("dl", { class: "facts" },
          fact("id", j.id), fact("pool", s.pool), fact("owner", s.owner), fact("type", stateName(s.type).replace(/^JOB_TYPE_/, "")),
          fact("instances", s.instanceCount), fact("version", j.version), fact("config version", j.status?.configVersion),
          fact("created", time(j.status?.createdAtMs)), j.status?.completedAtMs !== "0" ? fact("completed", time(j.status?.completedAtMs)) : null,
          j.status?.killRequested ? fact("kill", "requested") : null,
          j.status?.forecast ? fact("estimated start", forecastText(j.status.forecast)) : null),
        h("div", {}, taskCounts(j)));
      fill(updateBox, update ? updateView(update, act) : null);
      fill(grid, truncatedNote(truncated), h("div", { class: "cells" }, tasks.map((t) => {
        const st = stateName(t.current?.state);
        return h("a", {
          class: `cell s-${st.toLowerCase()}`,
          href: `#/tasks/${encodeURIComponent(id)}/${t.instance}`,
          title: `instance ${t.instance}: ${st}${t.current?.host ? ` on ${t.current.host}` : ""}${t.pendingReason ? `\n${t.pendingReason}` : ""}${t.forecast ? `\nestimated start: ${forecastText(t.forecast)}` : ""}`,
          "data-instance": t.instance,
        }, String(t.instance));
      })), h("div", { class: "legend small muted" }, "Each square is an instance, colored by state; hover for its host or reason, click for its page."));
      drawSpec();
    };
    refresh.close = () => aborter.abort();
    return refresh;
  },
};

function eventRow(e) {
  const t = e.task;
  const j = e.job;
  return h("tr", { "data-revision": e.revision },
    h("td", { class: "num small" }, e.revision),
    h("td", { class: "small" }, time(e.timeMs)),
    h("td", {}, t ? "task" : "job"),
    h("td", { class: "num" }, t ? t.instance : ""),
    h("td", { class: "num" }, t ? t.runId : ""),
    h("td", {}, stateBadge(t ? t.state : j?.state), j?.deleted ? " deleted" : "",
      t?.health && !/(UNKNOWN|NONE)$/.test(t.health) ? h("span", { class: "muted small" }, ` ${String(t.health).replace(/^HEALTH_/, "").toLowerCase()}`) : null),
    h("td", {}, t?.host || ""),
    h("td", { class: "small" }, (t ? t.reason : j?.reason) || ""));
}

// The job's latest update: state, progress, and the actions its state
// allows.
function updateView(u, act) {
  const st = u.status || {};
  const state = stateName(st.state);
  const total = Number(st.instancesTotal || 0);
  const doneN = Number(st.instancesDone || 0);
  const path = (verb) => `/v1/updates/${encodeURIComponent(u.id)}/${verb}`;
  const finished = UPDATE_DONE.includes(state);
  const backward = state === "ROLLING_BACKWARD" || state === "ROLLED_BACK"
    || (state === "PAUSED" && stateName(st.pausedFrom) === "ROLLING_BACKWARD");
  const button = (verb, label, enabled, question) => h("button", {
    id: `update-${verb}`,
    disabled: !enabled,
    onclick: async () => {
      if (question && !confirm(question)) return;
      await act(label, path(verb), {});
    },
  }, label);
  return [
    h("h2", {}, finished ? "Last update " : "Update in progress ", stateBadge(state),
      state === "PAUSED" && st.pausedFrom ? h("span", { class: "muted small" }, ` (from ${stateName(st.pausedFrom)})`) : null),
    h("div", { class: "update-progress" },
      // Counts are of instances on the update's goal: the old version once
      // it turned back; frozen once it ended.
      bar(doneN, total, `${doneN} / ${total} instances ${backward ? `back on version ${u.fromVersion}` : "updated"}`, "b-alloc"),
      h("dl", { class: "facts" },
        fact("update", u.id),
        fact("config version", `${u.fromVersion} → ${u.toVersion}`),
        fact("in progress", (st.instancesInProgress || []).join(", ") || "—"),
        (st.instancesFailed || []).length ? fact("failed", st.instancesFailed.join(", ")) : null,
        (st.instancesFailedRollingBack || []).length ? fact("failed rolling back", st.instancesFailedRollingBack.join(", ")) : null,
        fact("started", time(st.createdAtMs)),
        Number(st.completedAtMs || 0) ? fact("completed", time(st.completedAtMs)) : null,
        st.reason ? fact("reason", st.reason) : null)),
    finished ? null : h("div", { class: "actions" },
      button("pause", "Pause", state !== "PAUSED"),
      " ", button("resume", "Resume", state === "PAUSED"),
      " ", button("abort", "Abort", true, `Abort update ${u.id}? Instances keep the spec they run now.`),
      " ", button("rollback", "Rollback", state !== "ROLLING_BACKWARD" && st.pausedFrom !== "UPDATE_STATE_ROLLING_BACKWARD",
        `Roll update ${u.id} back? Instances move back to config version ${u.fromVersion}.`)),
  ];
}

function fact(k, v) {
  if (v === undefined || v === null || v === "") return null;
  return [h("dt", {}, k), h("dd", {}, String(v))];
}

// ---------------------------------------------------------------- Task

// The engine's per-check host counts of a task the placer found no host
// for (`Task.pendingChecks`, with `pendingHosts` hosts considered): each
// host is counted once, at the first check it failed.
function checkName(c) {
  const kind = String(c.check || "").replace(/^PLACEMENT_CHECK_/, "").toLowerCase();
  return c.dimension ? `${kind} ${c.dimension}` : kind;
}

function checksTable(t) {
  const checks = t.pendingChecks || [];
  if (!checks.length) return null;
  const hosts = Number(t.pendingHosts || 0);
  const gang = Number(t.pendingGangSize || 0);
  return h("div", { id: "checks" },
    h("p", { class: "small" }, `No host of ${hosts} fits${gang ? ` (a gang of ${gang}: counts for its first member without a host)` : ""}; ` +
      "hosts failing each check (each host counted once, at the first check it fails):"),
    h("table", { class: "grid checks" },
      h("thead", {}, h("tr", {}, h("th", {}, "Check"), h("th", {}, "Hosts"), h("th", {}, ""))),
      h("tbody", {}, checks.map((c) => h("tr", { "data-check": checkName(c) },
        h("td", {}, c.description || checkName(c)),
        h("td", { class: "num" }, c.hosts),
        h("td", {}, bar(c.hosts, hosts, `${c.hosts} of ${hosts}`, "b-demand")))))));
}

// Most of a followed log kept on the page (older text is dropped).
const LOG_KEEP_CHARS = 1 << 20;

export const task = {
  title: "Task",
  mount(root, [id, instance]) {
    const head = h("div", {});
    const runs = h("div", { id: "runs" });
    const logs = h("div", { id: "logs" });
    const stream = h("select", { id: "log-stream" }, h("option", { value: "stdout" }, "stdout"), h("option", { value: "stderr" }, "stderr"));
    const out = h("pre", { id: "log", class: "log" });
    const logState = h("span", { id: "log-state", class: "muted small" });
    // A note in place of the log while there is none.
    const placeholder = (text, error) => {
      out.textContent = text;
      out.classList.toggle("error", error);
      out.dataset.placeholder = "1";
    };
    // The log being followed: which run and stream, up to which offset;
    // `live` while its stream is open. A new run, or another stream,
    // starts again from the beginning.
    let follow = null;
    let runId = 0;
    let running = false;
    const startFollow = () => {
      if (follow && follow.live) return;
      if (!runId) return;
      const key = `${runId}/${stream.value}`;
      if (!follow || follow.key !== key) {
        if (follow) follow.aborter.abort();
        follow = { key, offset: 0, aborter: new AbortController(), live: false, done: false, decoder: new TextDecoder() };
        out.textContent = "";
        out.classList.remove("error");
        delete out.dataset.placeholder;
      } else if (!running) {
        return; // read to its end, and the run is over: nothing more comes
      }
      const f = follow;
      f.live = true;
      f.done = false;
      logState.textContent = "following…";
      api.followLog(id, instance, runId, stream.value === "stderr", f.offset, (bytes, next) => {
        if (f !== follow) return;
        f.offset = next;
        // A note shown while there was no output ("(empty)", an error)
        // gives way to the output.
        if (out.dataset.placeholder) {
          out.textContent = "";
          out.classList.remove("error");
          delete out.dataset.placeholder;
        }
        const atBottom = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
        out.append(f.decoder.decode(bytes, { stream: true }));
        if (out.textContent.length > LOG_KEEP_CHARS) out.textContent = out.textContent.slice(-LOG_KEEP_CHARS);
        if (atBottom) out.scrollTop = out.scrollHeight;
      }, f.aborter.signal).then(() => {
        if (f !== follow) return;
        f.live = false;
        f.done = true;
        logState.textContent = `${f.offset} bytes${running ? "" : "; the run has ended"}`;
        if (!out.textContent) placeholder("(empty)", false);
      }, (e) => {
        if (f !== follow) return;
        f.live = false;
        // Not followed to the end: the next refresh tries again from here.
        logState.textContent = e.message;
        if (!out.textContent || out.dataset.placeholder) placeholder(e.message, true);
      });
    };
    stream.addEventListener("change", () => {
      if (follow) follow.aborter.abort();
      follow = null;
      startFollow();
    });
    fill(logs, h("h2", {}, "Logs ", stream, " ", logState), out);
    fill(root, h("p", {}, h("a", { href: `#/jobs/${encodeURIComponent(id)}` }, "← Job")), head, runs, logs);
    const refresh = async () => {
      const { task: t } = await api.get(`/v1/jobs/${encodeURIComponent(id)}/tasks/${encodeURIComponent(instance)}`);
      const c = t.current || {};
      runId = c.launchId && c.launchId !== "0" ? c.runId || 0 : 0;
      running = !c.finishedAtMs || c.finishedAtMs === "0";
      fill(head,
        h("h1", {}, `Instance ${t.instance} `, stateBadge(c.state)),
        h("dl", { class: "facts" },
          fact("job", id), fact("state", stateName(c.state)), fact("host", c.host || "—"), fact("run", c.runId),
          fact("failures", t.failureCount), fact("config version", t.configVersion),
          c.reason ? fact("reason", c.reason) : null,
          t.stopping ? fact("stopping", `on ${t.stoppingHost}`) : null,
          t.forecast ? fact("estimated start", forecastText(t.forecast)) : null,
          t.expectedRuntimeMs && t.expectedRuntimeMs !== "0"
            ? fact("expected runtime", `${Math.round(Number(t.expectedRuntimeMs) / 1000)} s (${t.expectedRuntimeSource})`) : null),
        t.pendingReason ? h("div", { class: "pending", id: "pending-reason" }, h("strong", {}, "Why it waits: "), t.pendingReason,
          checksTable(t)) : null);
      const all = [c, ...(t.history || [])];
      fill(runs, h("h2", {}, "Runs"), h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, ["Run", "State", "Host", "Exit code", "Created", "Started", "Finished", "Reason"].map((x) => h("th", {}, x)))),
        h("tbody", {}, all.map((r) => h("tr", {},
          h("td", { class: "num" }, r.runId), h("td", {}, stateBadge(r.state)), h("td", {}, r.host),
          h("td", { class: "num" }, r.finishedAtMs && r.finishedAtMs !== "0" ? r.exitCode : ""),
          h("td", { class: "small" }, time(r.createdAtMs)), h("td", { class: "small" }, time(r.startedAtMs)),
          h("td", { class: "small" }, time(r.finishedAtMs)), h("td", {}, r.reason))))));
      if (!runId) {
        if (follow) follow.aborter.abort();
        follow = null;
        placeholder("(not launched yet)", false);
        logState.textContent = "";
      } else {
        startFollow();
        // Followed to its end before the page saw the run end.
        if (follow && follow.done && !running) logState.textContent = `${follow.offset} bytes; the run has ended`;
      }
    };
    refresh.close = () => {
      if (follow) follow.aborter.abort();
    };
    return refresh;
  },
};
