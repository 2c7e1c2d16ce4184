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

// Replaces `el`'s children.
function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

// ---------------------------------------------------------------- Cluster

export const cluster = {
  title: "Cluster",
  mount(root) {
    const state = h("select", { id: "host-state" },
      h("option", { value: "" }, "any state"),
      ...["UP", "DRAINING", "DOWN"].map((s) => h("option", { value: s }, s)));
    const text = h("input", { id: "host-filter", type: "search", placeholder: "filter: name or attribute (zone=z1)" });
    const body = h("div", { id: "hosts" });
    let hosts = [];
    let truncated = false;
    const draw = () => {
      const want = state.value;
      const words = text.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
      const shown = hosts.filter((host) => {
        if (want && stateName(host.state) !== want) return false;
        const hay = [host.name, host.hostPool, ...Object.entries(host.attributes || {}).map(([k, v]) => `${k}=${v}`)]
          .join(" ")
          .toLowerCase();
        return words.every((w) => hay.includes(w));
      });
      fill(body,
        message(`${shown.length} of ${hosts.length} hosts`),
        truncatedNote(truncated),
        h("table", { class: "grid" },
          h("thead", {}, h("tr", {},
            ["Host", "State", "Pool", ...DIMENSIONS.map(([, n]) => `${n} allocated / capacity`), "Tasks", "Attributes"]
              .map((c) => h("th", {}, c)))),
          h("tbody", {}, shown.map(hostRow))));
    };
    state.addEventListener("change", draw);
    text.addEventListener("input", draw);
    fill(root, h("h1", {}, "Cluster"), h("div", { class: "filters" }, state, text), body);
    return async () => {
      ({ items: hosts, truncated } = await api.listHosts());
      draw();
    };
  },
};

function hostRow(host) {
  const cap = host.capacity || {};
  const free = host.free || {};
  return h("tr", { "data-host": host.name },
    h("td", {}, host.name, host.connected ? h("span", { class: "muted", title: "agent connected" }, " ●") : null),
    h("td", {}, stateBadge(host.state)),
    h("td", {}, host.hostPool),
    DIMENSIONS.map(([k, , f]) => {
      const c = cap[k] || 0;
      const used = Math.max(0, c - (free[k] || 0));
      return h("td", {}, c > 0 ? bar(used, c, `${f(used)} / ${f(c)}`) : h("span", { class: "muted" }, "—"));
    }),
    h("td", { class: "num" }, host.tasksTotal),
    h("td", { class: "attrs" }, Object.entries(host.attributes || {}).map(([k, v]) => h("code", {}, `${k}=${v}`))));
}

// ---------------------------------------------------------------- Pools

export const pools = {
  title: "Pools",
  mount(root) {
    const body = h("div", { id: "pools" });
    fill(root, h("h1", {}, "Pools"),
      message("Each bar is drawn against the largest of the pool's figures in that dimension; " +
        "allocation above reservation is borrowed, entitlement below demand is waiting."),
      body);
    return async () => {
      const { items, truncated } = await api.listPools();
      const byPath = new Map(items.map((p) => [p.path, p]));
      const rows = [];
      const walk = (path, depth) => {
        const pool = byPath.get(path);
        if (!pool || depth > 64) return;
        rows.push(poolRows(pool, depth));
        for (const child of [...(pool.children || [])].sort()) walk(child, depth + 1);
      };
      walk("/", 0);
      // Pools not reached from the root (should not happen) still show.
      const reached = new Set();
      const mark = (p, d) => { const pool = byPath.get(p); if (!pool || d > 64) return; reached.add(p); (pool.children || []).forEach((c) => mark(c, d + 1)); };
      mark("/", 0);
      for (const p of items) if (!reached.has(p.path)) rows.push(poolRows(p, 0));
      fill(body, truncatedNote(truncated),
        h("table", { class: "grid pools" },
          h("thead", {}, h("tr", {}, ["Pool", "Pending", "Running", "Dimension", "Reservation", "Limit", "Entitlement", "Allocation", "Demand"].map((c) => h("th", {}, c)))),
          h("tbody", {}, rows)));
    };
  },
};

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

export const job = {
  title: "Job",
  mount(root, [id]) {
    const head = h("div", {});
    const grid = h("div", { id: "instances" });
    const spec = h("pre", { id: "spec", class: "spec" });
    const format = h("select", { id: "spec-format" }, h("option", { value: "yaml" }, "YAML"), h("option", { value: "json" }, "JSON"));
    const note = h("p", { class: "error", id: "job-error" });
    let current = null;
    const drawSpec = () => {
      if (!current) return;
      spec.textContent = format.value === "json" ? JSON.stringify(current.spec, null, 2) : yamlish(current.spec).replace(/^\n/, "");
    };
    format.addEventListener("change", drawSpec);
    const kill = h("button", { id: "kill", class: "danger", onclick: async () => {
      if (!current) return;
      const name = current.spec?.name || id;
      if (!confirm(`Kill job ${name} (${id})? Its running tasks are stopped.`)) return;
      try {
        await api.call("POST", `/v1/jobs/${encodeURIComponent(id)}/kill`, { version: current.version });
        note.textContent = "";
      } catch (e) {
        note.textContent = `Kill failed: ${e.message}`;
      }
    } }, "Kill job");
    fill(root, h("p", {}, h("a", { href: "#/jobs" }, "← Jobs")), head, note,
      h("h2", {}, "Instances"), grid,
      h("h2", {}, "Spec ", format), spec);
    return async () => {
      const [{ job: j }, { items: tasks, truncated }] = await Promise.all([
        api.get(`/v1/jobs/${encodeURIComponent(id)}`),
        api.listTasks(id),
      ]);
      current = j;
      const s = j.spec || {};
      const done = ["SUCCEEDED", "FAILED", "KILLED"].includes(stateName(j.status?.state));
      kill.disabled = done || j.status?.killRequested;
      fill(head,
        h("h1", {}, s.name || id, " ", stateBadge(j.status?.state), " ", kill),
        h("dl", { class: "facts" },
          fact("id", j.id), fact("pool", s.pool), fact("owner", s.owner), fact("type", stateName(s.type).replace(/^JOB_TYPE_/, "")),
          fact("instances", s.instanceCount), fact("version", j.version), fact("config version", j.status?.configVersion),
          fact("created", time(j.status?.createdAtMs)), j.status?.completedAtMs !== "0" ? fact("completed", time(j.status?.completedAtMs)) : null,
          j.status?.killRequested ? fact("kill", "requested") : null),
        h("div", {}, taskCounts(j)));
      fill(grid, truncatedNote(truncated), h("div", { class: "cells" }, tasks.map((t) => {
        const st = stateName(t.current?.state);
        return h("a", {
          class: `cell s-${st.toLowerCase()}`,
          href: `#/tasks/${encodeURIComponent(id)}/${t.instance}`,
          title: `instance ${t.instance}: ${st}${t.current?.host ? ` on ${t.current.host}` : ""}${t.pendingReason ? `\n${t.pendingReason}` : ""}`,
          "data-instance": t.instance,
        }, String(t.instance));
      })), h("div", { class: "legend small muted" }, "Each square is an instance, colored by state; hover for its host or reason, click for its page."));
      drawSpec();
    };
  },
};

function fact(k, v) {
  if (v === undefined || v === null || v === "") return null;
  return [h("dt", {}, k), h("dd", {}, String(v))];
}

// ---------------------------------------------------------------- Task

export const task = {
  title: "Task",
  mount(root, [id, instance]) {
    const head = h("div", {});
    const runs = h("div", { id: "runs" });
    const logs = h("div", { id: "logs" });
    const stream = h("select", { id: "log-stream" }, h("option", { value: "stdout" }, "stdout"), h("option", { value: "stderr" }, "stderr"));
    const out = h("pre", { id: "log", class: "log" });
    let runId = 0;
    const drawLog = async () => {
      try {
        const text = await api.readLog(id, instance, runId, stream.value === "stderr");
        out.textContent = text || "(empty)";
        out.classList.remove("error");
      } catch (e) {
        out.textContent = e.message;
        out.classList.add("error");
      }
    };
    stream.addEventListener("change", drawLog);
    fill(logs, h("h2", {}, "Logs ", stream), out);
    fill(root, h("p", {}, h("a", { href: `#/jobs/${encodeURIComponent(id)}` }, "← Job")), head, runs, logs);
    return async () => {
      const { task: t } = await api.get(`/v1/jobs/${encodeURIComponent(id)}/tasks/${encodeURIComponent(instance)}`);
      const c = t.current || {};
      runId = c.runId || 0;
      fill(head,
        h("h1", {}, `Instance ${t.instance} `, stateBadge(c.state)),
        h("dl", { class: "facts" },
          fact("job", id), fact("state", stateName(c.state)), fact("host", c.host || "—"), fact("run", c.runId),
          fact("failures", t.failureCount), fact("config version", t.configVersion),
          c.reason ? fact("reason", c.reason) : null,
          t.stopping ? fact("stopping", `on ${t.stoppingHost}`) : null),
        t.pendingReason ? h("div", { class: "pending", id: "pending-reason" }, h("strong", {}, "Why it waits: "), t.pendingReason) : null);
      const all = [c, ...(t.history || [])];
      fill(runs, h("h2", {}, "Runs"), h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, ["Run", "State", "Host", "Exit code", "Created", "Started", "Finished", "Reason"].map((x) => h("th", {}, x)))),
        h("tbody", {}, all.map((r) => h("tr", {},
          h("td", { class: "num" }, r.runId), h("td", {}, stateBadge(r.state)), h("td", {}, r.host),
          h("td", { class: "num" }, r.finishedAtMs && r.finishedAtMs !== "0" ? r.exitCode : ""),
          h("td", { class: "small" }, time(r.createdAtMs)), h("td", { class: "small" }, time(r.startedAtMs)),
          h("td", { class: "small" }, time(r.finishedAtMs)), h("td", {}, r.reason))))));
      await drawLog();
    };
  },
};
