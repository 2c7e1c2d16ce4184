// The console's shell: the hash router (deep links such as
// #/jobs/JOB_ID and #/tasks/JOB_ID/3 are shareable), the live watch stream,
// and refreshes of the page on screen, never more than one at a time.

import * as api from "./api.js";
import * as views from "./views.js";

// Live updates arrive in bursts (a job's creation is one event per
// instance): the page is read again at most this often.
const REFRESH_MIN_INTERVAL_MS = 300;
// Changes the watch stream does not carry are read this often.
const POLL_INTERVAL_MS = 5000;

const ROUTES = [
  [/^#\/cluster$/, views.cluster, "cluster"],
  [/^#\/pools$/, views.pools, "pools"],
  [/^#\/jobs$/, views.jobs, "jobs"],
  [/^#\/jobs\/([^/]+)$/, views.job, "jobs"],
  [/^#\/tasks\/([^/]+)\/(\d+)$/, views.task, "jobs"],
];

const root = document.getElementById("view");
const status = document.getElementById("status");
let refresh = null;
let running = false;
let again = false;
let generation = 0;

function route() {
  const hash = location.hash || "";
  for (const [pattern, view, nav] of ROUTES) {
    const m = hash.match(pattern);
    if (m) return { view, nav, params: m.slice(1).map(decodeURIComponent) };
  }
  return null;
}

function show() {
  const r = route();
  if (!r) {
    location.replace("#/cluster");
    return;
  }
  generation += 1;
  document.title = `${r.view.title} · Peloton`;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.nav === r.nav);
  // A view's streams (a job's events, a log being followed) end with it.
  if (refresh && refresh.close) refresh.close();
  refresh = r.view.mount(root, r.params);
  update();
}

// Reads the page's data again; a request that comes while one runs is
// folded into one more run after it.
async function update() {
  if (running) {
    again = true;
    return;
  }
  running = true;
  const mine = generation;
  try {
    await refresh();
    if (mine === generation) status.textContent = "";
  } catch (e) {
    if (mine === generation) status.textContent = e.message;
  } finally {
    running = false;
  }
  if (again || mine !== generation) {
    again = false;
    setTimeout(update, REFRESH_MIN_INTERVAL_MS);
  }
}

let pending = null;
function soon() {
  if (pending) return;
  pending = setTimeout(() => {
    pending = null;
    update();
  }, REFRESH_MIN_INTERVAL_MS);
}

const live = document.getElementById("live");
let stream = null;
function follow() {
  if (stream) stream.close();
  stream = api.watch(
    () => soon(),
    (state) => {
      live.textContent = state === "live" ? "● live" : "○ reconnecting";
      live.className = state;
      // Whatever happened while the stream was down is read again.
      if (state === "live" && live.dataset.was === "reconnecting") soon();
      live.dataset.was = state;
    },
  );
}
follow();

// A secure server refuses calls without a valid token (401): the sign-in
// form asks for one; the page and the stream start again with it.
const signin = document.getElementById("signin");
const who = document.getElementById("who");
api.whenUnauthenticated(() => {
  signin.hidden = false;
  who.textContent = "";
});
signin.addEventListener("submit", (e) => {
  e.preventDefault();
  const input = document.getElementById("token");
  api.setToken(input.value);
  input.value = "";
  signin.hidden = true;
  status.textContent = "";
  greet();
  follow();
  show();
});

// Who the console acts as (nothing on an insecure server), and sign-out.
async function greet() {
  try {
    const me = await api.get("/v1/whoami");
    const name = me.token && me.token.name;
    who.textContent = "";
    if (!name || name === "anonymous") return;
    who.append(`${name} `);
    const out = document.createElement("a");
    out.href = "#";
    out.textContent = "sign out";
    out.addEventListener("click", (ev) => {
      ev.preventDefault();
      api.setToken("");
      location.reload();
    });
    who.append(out);
  } catch {
    // a 401 shows the form
  }
}
greet();

// Some changes bring no event on the stream (an update created or paused,
// a pool edited, a host drained with no tasks, an agent that connects):
// the page is also read again every few seconds while it is visible, and
// at once after the console itself changed something.
setInterval(() => {
  if (!document.hidden) soon();
}, POLL_INTERVAL_MS);
window.addEventListener("peloton:changed", () => soon());

window.addEventListener("hashchange", show);
show();
