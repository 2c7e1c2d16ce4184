//! The web console in a real browser: headless Chromium (from the system's
//! packages) driven over the DevTools protocol against a real server in
//! process. The assertions are on what the page shows after live updates
//! (no reloads). On simulated hosts: a job created through the API after
//! the page loaded appears in the jobs list, a pool in the pools tree with
//! its share and its queue's head reason, a pending task's page says why it
//! waits (with the engine's per-check host counts), a job's page shows its
//! events, its update (resumed and aborted from the page), scale and
//! restart (sent with the job's version), a host's row its allocation. On
//! real `peloton-agent` processes (built beside `pelotond`): a task's log
//! followed while it runs, a host drained from the page and its tasks seen
//! on another host, GPU devices, an agent's connection. Those servers are
//! insecure (`--insecure`: plaintext, no tokens). On a secure one (TLS,
//! bearer tokens): sign-in, a viewer's view of its pools only, a refused
//! kill, sign-out.
//!
//! Chromium must be installed (`apt-get install -y chromium`): a run
//! without it fails, it is never skipped. Screenshots of each page go to
//! `$TMPDIR/peloton-console-shots/` (the path is printed).

mod common;

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use peloton_gateway::server;
use peloton_proto::v1::access_service_client::AccessServiceClient;
use peloton_proto::v1::job_service_client::JobServiceClient;
use peloton_proto::v1::resource_pool_service_client::ResourcePoolServiceClient;
use serde_json::{Value as Json, json};
use tonic::transport::Channel;

/// How long the page may take to show something.
const PAGE_TIMEOUT: Duration = Duration::from_secs(20);
/// Time between two looks at the page.
const PAGE_POLL: Duration = Duration::from_millis(100);

/// One browser scenario at a time: each has its server, its browser and
/// (one) its agents, on what may be a 2-core machine.
static ONE_SCENARIO: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_cluster_live() {
    let _one = ONE_SCENARIO.lock().await;
    let chromium = find_chromium();
    let dir = tempfile::tempdir().expect("temp dir");
    let server = common::within(
        "the server to start",
        server::start(&common::insecure_config(dir.path(), 3)),
    )
    .await
    .unwrap_or_else(|e| panic!("server does not start: {e:#}"));
    let addr = server.addr;
    // The browser and the blocking HTTP client run off the async workers.
    tokio::task::spawn_blocking(move || scenario(&chromium, addr))
        .await
        .expect("the browser scenario");
    common::within("graceful shutdown", server.shutdown())
        .await
        .expect("graceful shutdown");
}

fn scenario(chromium: &Path, addr: std::net::SocketAddr) {
    let base = format!("http://{addr}");
    let api = Api::new(&base);
    let shots = shots_dir();
    let mut b = Browser::launch(chromium);

    // `/` leads to the console, which opens on the cluster page.
    b.navigate(&format!("{base}/"));
    b.wait_for(
        "the hosts table",
        "document.querySelectorAll('#hosts tr[data-host]').length === 3",
    );
    b.wait_for(
        "the live stream",
        "document.getElementById('live').textContent.includes('live')",
    );
    assert!(b.text("document.location.pathname").ends_with("/ui/"));
    let row = b.text("document.querySelector('tr[data-host=\"sim-00000\"]').innerText");
    assert!(
        row.contains("UP") && row.contains("zone=z1"),
        "host row: {row}"
    );
    b.screenshot(&shots.join("cluster.png"));

    // The jobs page, loaded before the pool and the job exist.
    b.navigate(&format!("{base}/ui/#/jobs"));
    b.wait_for("the jobs page", "document.getElementById('jobs') !== null && document.getElementById('jobs').innerText.includes('of 0 jobs')");
    api.post(
        "/v1/pools",
        json!({"path": "/web", "spec": {"reservation": {"cpu": 6, "memoryMb": 4096}, "share": 3}}),
    );
    let small = api.post("/v1/jobs", job("frontend", "/web", 2, 1.0))["job"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    // Three tasks of 2 cores: what is left of the reservation of 6 admits
    // two; the third waits.
    let big = api.post("/v1/jobs", job("batch-report", "/web", 3, 2.0))["job"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    // Live: the list shows both without a reload, running and pending.
    b.wait_for(
        "the new jobs in the list",
        &format!(
            "(() => {{ const r = document.querySelector('tr[data-job=\"{small}\"]'); \
             return r && r.innerText.includes('frontend') && r.innerText.includes('RUNNING'); }})()"
        ),
    );
    b.wait_for(
        "the job with a pending task",
        &format!("!!document.querySelector('tr[data-job=\"{big}\"]')"),
    );
    b.screenshot(&shots.join("jobs.png"));

    // Searching narrows the list.
    b.eval("(() => { const i = document.getElementById('job-filter'); i.value = 'frontend'; i.dispatchEvent(new Event('input')); })()");
    b.wait_for(
        "the search to keep only frontend",
        &format!(
            "!!document.querySelector('tr[data-job=\"{small}\"]') && !document.querySelector('tr[data-job=\"{big}\"]')"
        ),
    );

    // A job's page (a deep link): its instances and its spec.
    b.navigate(&format!("{base}/ui/#/jobs/{big}"));
    b.wait_for(
        "the instance grid",
        "document.querySelectorAll('#instances .cell').length === 3",
    );
    b.wait_for(
        "a pending instance and running ones",
        "document.querySelectorAll('#instances .cell.s-pending').length === 1 && document.querySelectorAll('#instances .cell.s-running').length === 2",
    );
    let spec = b.text("document.getElementById('spec').innerText");
    assert!(
        spec.contains("name: batch-report") && spec.contains("pool: /web"),
        "spec: {spec}"
    );
    b.screenshot(&shots.join("job.png"));

    // The pending task's page says why it waits.
    let pending = b.text("document.querySelector('#instances .cell.s-pending').dataset.instance");
    b.navigate(&format!("{base}/ui/#/tasks/{big}/{pending}"));
    b.wait_for(
        "the pending reason",
        "(document.getElementById('pending-reason') || {innerText: ''}).innerText.includes('reservation')",
    );
    let head = b.text("document.getElementById('view').innerText");
    assert!(head.contains("PENDING"), "task page: {head}");
    b.screenshot(&shots.join("task-pending.png"));

    // The pools page: /web's share, and its queue — the pending task, with
    // the head's reason (what holds the queue).
    b.navigate(&format!("{base}/ui/#/pools"));
    b.wait_for(
        "the pool's queue with its head's reason",
        &format!(
            "(() => {{ const q = document.querySelector('tr[data-queue=\"/web\"]'); \
             return !!q && q.innerText.includes('Queue (1 pending, in admission order)') && q.innerText.includes('batch-report/{pending}') \
             && q.querySelector('.queue-head').innerText.includes('reservation'); }})()"
        ),
    );
    let share = b.text("document.querySelector('tr[data-pool=\"/web\"] td.share').innerText");
    assert_eq!(share, "3", "/web's share");
    let root_share = b.text("document.querySelector('tr[data-pool=\"/\"] td.share').innerText");
    assert_eq!(root_share, "1", "the root's share (the default)");
    assert!(
        b.eval("document.querySelector('tr[data-queue=\"/\"]') === null") == Json::Bool(true),
        "no queue row for a pool without pending tasks"
    );
    b.screenshot(&shots.join("pools-queue.png"));

    // The queue in the engine's order: a job created later with a higher
    // priority is ahead of batch-report (ListQueue, not creation order).
    let mut urgent_spec = job("urgent", "/web", 1, 2.0);
    urgent_spec["spec"]["sla"] = json!({"priority": 10});
    let urgent = api.post("/v1/jobs", urgent_spec)["job"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    b.wait_for(
        "the later, higher-priority job at the head of the queue",
        &format!(
            "(() => {{ const q = document.querySelector('tr[data-queue=\"/web\"]'); \
             if (!q || !q.innerText.includes('Queue (2 pending, in admission order)')) return false; \
             const e = [...q.querySelectorAll('a[data-entry]')].map(a => a.dataset.entry).join(' '); \
             return e === '{urgent}/0 {big}/{pending}' && q.innerText.includes('urgent/0 p10'); }})()"
        ),
    );
    b.screenshot(&shots.join("pools-queue-order.png"));
    api.post(&format!("/v1/jobs/{urgent}/kill"), json!({}));
    b.wait_for(
        "the queue without the killed job",
        "(() => { const q = document.querySelector('tr[data-queue=\"/web\"]'); \
         return !!q && q.innerText.includes('Queue (1 pending, in admission order)'); })()",
    );

    // The engine's per-check host counts: two tasks of 10 cores that only
    // zone z1 (one host) may take; the second finds no host — two fail the
    // constraint, one has too little cpu left.
    api.post(
        "/v1/pools",
        json!({"path": "/place", "spec": {"reservation": {"cpu": 24, "memoryMb": 4096}}}),
    );
    let mut pinned_spec = job("pinned", "/place", 2, 10.0);
    pinned_spec["spec"]["defaultTask"]["constraint"] = json!("zone == \"z1\"");
    let pinned = api.post("/v1/jobs", pinned_spec)["job"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    // (Lists carry no pending reasons; the task's page reads its own.)
    let unplaced = api.wait_task_where(&pinned, "an admitted, unplaced instance", |t| {
        matches!(
            t["current"]["state"].as_str(),
            Some("TASK_STATE_READY" | "TASK_STATE_PLACING")
        )
    });
    let instance = unplaced["instance"].as_u64().expect("instance");
    b.navigate(&format!("{base}/ui/#/tasks/{pinned}/{instance}"));
    b.wait_for(
        "the per-check host counts",
        "document.querySelectorAll('#checks tr[data-check]').length === 2",
    );
    let checks = b.text(
        "[...document.querySelectorAll('#checks tr[data-check]')].map(r => r.dataset.check + '=' + r.cells[1].innerText).sort().join(';')",
    );
    assert_eq!(
        checks, "constraint=2;insufficient cpu=1",
        "per-check counts"
    );
    let words = b.text("document.getElementById('checks').innerText");
    assert!(
        words.contains("zone==z1") && words.contains("insufficient cpu"),
        "each check in words: {words}"
    );
    assert!(
        b.text("document.getElementById('checks').innerText")
            .contains("No host of 3 fits"),
        "the checks' heading"
    );
    b.screenshot(&shots.join("task-checks.png"));

    // A service with an update: created paused, the job's page shows it with
    // its progress and controls; Resume rolls it forward to the end, live.
    api.post(
        "/v1/pools",
        json!({"path": "/svc", "spec": {"reservation": {"cpu": 4, "memoryMb": 4096}}}),
    );
    let mut svc_spec = job("web-svc", "/svc", 2, 0.5);
    svc_spec["spec"]["type"] = json!("JOB_TYPE_SERVICE");
    let svc = api.post("/v1/jobs", svc_spec.clone())["job"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    b.navigate(&format!("{base}/ui/#/jobs/{svc}"));
    b.wait_for(
        "the service running",
        "document.querySelectorAll('#instances .cell.s-running').length === 2",
    );
    let mut next = svc_spec["spec"].clone();
    next["labels"] = json!({"release": "2"});
    let update = api.post(
        &format!("/v1/jobs/{svc}/updates"),
        json!({"spec": next, "update": {"batchSize": 1, "startPaused": true}}),
    )["update"]["id"]
        .as_str()
        .expect("update id")
        .to_string();
    b.wait_for(
        "the paused update with its controls",
        "(() => { const u = document.getElementById('update'); return !!u && u.innerText.includes('Update in progress') \
         && u.innerText.includes('PAUSED') && u.innerText.includes('0 / 2 instances updated') \
         && !document.getElementById('update-resume').disabled && document.getElementById('update-pause').disabled; })()",
    );
    assert!(
        b.text("document.getElementById('update').innerText")
            .contains(&update)
    );
    b.screenshot(&shots.join("job-update-paused.png"));
    b.eval("document.getElementById('update-resume').click()");
    b.wait_for(
        "the update rolled forward to the end",
        "(() => { const u = document.getElementById('update'); return !!u && u.innerText.includes('Last update') \
         && u.innerText.includes('SUCCEEDED') && u.innerText.includes('2 / 2 instances updated') \
         && !document.getElementById('update-abort'); })()",
    );
    // A second update, aborted from the page after its confirmation.
    next["labels"] = json!({"release": "3"});
    api.post(
        &format!("/v1/jobs/{svc}/updates"),
        json!({"spec": next, "update": {"batchSize": 1, "startPaused": true}}),
    );
    b.wait_for(
        "the second update, paused",
        "!!document.getElementById('update-abort') && document.getElementById('update').innerText.includes('PAUSED')",
    );
    b.eval("window.confirm = (m) => { window.asked = m; return true; }; document.getElementById('update-abort').click()");
    b.wait_for(
        "the update aborted",
        "document.getElementById('update').innerText.includes('ABORTED')",
    );
    assert!(b.text("window.asked").starts_with("Abort update"));

    // Optimistic concurrency through the page: while the page cannot read
    // the job again (its reads of the job are held back), the job changes
    // through the API; the page's scale names the version it showed, which
    // is stale now, and the server refuses it — the page says so.
    let shown_version = "(() => { const d = [...document.querySelectorAll('dl.facts dt')].find(t => t.innerText === 'version'); return d.nextElementSibling.innerText; })()";
    let stale = b.text(shown_version);
    b.eval(&format!(
        "(() => {{ window.sent = []; window.holdJob = true; const f = window.fetch; window.fetch = (u, i) => {{ \
         if (i && i.body) window.sent.push([String(u), i.body]); \
         if (window.holdJob && String(u).endsWith('/v1/jobs/{svc}') && !(i && i.method && i.method !== 'GET')) return Promise.reject(new Error('held by the test')); \
         return f(u, i); }}; }})()"
    ));
    let changed = api.post(
        &format!("/v1/jobs/{svc}/scale"),
        json!({"instanceCount": 4, "version": "0"}),
    );
    let version = changed["job"]["version"]
        .as_str()
        .expect("version")
        .to_string();
    assert_ne!(version, stale, "the API's scale changed the version");
    b.eval(
        "(() => { const c = document.getElementById('scale-count'); c.value = '3'; document.getElementById('scale').click(); })()",
    );
    b.wait_for(
        "the stale scale refused",
        "document.getElementById('job-error').innerText.includes('Scale failed: FAILED_PRECONDITION')",
    );
    let refused = b.eval(
        "window.sent.filter(c => c[0].endsWith('/scale')).map(c => JSON.parse(c[1]).version)",
    );
    assert_eq!(
        refused,
        json!([stale]),
        "the refused scale named the version the page showed"
    );
    // Once it reads the job again, the page shows the new version and a
    // scale from it goes through.
    b.eval("window.holdJob = false");
    b.wait_for(
        "the new version and four instances",
        &format!(
            "{shown_version} === '{version}' && document.querySelectorAll('#instances .cell').length === 4"
        ),
    );
    // Scale from the page: the request carries the job's version as the
    // page shows it, and the instance grid follows live.
    b.eval(
        "(() => { window.sent = []; const c = document.getElementById('scale-count'); c.value = '3'; document.getElementById('scale').click(); })()",
    );
    b.wait_for(
        "three instances",
        "document.querySelectorAll('#instances .cell').length === 3 && document.querySelectorAll('#instances .cell.s-running').length === 3",
    );
    let sent = b.eval("window.sent");
    let scale_call = sent
        .as_array()
        .and_then(|calls| {
            calls
                .iter()
                .find(|c| c[0].as_str().is_some_and(|u| u.ends_with("/scale")))
        })
        .unwrap_or_else(|| panic!("no scale request among {sent}"));
    let body: Json =
        serde_json::from_str(scale_call[1].as_str().expect("body")).expect("JSON body");
    assert_eq!(body["instanceCount"], json!(3), "scale body: {body}");
    assert_eq!(
        body["version"],
        json!(version),
        "the scale names the job's version: {body}"
    );
    assert!(b.text("window.asked").contains("from 4 to 3 instance(s)"));
    assert!(
        b.text("document.getElementById('job-error').innerText")
            .is_empty(),
        "the error is gone once the scale went through"
    );
    // Restart from the page: every instance gets a new run, which the
    // events (the job's history, live) show.
    b.eval(
        "window.before = Math.max(0, ...[...document.querySelectorAll('#events tr[data-revision]')].map(r => Number(r.dataset.revision))); \
         document.getElementById('restart').click()",
    );
    b.wait_for(
        "the restarted runs in the events",
        "new Set([...document.querySelectorAll('#events tr[data-revision]')] \
         .filter(r => Number(r.dataset.revision) > window.before && r.cells[5].innerText.includes('RUNNING')) \
         .map(r => r.cells[3].innerText)).size === 3",
    );
    assert!(
        b.text("window.asked")
            .starts_with("Restart every instance of web-svc")
    );
    let restart_call = b.eval("window.sent.find(c => c[0].endsWith('/restart'))");
    let body: Json =
        serde_json::from_str(restart_call[1].as_str().expect("restart body")).expect("JSON");
    assert!(
        body["version"].is_string(),
        "the restart names the job's version: {body}"
    );
    b.screenshot(&shots.join("job-service.png"));

    // An update that cannot finish: its new spec needs 4 cores an instance,
    // and the pool's reservation of 4 (for non-preemptible work) has the
    // other instances' cores in use, so the first instance it moves waits.
    // Paused from the page while it rolls forward, then rolled back from
    // the page (after its confirmation): the instance gets its old spec
    // back and runs.
    next["labels"] = json!({"release": "4"});
    next["instanceCount"] = json!(3);
    next["defaultTask"]["resources"]["cpu"] = json!(4.0);
    api.post(
        &format!("/v1/jobs/{svc}/updates"),
        json!({"spec": next, "update": {"batchSize": 1}}),
    );
    b.wait_for(
        "the update rolling forward, one instance in progress",
        "(() => { const u = document.getElementById('update'); return !!u && u.innerText.includes('ROLLING_FORWARD') \
         && u.innerText.includes('0 / 3 instances updated') && /in progress\\s*\\d/.test(u.innerText) \
         && !document.getElementById('update-pause').disabled && document.getElementById('update-resume').disabled; })()",
    );
    b.eval("document.getElementById('update-pause').click()");
    b.wait_for(
        "the update paused",
        "(() => { const u = document.getElementById('update'); return !!u && u.innerText.includes('PAUSED') \
         && u.innerText.includes('from ROLLING_FORWARD') && !document.getElementById('update-resume').disabled; })()",
    );
    b.screenshot(&shots.join("job-update-stuck.png"));
    b.eval("document.getElementById('update-rollback').click()");
    b.wait_for(
        "the update rolled back",
        "(() => { const u = document.getElementById('update'); return !!u && u.innerText.includes('Last update') && u.innerText.includes('ROLLED_BACK'); })()",
    );
    assert!(b.text("window.asked").starts_with("Roll update"));
    b.wait_for(
        "every instance running again",
        "document.querySelectorAll('#instances .cell.s-running').length === 3",
    );

    // Kill the small job from its page, after the confirmation; the page
    // follows it to KILLED live, and its events say so.
    b.navigate(&format!("{base}/ui/#/jobs/{small}"));
    b.wait_for(
        "the running instances",
        "document.querySelectorAll('#instances .cell.s-running').length === 2",
    );
    b.wait_for(
        "the job's events from its history",
        "[...document.querySelectorAll('#events tr[data-revision]')].filter(r => r.innerText.includes('RUNNING') && r.innerText.includes('sim-0000')).length >= 2",
    );
    b.eval(
        "window.confirm = (m) => { window.asked = m; return true; }; document.getElementById('kill').click()",
    );
    b.wait_for(
        "the instances killed",
        "document.querySelectorAll('#instances .cell.s-killed').length === 2",
    );
    assert!(b.text("window.asked").contains("Kill job frontend"));
    b.wait_for(
        "the kill in the events, live",
        "[...document.querySelectorAll('#events tr[data-revision]')].filter(r => r.innerText.includes('KILLED')).length >= 2",
    );
    // Its resources went back to the pool: the pending task of the other
    // job runs now, and its page (opened live) shows where.
    b.navigate(&format!("{base}/ui/#/tasks/{big}/{pending}"));
    b.wait_for(
        "the task placed and running",
        "document.querySelector('h1') && document.querySelector('h1').innerText.includes('RUNNING') && !document.getElementById('pending-reason')",
    );
    let page = b.text("document.getElementById('view').innerText");
    assert!(
        page.contains("sim-0000"),
        "task page names its host: {page}"
    );
    b.screenshot(&shots.join("task-running.png"));

    // The pools page: the tree with the new pool's row and its figures.
    b.navigate(&format!("{base}/ui/#/pools"));
    // Its three tasks run (the killed job's cores went back), none waits,
    // so its queue row is gone.
    b.wait_for(
        "the pool's row",
        "(() => { const r = document.querySelector('tr[data-pool=\"/web\"]'); return !!r && r.cells[1].innerText === '3' \
         && r.cells[2].innerText === '0' && r.cells[3].innerText === '3' && !document.querySelector('tr[data-queue=\"/web\"]'); })()",
    );
    let rows = b
        .text("[...document.querySelectorAll('tr[data-pool]')].map(r => r.dataset.pool).join(',')");
    assert!(rows.starts_with("/,"), "the root first: {rows}");
    b.screenshot(&shots.join("pools.png"));

    // A host filter on the cluster page.
    b.navigate(&format!("{base}/ui/#/cluster"));
    b.wait_for(
        "the hosts table",
        "document.querySelectorAll('#hosts tr[data-host]').length === 3",
    );
    // The running tasks (the killed job's cores went back): some host
    // shows cores allocated of its 16.
    b.wait_for(
        "the hosts' allocation",
        r"[...document.querySelectorAll('#hosts tr[data-host]')].some(r => /[1-9]\d* \/ 16/.test(r.innerText))",
    );
    b.screenshot(&shots.join("cluster-busy.png"));
    b.eval("(() => { const i = document.getElementById('host-filter'); i.value = 'zone=z2'; i.dispatchEvent(new Event('input')); })()");
    b.wait_for(
        "one host left",
        "document.querySelectorAll('#hosts tr[data-host]').length === 1 && !!document.querySelector('tr[data-host=\"sim-00001\"]')",
    );
    println!("console screenshots: {}", shots.display());
}

/// The agents' token for the real-agent scenario.
const AGENT_TOKEN: &str = "console-test-agent-token";
/// How long real agents and their runs may take to show on the page.
const AGENT_TIMEOUT: Duration = Duration::from_secs(60);

/// The console on a local cluster of real `peloton-agent` processes: a
/// task's log followed while it runs (the later lines appear without a
/// reload), a host drained from the console (click, confirm) and its tasks
/// seen on another host, then brought up again; GPU devices, each host's
/// tasks and the agent's connection as the cluster page shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_on_real_agents_follows_logs_and_drains_hosts() {
    let _one = ONE_SCENARIO.lock().await;
    let chromium = find_chromium();
    let agent = agent_binary();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = common::insecure_config(dir.path(), 0);
    config.agent_token = Some(AGENT_TOKEN.into());
    let server = common::within("the server to start", server::start(&config))
        .await
        .unwrap_or_else(|e| panic!("server does not start: {e:#}"));
    let addr = server.addr;
    let work = dir.path().to_path_buf();
    tokio::task::spawn_blocking(move || agents_scenario(&chromium, &agent, addr, &work))
        .await
        .expect("the browser scenario on real agents");
    common::within("graceful shutdown", server.shutdown())
        .await
        .expect("graceful shutdown");
}

fn agents_scenario(chromium: &Path, agent: &Path, addr: std::net::SocketAddr, work: &Path) {
    let base = format!("http://{addr}");
    let api = Api::new(&base);
    let shots = shots_dir();
    let mut agents = Agents::default();
    for (host, resources, zone) in [
        ("agent-a", "cpu=4,mem=4096,disk=10000", "a"),
        ("agent-b", "cpu=4,mem=4096,disk=10000", "b"),
        ("agent-gpu", "cpu=2,mem=2048,disk=10000,gpu=2", "g"),
    ] {
        agents.spawn(agent, addr, work, host, resources, zone);
    }
    let mut b = Browser::launch(chromium);
    b.navigate(&format!("{base}/ui/#/cluster"));
    b.wait_for_within(
        "three agents connected",
        "document.querySelectorAll('#hosts tr[data-host] [data-agent=\"connected\"]').length === 3",
        AGENT_TIMEOUT,
    );
    api.post(
        "/v1/pools",
        json!({"path": "/real", "spec": {"reservation": {"cpu": 6, "memoryMb": 2048, "gpu": 1}}}),
    );

    // A task that prints three lines, waits for a file, then prints five
    // more: its page shows the first lines, then the rest as they come.
    let go = work.join("go");
    let printer = api.post(
        "/v1/jobs",
        real_job(
            "printer",
            1,
            &format!(
                "echo 'line 1'; echo 'line 2'; echo 'line 3'; while [ ! -e '{}' ]; do sleep 0.1; done; \
                 for i in 4 5 6 7 8; do echo \"line $i\"; sleep 0.3; done",
                go.display()
            ),
            0.0,
        ),
    )["job"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    b.navigate(&format!("{base}/ui/#/tasks/{printer}/0"));
    b.wait_for_within(
        "the first lines of the log",
        "(document.getElementById('log') || {textContent: ''}).textContent.includes('line 3\\n')",
        AGENT_TIMEOUT,
    );
    b.wait_for_within(
        "the task shown running",
        "document.querySelector('h1').innerText.includes('RUNNING')",
        AGENT_TIMEOUT,
    );
    // It waits for the file: nothing more than its first lines yet.
    let first = b.text("document.getElementById('log').textContent");
    assert_eq!(first, "line 1\nline 2\nline 3\n", "the log so far");
    b.eval("window.samePage = 'yes'");
    std::fs::write(&go, b"").expect("the go file");
    b.wait_for_within(
        "the later lines, without a reload",
        "document.getElementById('log').textContent.includes('line 8\\n') && document.querySelector('h1').innerText.includes('SUCCEEDED')",
        AGENT_TIMEOUT,
    );
    let log = b.text("document.getElementById('log').textContent");
    let want: String = (1..=8).map(|i| format!("line {i}\n")).collect();
    assert_eq!(log, want, "the whole log, each line once");
    assert_eq!(
        b.text("window.samePage"),
        "yes",
        "the page was not reloaded"
    );
    b.screenshot(&shots.join("task-logs.png"));

    // A GPU task on the GPU host: its devices, one allocated.
    api.post("/v1/jobs", real_job("trainer", 1, "sleep 600", 1.0));
    // Two tasks to move: the host of the first is drained from the console
    // (DRAINING while its tasks stop, DOWN for maintenance once empty).
    let sleeper = api.post("/v1/jobs", real_job("sleeper", 2, "sleep 600", 0.0))["job"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let tasks = api.wait_tasks(&sleeper, "both sleepers running", |ts| {
        ts.len() == 2
            && ts
                .iter()
                .all(|t| t["current"]["state"] == json!("TASK_STATE_RUNNING"))
    });
    let drained = tasks[0]["current"]["host"]
        .as_str()
        .expect("host")
        .to_string();
    let moved: Vec<String> = tasks
        .iter()
        .filter(|t| t["current"]["host"] == json!(drained))
        .map(|t| format!("sleeper/{}", t["instance"]))
        .collect();
    b.navigate(&format!("{base}/ui/#/cluster"));
    let row = format!("document.querySelector('tr[data-host=\"{drained}\"]')");
    b.wait_for_within(
        "the sleepers on their host's row",
        &format!(
            "(() => {{ const r = {row}; return !!r && {moved:?}.every(m => [...r.querySelectorAll('a.task-ref')].some(a => a.innerText === m)); }})()"
        ),
        AGENT_TIMEOUT,
    );
    b.wait_for_within(
        "the GPU host's devices, one allocated",
        "(() => { const r = document.querySelector('tr[data-host=\"agent-gpu\"]'); return !!r && r.querySelectorAll('.gpu').length === 2 \
         && r.querySelectorAll('.gpu.full').length === 1 && [...r.querySelectorAll('a.task-ref')].some(a => a.innerText === 'trainer/0'); })()",
        AGENT_TIMEOUT,
    );
    b.wait_for_within(
        "what the sleepers' host uses, measured by its agent",
        &format!(
            "(() => {{ const c = {row} && {row}.querySelector('[data-used]'); return !!c && /cpu, .*MiB/.test(c.innerText); }})()"
        ),
        AGENT_TIMEOUT,
    );
    b.screenshot(&shots.join("cluster-agents.png"));
    b.eval(&format!(
        "window.confirm = (m) => {{ window.asked = m; return true; }}; {row}.querySelector('button.drain').click()"
    ));
    b.wait_for_within(
        "the drained host empty and its tasks on another host",
        &format!(
            "(() => {{ const r = {row}; if (!r || !/DRAINING|DOWN/.test(r.cells[1].innerText)) return false; \
             if ([...r.querySelectorAll('a.task-ref')].some(a => a.innerText.startsWith('sleeper/'))) return false; \
             const others = [...document.querySelectorAll('tr[data-host]:not([data-host=\"{drained}\"]) a.task-ref')].map(a => a.innerText); \
             return {moved:?}.every(m => others.includes(m)); }})()"
        ),
        AGENT_TIMEOUT,
    );
    let asked = b.text("window.asked");
    assert!(
        asked.starts_with(&format!("Drain host {drained}?")),
        "the confirmation: {asked}"
    );
    // The API agrees: the sleepers run elsewhere.
    let now = api.wait_tasks(&sleeper, "the sleepers running elsewhere", |ts| {
        ts.iter().all(|t| {
            t["current"]["state"] == json!("TASK_STATE_RUNNING")
                && t["current"]["host"] != json!(drained)
        })
    });
    assert_eq!(now.len(), 2);
    b.screenshot(&shots.join("cluster-drained.png"));
    // Up again, after its confirmation.
    b.eval(&format!("{row}.querySelector('button.up').click()"));
    b.wait_for_within(
        "the host up again",
        &format!("(() => {{ const r = {row}; return !!r && r.innerText.includes('UP') && !!r.querySelector('button.drain'); }})()"),
        AGENT_TIMEOUT,
    );
    assert!(
        b.text("window.asked")
            .starts_with(&format!("Bring host {drained} up?"))
    );

    // An agent that stops: its host shows disconnected.
    agents.stop("agent-gpu");
    b.wait_for_within(
        "the stopped agent's host disconnected",
        "(() => { const r = document.querySelector('tr[data-host=\"agent-gpu\"]'); return !!r && !!r.querySelector('[data-agent=\"disconnected\"]'); })()",
        AGENT_TIMEOUT,
    );
    b.screenshot(&shots.join("cluster-disconnected.png"));
    drop(b);
    drop(agents);
}

/// The bootstrap admin token of the secure scenario's server.
const SECURE_ADMIN_TOKEN: &str = "console-test-admin-token-0123456789";

/// The console on a secure server (TLS only, bearer tokens): the page
/// asks for a token (the server answers 401 without one) and refuses a
/// wrong one; signed in with a viewer token of /a it shows /a's job and
/// not /b's, who it acts as, and follows the watch live with the token; a
/// kill from the page is refused (PERMISSION_DENIED naming jobs.write) and
/// changes nothing; signing out asks for a token again. Chromium trusts
/// only this server's certificate (its key's SPKI digest), not every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secure_console_signs_in_and_shows_what_the_token_may_see() {
    use peloton_proto::v1 as pb;
    let _one = ONE_SCENARIO.lock().await;
    let chromium = find_chromium();
    let dir = tempfile::tempdir().expect("temp dir");
    // Its own private CA in DATA_DIR/tls, whatever the suite's defaults.
    let config = peloton_gateway::config::Config {
        secure: true,
        tls_cert: None,
        tls_key: None,
        tls_client_ca: None,
        admin_token: Some(SECURE_ADMIN_TOKEN.into()),
        ..common::config(dir.path(), 3)
    };
    let server = common::within("the secure server to start", server::start(&config))
        .await
        .unwrap_or_else(|e| panic!("secure server does not start: {e:#}"));
    let addr = server.addr;
    let tls = dir.path().join("tls");
    let ca_pem = std::fs::read_to_string(tls.join("ca.pem")).expect("the server's CA");
    let server_pem = std::fs::read_to_string(tls.join("server.pem")).expect("the server's cert");
    let channel = common::tls_channel_to(addr, &ca_pem).await;

    // As the admin: pools /a and /b, a job in each, a viewer token on /a.
    let mut pools = ResourcePoolServiceClient::new(channel.clone());
    for path in ["/a", "/b"] {
        pools
            .create(as_admin(pb::CreatePoolRequest {
                path: path.into(),
                spec: Some(common::pool_spec(4.0, 2048.0)),
            }))
            .await
            .unwrap_or_else(|e| panic!("create pool {path}: {e:?}"));
    }
    let mut jobs = JobServiceClient::new(channel.clone());
    let mut ids = Vec::new();
    for (name, pool) in [("alpha", "/a"), ("bravo", "/b")] {
        let mut spec = common::job_spec(pool, 2, 0.5, 600_000);
        spec.name = name.into();
        let job = jobs
            .create(as_admin(pb::CreateJobRequest { spec: Some(spec) }))
            .await
            .unwrap_or_else(|e| panic!("create job {name}: {e:?}"))
            .into_inner()
            .job
            .expect("job");
        ids.push(job.id);
    }
    let [job_a, job_b] = <[String; 2]>::try_from(ids).expect("two jobs");
    for id in [&job_a, &job_b] {
        common::eventually("the job running", common::TIMEOUT, async || {
            let job = admin_get_job(&channel, id).await;
            let state = job.status.as_ref().map(|s| s.state);
            (state == Some(pb::JobState::Running as i32))
                .then_some(())
                .ok_or(format!("{job:?}"))
        })
        .await;
    }
    let viewer = AccessServiceClient::new(channel.clone())
        .create_token(as_admin(pb::CreateTokenRequest {
            name: "viewer-a".into(),
            grants: vec![pb::Grant {
                role: pb::Role::Viewer as i32,
                pool: "/a".into(),
            }],
        }))
        .await
        .expect("create the viewer token")
        .into_inner()
        .secret;

    let spki = spki_sha256_base64(&server_pem);
    let admin = BlockingAdmin {
        rt: tokio::runtime::Handle::current(),
        channel: channel.clone(),
    };
    let (a, b) = (job_a.clone(), job_b.clone());
    tokio::task::spawn_blocking(move || {
        secure_scenario(&chromium, addr, &spki, &viewer, &a, &b, &admin);
    })
    .await
    .expect("the browser scenario on a secure server");

    // Nothing the viewer tried changed either job.
    for id in [&job_a, &job_b] {
        let job = admin_get_job(&channel, id).await;
        let status = job.status.expect("status");
        assert_eq!(
            status.state,
            pb::JobState::Running as i32,
            "{id}: {status:?}"
        );
        assert!(!status.kill_requested, "{id}: {status:?}");
    }
    common::within("graceful shutdown", server.shutdown())
        .await
        .expect("graceful shutdown");
}

fn secure_scenario(
    chromium: &Path,
    addr: std::net::SocketAddr,
    spki: &str,
    viewer: &str,
    job_a: &str,
    job_b: &str,
    admin: &BlockingAdmin,
) {
    let shots = shots_dir();
    let mut b = Browser::launch_with(
        chromium,
        &[format!("--ignore-certificate-errors-spki-list={spki}")],
    );
    let signin_shown = "!document.getElementById('signin').hidden";
    let signed_out = "document.getElementById('who').textContent === '' \
         && document.querySelectorAll('tr[data-host], tr[data-job], tr[data-pool]').length === 0";

    // Without a token: the server answers 401, the page asks for one and
    // shows no data.
    b.navigate(&format!("https://127.0.0.1:{}/ui/", addr.port()));
    b.wait_for(
        "the sign-in form",
        &format!(
            "{signin_shown} && document.getElementById('status').innerText.includes('UNAUTHENTICATED') && {signed_out}"
        ),
    );
    assert_eq!(
        b.eval("fetch('/v1/hosts').then(r => r.status)"),
        json!(401),
        "the API without a token"
    );
    assert_ne!(
        b.text("document.getElementById('live').textContent"),
        "● live"
    );
    b.screenshot(&shots.join("secure-signin.png"));

    // A wrong token: refused, the form again.
    let submit = |b: &mut Browser, token: &str| {
        b.eval(&format!(
            "(() => {{ document.getElementById('token').value = {}; \
             document.querySelector('#signin button[type=submit]').click(); }})()",
            json!(token)
        ));
    };
    submit(&mut b, "pel_not_a_token_of_this_server");
    b.wait_for(
        "the wrong token refused",
        &format!(
            "{signin_shown} && document.getElementById('status').innerText.includes('UNAUTHENTICATED') && {signed_out}"
        ),
    );

    // The viewer of /a: who it is, the watch live, /a's job only.
    submit(&mut b, viewer);
    b.eval("location.hash = '#/jobs'");
    b.wait_for(
        "the viewer signed in, following the watch",
        "document.getElementById('signin').hidden && document.getElementById('who').innerText.includes('viewer-a') \
         && document.querySelector('#who a').innerText === 'sign out' \
         && document.getElementById('live').textContent === '● live'",
    );
    b.wait_for(
        "/a's job in the list, alone",
        &format!(
            "(() => {{ const r = document.querySelector('tr[data-job=\"{job_a}\"]'); \
             return !!r && r.innerText.includes('alpha') && r.innerText.includes('RUNNING') \
             && document.getElementById('jobs').innerText.includes('1 of 1 jobs'); }})()"
        ),
    );
    assert!(
        b.eval(&format!(
            "document.querySelector('tr[data-job=\"{job_b}\"]') === null && !document.body.innerText.includes('bravo')"
        )) == Json::Bool(true),
        "/b's job is not shown to a viewer of /a"
    );
    assert_eq!(
        b.text("document.getElementById('status').innerText"),
        "",
        "no error once signed in"
    );
    b.screenshot(&shots.join("secure-jobs-viewer.png"));

    // The pools page: /a, not /b.
    b.eval("location.hash = '#/pools'");
    b.wait_for(
        "/a in the pools tree, not /b",
        "!!document.querySelector('tr[data-pool=\"/a\"]') && !document.querySelector('tr[data-pool=\"/b\"]')",
    );

    // /a's job page: its events from the job's watch (streamed with the
    // token), live: the admin scales the job and the new instance's events
    // appear (the events are never polled).
    b.eval(&format!("location.hash = '#/jobs/{job_a}'"));
    b.wait_for(
        "the job's running instances and its events",
        "document.querySelectorAll('#instances .cell.s-running').length === 2 && !document.getElementById('kill').disabled \
         && [...document.querySelectorAll('#events tr[data-revision]')].filter(r => r.innerText.includes('RUNNING')).length >= 2",
    );
    b.eval(
        "window.before = Math.max(...[...document.querySelectorAll('#events tr[data-revision]')].map(r => Number(r.dataset.revision)))",
    );
    admin.scale(job_a, 3);
    b.wait_for(
        "the new instance's events, live",
        "[...document.querySelectorAll('#events tr[data-revision]')].some(r => Number(r.dataset.revision) > window.before \
         && r.cells[3].innerText === '2' && r.cells[5].innerText.includes('RUNNING')) \
         && document.querySelectorAll('#instances .cell.s-running').length === 3",
    );
    b.eval(
        "window.confirm = (m) => { window.asked = m; return true; }; document.getElementById('kill').click()",
    );
    b.wait_for(
        "the kill refused",
        "document.getElementById('job-error').innerText.includes('Kill failed: PERMISSION_DENIED')",
    );
    let refusal = b.text("document.getElementById('job-error').innerText");
    assert!(
        refusal.contains("viewer-a") && refusal.contains("jobs.write") && refusal.contains("/a"),
        "the refusal names who, the permission and the pool: {refusal}"
    );
    assert!(b.text("window.asked").starts_with("Kill job alpha"));
    let job = admin.job(job_a);
    let status = job.status.expect("status");
    assert_eq!(
        status.state,
        peloton_proto::v1::JobState::Running as i32,
        "the job still runs: {status:?}"
    );
    assert!(!status.kill_requested, "no kill requested: {status:?}");
    b.screenshot(&shots.join("secure-kill-refused.png"));

    // A deep link to /b's job: refused, nothing of it shown.
    b.eval(&format!("location.hash = '#/jobs/{job_b}'"));
    b.wait_for(
        "/b's job refused",
        "document.getElementById('status').innerText.includes('PERMISSION_DENIED') \
         && document.getElementById('status').innerText.includes('jobs.read') \
         && document.getElementById('spec').textContent === ''",
    );

    // Signing out forgets the token: the form again, nothing shown.
    b.eval("window.beforeSignOut = true; document.querySelector('#who a').click()");
    b.wait_for(
        "the sign-in form after signing out",
        &format!(
            "window.beforeSignOut === undefined && {signin_shown} && {signed_out} \
             && sessionStorage.getItem('peloton-token') === null"
        ),
    );
    println!("console screenshots: {}", shots.display());
}

/// A request carrying the bootstrap admin's bearer token.
fn as_admin<T>(message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut().insert(
        "authorization",
        format!("Bearer {SECURE_ADMIN_TOKEN}")
            .parse()
            .expect("an ASCII header value"),
    );
    r
}

/// The admin's calls from the browser scenario's (blocking) thread.
struct BlockingAdmin {
    rt: tokio::runtime::Handle,
    channel: Channel,
}

impl BlockingAdmin {
    fn job(&self, id: &str) -> peloton_proto::v1::Job {
        self.rt.block_on(admin_get_job(&self.channel, id))
    }

    fn scale(&self, id: &str, instances: u32) {
        let mut jobs = JobServiceClient::new(self.channel.clone());
        self.rt
            .block_on(jobs.scale(as_admin(peloton_proto::v1::ScaleJobRequest {
                id: id.into(),
                instance_count: instances,
                version: 0,
            })))
            .unwrap_or_else(|e| panic!("scale {id}: {e:?}"));
    }
}

/// The job `id` as the admin sees it.
async fn admin_get_job(channel: &Channel, id: &str) -> peloton_proto::v1::Job {
    JobServiceClient::new(channel.clone())
        .get(as_admin(peloton_proto::v1::GetJobRequest { id: id.into() }))
        .await
        .unwrap_or_else(|e| panic!("get job {id}: {e:?}"))
        .into_inner()
        .job
        .expect("job")
}

/// The base64 SHA-256 of the SubjectPublicKeyInfo of the first certificate
/// in `pem`: how Chromium's `--ignore-certificate-errors-spki-list` names
/// the one key it accepts despite an unknown issuer.
fn spki_sha256_base64(pem: &str) -> String {
    use sha2::Digest as _;
    let body = pem
        .split("-----BEGIN CERTIFICATE-----")
        .nth(1)
        .and_then(|rest| rest.split("-----END CERTIFICATE-----").next())
        .expect("a PEM certificate");
    let der = base64_decode(body);
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version
    // OPTIONAL, serialNumber, signature, issuer, validity, subject,
    // subjectPublicKeyInfo, ... }, ... }
    let (_, cert, _) = der_split(&der);
    let (_, mut tbs, _) = der_split(cert);
    if tbs[0] == 0xa0 {
        tbs = der_split(tbs).2;
    }
    for _ in 0..5 {
        tbs = der_split(tbs).2;
    }
    let (spki, _, _) = der_split(tbs);
    // A SEQUENCE naming the EC public key algorithm (1.2.840.10045.2.1).
    assert_eq!(spki[0], 0x30, "SubjectPublicKeyInfo");
    assert!(
        spki.windows(9)
            .any(|w| w == [0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01]),
        "an EC key's SubjectPublicKeyInfo"
    );
    base64_encode(&sha2::Sha256::digest(spki))
}

/// The first DER element of `bytes`: the whole element, its contents and
/// what follows it.
fn der_split(bytes: &[u8]) -> (&[u8], &[u8], &[u8]) {
    let first = bytes[1];
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        let len = bytes[2..2 + n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, 2 + n)
    };
    let end = header + len;
    (&bytes[..end], &bytes[header..end], &bytes[end..])
}

/// A batch job of real commands in /real (`gpu` GPUs per task).
fn real_job(name: &str, instances: u32, shell: &str, gpu: f64) -> Json {
    json!({"spec": {
        "name": name,
        "owner": "console-test",
        "type": "JOB_TYPE_BATCH",
        "pool": "/real",
        "instanceCount": instances,
        "defaultTask": {
            "shell": shell,
            "resources": {"cpu": 0.5, "memoryMb": 64, "gpu": gpu},
            "killGracePeriodMs": 2000,
        },
    }})
}

/// The `peloton-agent` binary next to `pelotond` (the workspace's build).
fn agent_binary() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_pelotond")).with_file_name("peloton-agent");
    assert!(
        bin.exists(),
        "{} not found: build the workspace's binaries first (`cargo test --workspace` does, or \
         `cargo build -p peloton-agent`)",
        bin.display()
    );
    bin
}

/// Real agents as child processes. Each stops its tasks when it stops
/// (`--stop-tasks-on-exit`), and stops when this process does
/// (`--exit-with-parent`); dropping them stops each (SIGTERM, then SIGKILL
/// after 20 s).
#[derive(Default)]
struct Agents(Vec<(String, Child)>);

impl Agents {
    fn spawn(
        &mut self,
        bin: &Path,
        addr: std::net::SocketAddr,
        dir: &Path,
        host: &str,
        resources: &str,
        zone: &str,
    ) {
        let work = dir.join(format!("agent-{host}"));
        std::fs::create_dir_all(&work).expect("work dir");
        let child = Command::new(bin)
            .args(["--server", &format!("http://{addr}")])
            .arg("--work-dir")
            .arg(&work)
            .args(["--host", host, "--token", AGENT_TOKEN])
            .args(["--resources", resources])
            .args(["--attr", &format!("zone={zone}")])
            .args(["--isolation", "rlimit", "--stop-tasks-on-exit"])
            .args(["--exit-with-parent", &std::process::id().to_string()])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        self.0.push((host.to_string(), child));
    }

    /// Stops the agent of `host` and waits for it to exit.
    fn stop(&mut self, host: &str) {
        let i = self
            .0
            .iter()
            .position(|(h, _)| h == host)
            .expect("a known agent");
        let (_, mut child) = self.0.remove(i);
        stop_child(&mut child);
    }
}

/// SIGTERM to the child (by its id), then SIGKILL if it has not exited
/// within 20 s.
fn stop_child(child: &mut Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
        }
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            stop_child(child);
        }
    }
}

fn job(name: &str, pool: &str, instances: u32, cpu: f64) -> Json {
    json!({"spec": {
        "name": name,
        "owner": "console-test",
        "type": "JOB_TYPE_BATCH",
        "pool": pool,
        "instanceCount": instances,
        "defaultTask": {
            "command": "/bin/true",
            "resources": {"cpu": cpu, "memoryMb": 256},
            "sim": {"durationMs": 600_000, "exitCode": 0},
        },
    }})
}

fn shots_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("peloton-console-shots");
    std::fs::create_dir_all(&dir).expect("the screenshots' directory");
    dir
}

/// The system's Chromium, or a failure that says how to install it.
fn find_chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("PELOTON_CHROMIUM") {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            let p = dir.join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "the console tests need Chromium: none of chromium, chromium-browser, google-chrome is on \
         PATH (install it with `apt-get install -y chromium`, or set PELOTON_CHROMIUM)"
    );
}

/// A blocking JSON client of the server's HTTP API.
struct Api {
    base: String,
    agent: ureq::Agent,
}

impl Api {
    fn new(base: &str) -> Api {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(common::TIMEOUT))
            .build()
            .into();
        Api {
            base: base.to_string(),
            agent,
        }
    }

    fn get(&self, path: &str) -> Json {
        let url = format!("{}{path}", self.base);
        let mut resp = self
            .agent
            .get(&url)
            .call()
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().expect("body");
        assert_eq!(status, 200, "GET {url}: {text}");
        serde_json::from_str(&text).expect("JSON")
    }

    /// Polls the job's tasks until one matches; that task.
    fn wait_task_where(&self, job: &str, what: &str, matches: impl Fn(&Json) -> bool) -> Json {
        let deadline = Instant::now() + PAGE_TIMEOUT;
        loop {
            let tasks = self.get(&format!("/v1/jobs/{job}/tasks"));
            if let Some(t) = tasks["tasks"]
                .as_array()
                .and_then(|ts| ts.iter().find(|t| matches(t)))
            {
                return t.clone();
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} of job {job}: {tasks}"
            );
            std::thread::sleep(PAGE_POLL);
        }
    }

    /// Polls the job's tasks until `done` holds for them; the tasks.
    fn wait_tasks(&self, job: &str, what: &str, done: impl Fn(&[Json]) -> bool) -> Vec<Json> {
        let deadline = Instant::now() + AGENT_TIMEOUT;
        loop {
            let tasks = self.get(&format!("/v1/jobs/{job}/tasks"));
            let list = tasks["tasks"].as_array().cloned().unwrap_or_default();
            if done(&list) {
                return list;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} (job {job}): {tasks}"
            );
            std::thread::sleep(PAGE_POLL);
        }
    }

    fn post(&self, path: &str, body: Json) -> Json {
        let url = format!("{}{path}", self.base);
        let mut resp = self
            .agent
            .post(&url)
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap_or_else(|e| panic!("POST {url}: {e}"));
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().expect("body");
        assert_eq!(status, 200, "POST {url}: {text}");
        serde_json::from_str(&text).expect("JSON")
    }
}

/// Headless Chromium driven over the DevTools protocol on a pipe
/// (`--remote-debugging-pipe`: commands on its fd 3, answers and events on
/// its fd 4, each message JSON ending with a NUL byte). The protocol needs
/// no more than a few commands here, so no client crate: `Target` to open a
/// page, `Page.navigate`, `Runtime.evaluate`, `Page.captureScreenshot`.
struct Browser {
    child: Child,
    to_browser: ChildStdin,
    from_browser: mpsc::Receiver<Json>,
    next_id: u64,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn launch(chromium: &Path) -> Browser {
        Browser::launch_with(chromium, &[])
    }

    /// [`Browser::launch`] with more command-line flags.
    fn launch_with(chromium: &Path, flags: &[String]) -> Browser {
        let profile = tempfile::tempdir().expect("a browser profile directory");
        // The shell puts our pipes on the descriptors the protocol uses.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>/dev/null"#)
            .arg(chromium)
            .args([
                "--headless",
                "--remote-debugging-pipe",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--window-size=1440,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(flags)
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromium.display()));
        let to_browser = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, from_browser) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut message = Vec::new();
                match reader.read_until(0, &mut message) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                message.pop_if(|b| *b == 0);
                let Ok(json) = serde_json::from_slice::<Json>(&message) else {
                    continue;
                };
                if tx.send(json).is_err() {
                    return;
                }
            }
        });
        let mut b = Browser {
            child,
            to_browser,
            from_browser,
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = b.call("Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().expect("targetId").to_string();
        let attached = b.call(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        );
        b.session = attached["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_string();
        b.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1440, "height": 900, "deviceScaleFactor": 1, "mobile": false}),
        );
        b
    }

    /// One command (on the page's session once there is one); its result.
    fn call(&mut self, method: &str, params: Json) -> Json {
        self.try_call(method, params)
            .unwrap_or_else(|error| panic!("{method}: {error}"))
    }

    /// [`Browser::call`], with the protocol's error as an `Err` (such as
    /// no execution context while the page reloads).
    fn try_call(&mut self, method: &str, params: Json) -> Result<Json, Json> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = message.to_string().into_bytes();
        bytes.push(0);
        self.to_browser
            .write_all(&bytes)
            .and_then(|()| self.to_browser.flush())
            .unwrap_or_else(|e| panic!("{method}: the browser's pipe: {e}"));
        let deadline = Instant::now() + PAGE_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .from_browser
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("{method}: no answer from the browser: {e}"));
            // Events (no id) are not needed: the page is polled instead.
            if answer["id"].as_u64() != Some(id) {
                continue;
            }
            if let Some(error) = answer.get("error") {
                return Err(error.clone());
            }
            return Ok(answer["result"].clone());
        }
    }

    fn navigate(&mut self, url: &str) {
        let r = self.call("Page.navigate", json!({"url": url}));
        assert!(r.get("errorText").is_none(), "navigate to {url}: {r}");
    }

    /// Evaluates `expression` in the page (awaiting a promise); its value.
    /// A protocol error (no page to evaluate in, while one reloads) is
    /// returned as an exception too.
    fn eval(&mut self, expression: &str) -> Json {
        let r = match self.try_call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        ) {
            Ok(r) => r,
            Err(error) => return json!({"exception": error}),
        };
        if let Some(e) = r.get("exceptionDetails") {
            return json!({"exception": e});
        }
        r["result"]["value"].clone()
    }

    /// `expression`'s value as text.
    fn text(&mut self, expression: &str) -> String {
        match self.eval(expression) {
            Json::String(s) => s,
            other => panic!("{expression}: not text: {other}"),
        }
    }

    /// Polls `condition` until it is true; on timeout, fails with what the
    /// page shows (and a screenshot of it).
    fn wait_for(&mut self, what: &str, condition: &str) {
        self.wait_for_within(what, condition, PAGE_TIMEOUT);
    }

    /// `wait_for` with its own timeout.
    fn wait_for_within(&mut self, what: &str, condition: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.eval(condition) == Json::Bool(true) {
                return;
            }
            if Instant::now() >= deadline {
                let shot = shots_dir().join("failure.png");
                self.screenshot(&shot);
                let text = self.eval("document.body ? document.body.innerText : ''");
                panic!(
                    "timed out after {timeout:?} waiting for {what} ({condition}); the page \
                     ({}) shows: {text}",
                    shot.display()
                );
            }
            std::thread::sleep(PAGE_POLL);
        }
    }

    fn screenshot(&mut self, path: &Path) {
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64_decode(r["data"].as_str().expect("screenshot data"));
        std::fs::write(path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Standard base64 (the protocol's encoding of binary results).
fn base64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            _ => continue,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// Standard base64, padded.
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn base64_decodes() {
    assert_eq!(base64_decode("aGVsbG8="), b"hello");
    assert_eq!(base64_decode("aGk="), b"hi");
}

#[test]
fn base64_encodes() {
    assert_eq!(base64_encode(b"hello"), "aGVsbG8=");
    assert_eq!(base64_encode(b"hi"), "aGk=");
    assert_eq!(base64_encode(b"abc"), "YWJj");
    assert_eq!(base64_encode(b""), "");
}
