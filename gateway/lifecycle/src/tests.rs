//! The core tested as data: fixture scripts run on the simulated cluster of
//! [`crate::sim`] (a real engine, a model of agents, a model of the store),
//! the resulting log checked with expect-test.
//!
//! Script lines (one input each; `#` starts a comment):
//! - `host NAME cpu=C mem=M` — an agent registers an empty host;
//! - `pool PATH [cpu=C] [controller_limit=PCT]` — a pool with that cpu
//!   reservation (and controller limit);
//! - `job NAME pool=P n=N cpu=C [mem=M] [gang=G [elastic=MIN]] [service] [health]
//!   [max_failures=F] [backoff=MS] [priority=P] [preemptible]
//!   [max_running=N] [controller]` — submit a job (its id is NAME);
//!   `controller`: instance 0 is its controller task (an override);
//! - `queue P` — pool P's queue (instance and class of each entry);
//! - `cycle` — a scheduling cycle; launches are started at once by their
//!   agents (a RUNNING report);
//! - `exit J/I CODE` — the current run exits; `lost-host H` — a host goes
//!   silent; `healthy J/I`, `unhealthy J/I` — a health verdict;
//! - `confirm` — agents confirm every kill they were sent;
//! - `tick MS` — time passes, timers fire;
//! - `kill J`, `restart J`, `scale J N`, `kill J/I`, `restart J/I`,
//!   `drain H`, `up H`, `delete J`; `hosts H...` — the hosts' states;
//! - `update-status U` — an update's record as the API reads it;
//! - `crash` — the server restarts from its store (agents keep their
//!   runs); `register H` — H's agent registers again, listing its runs;
//!   `disconnect H` — H's agent's session ends (its runs go on);
//!   `cut H` — H's session breaks before the server hears of it (what
//!   the server sends meanwhile is lost);
//!   `twin H` — another agent (another identity) registers H, with no runs;
//!   `claim H [agent=A] holder=B heard=MS` — agent A (default: none)
//!   registers H, with no runs, while a session of agent B last heard at
//!   MS (after the script began) holds it;
//!   `reachable true|false` — whether agents can reach the server;
//!   `agents-heard [H=MS]...` — the hosts' last-heard times (MS after the script
//!   began; a host not named was not heard since the server started),
//!   looked at for silent hosts;
//! - `retention ms=MS max=N` (first line only) — finished jobs are kept
//!   MS ms and at most N of them; `jobs` — the live jobs and their states,
//!   and the rows the store holds for them;
//! - `hostpool create|delete P`, `move P H... [--force]` (hosts into host pool P),
//!   `hostpools` — the host pools, their members, every host's tag and
//!   the stored rows; `job … host_pool=P` runs in host pool P;
//! - `app A` — a client-mode application registers; `target A N` — its
//!   executor target; `heard A` — its driver calls; `lease A` — when it
//!   was last heard from;
//! - `token create|revoke T [digest=N]`, `cert issue|revoke T fp=N
//!   [until=MS]` (a certificate valid until MS after the start),
//!   `audit PRINCIPAL METHOD`, `audit-bound max=N` (first line only),
//!   `access` — the tokens, their certificates, the audit log and the rows;
//! - `secrets J NAME=VALUE...` — replace job J's secrets (an empty value
//!   keeps the current one); `show-secrets J`;
//! - `usage H t=MS J/I=CPU_MS:MEM_MIB...` — H's agent reports its runs'
//!   cumulative CPU time and memory, measured MS after the script began (any rows or
//!   events it causes are shown: none but a QoS preemption's); `used J/I`,
//!   `used J`, `used @H` — a run's, a job's, a host's usage;
//! - `job … revocable` runs on slack; `lends H` — what host H lends
//!   revocable tasks, what they borrowed and what is free (cpu millis,
//!   memory MiB);
//! - `ledger-bound max=N [ms=MS]` (first line only) — at most N usage
//!   records, kept MS ms; `ledger` — the usage records, oldest first, and
//!   the stored rows; `job … owner=O` is owned by O (default "-");
//! - `task J/I` — the instance's run: state, times (ms since the script
//!   began), its last checkpoint and lost work if any, and whether its host
//!   has yet to confirm its end; `checkpoint J/I` — the run's agent reports
//!   a checkpoint now; `job … notice=MS` declares a preemption notice;
//! - `job … cmd=C` runs command C (default: the simulator's one command),
//!   `expect=MS` declares its expected run time, `expect_override=I:MS`
//!   declares instance I's (an override), `max_time=MS` is its max
//!   running time; `estimate J/I` — the instance's runtime estimate and
//!   where it comes from.
//! - `job … after=COND:J,…` waits for jobs J (COND: `succeeded`,
//!   `finished` or `failed`); `waits J` — what job J still waits for.
//! - `edit J [priority=P] [max_running=N] [max_time=MS] [max_failures=F]
//!   [version=V]` — edit batch job J's pending instances; `sla J` — its
//!   version, config, editable fields and each instance's config.
//! - `cron-run J`, `cron-suspend J`, `cron-resume J` — cron job J's tick
//!   now, suspension, resumption.

use expect_test::{Expect, expect};
use peloton_engine::{PoolConfig, Resources};

use super::*;
use crate::sim::{START_MS, Sim, plan};

/// A fixture script read line by line into the simulated cluster.
struct Env {
    sim: Sim,
}

impl Env {
    fn new() -> Self {
        Env { sim: Sim::new() }
    }

    fn step(&mut self, input: Input) {
        let _ = self.sim.step(input);
    }

    /// The host and agent key of instance `J/I`'s current run.
    fn current(&self, target: &str) -> (Arc<str>, AgentRunKey) {
        let (job, i) = target.split_once('/').expect("J/I");
        self.sim
            .current(job, i.parse().expect("instance"))
            .expect("a placed run")
    }

    fn run_line(&mut self, line: &str) {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            return;
        }
        self.sim.say(format!("> {line}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        let arg = |name: &str| -> Option<&str> {
            words
                .iter()
                .find_map(|w| w.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
        };
        let num =
            |name: &str, default: u64| arg(name).map_or(default, |v| v.parse().expect("number"));
        let flag = |name: &str| words.contains(&name);
        match words[0] {
            "host" => {
                let mut spec = crate::sim::host_spec(words[1], num("cpu", 4), num("mem", 4096));
                let gpus = num("gpus", 0);
                spec.capacity = Resources::new(
                    num("cpu", 4) * 1000,
                    num("mem", 4096),
                    num("disk", 0),
                    gpus * 1000,
                );
                spec.gpu_devices = gpus as u8;
                if let Some(zone) = arg("zone") {
                    spec.attributes.push(("zone".into(), zone.into()));
                }
                let _ = self.sim.add_host_spec(spec);
            }
            "reserved" => {
                let slot = self
                    .sim
                    .engine
                    .hosts()
                    .lookup(words[1])
                    .expect("host")
                    .idx();
                let r = self.sim.engine.hosts().reserved(slot);
                let f = self.sim.engine.hosts().free(slot);
                self.sim
                    .say(format!("  reserved @{}: {r}; free: {f}", words[1]));
            }
            "hosts" => {
                // `hosts H...`: the named hosts' states.
                let hosts = self.sim.engine.hosts();
                let states: Vec<String> = words[1..]
                    .iter()
                    .map(|&name| {
                        let id = hosts.lookup(name).expect("host");
                        format!("{name}={:?}", hosts.state(id))
                    })
                    .collect();
                self.sim.say(format!("  hosts: {}", states.join(" ")));
            }
            "volumes" => {
                let lines: Vec<String> = self
                    .sim
                    .core
                    .volumes()
                    .map(|v| {
                        format!(
                            "  volume {} @{} {}MiB{}",
                            v.id,
                            self.sim.core.host_name(v.host),
                            v.size_mb,
                            if self.sim.core.volume_in_use(v) {
                                " in use"
                            } else {
                                ""
                            }
                        )
                    })
                    .collect();
                for l in lines {
                    self.sim.say(l);
                }
            }
            "delete-volume" => self.step(Input::DeleteVolume {
                id: words[1].into(),
            }),
            "register" => {
                let _ = self.sim.register(words[1]);
            }
            "disconnect" => {
                let _ = self.sim.disconnect(words[1]);
            }
            "twin" => {
                let _ = self.sim.register_twin(words[1]);
            }
            "cut" => self.sim.cut(words[1]),
            "claim" => {
                let holder = crate::Holder {
                    agent_id: arg("holder").unwrap_or("").into(),
                    last_heard_ms: START_MS + num("heard", 0),
                };
                let _ = self.sim.claim(words[1], arg("agent").unwrap_or(""), holder);
            }
            "reachable" => self.step(Input::AgentsReachable(words[1] == "true")),
            "agents-heard" => {
                let heard = words[1..]
                    .iter()
                    .map(|w| {
                        let (h, ms) = w.split_once('=').expect("H=MS");
                        (Arc::from(h), START_MS + ms.parse::<u64>().expect("ms"))
                    })
                    .collect();
                self.step(Input::AgentsHeard { heard });
            }
            "hostpool" => {
                let name = words[2].to_string();
                self.step(match words[1] {
                    "create" => Input::CreateHostPool { name },
                    "delete" => Input::DeleteHostPool { name },
                    other => panic!("hostpool {other}?"),
                });
            }
            "move" => {
                let force = words.last() == Some(&"--force");
                let hosts = &words[2..words.len() - usize::from(force)];
                self.step(Input::MoveHosts {
                    hosts: hosts.iter().map(|h| h.to_string()).collect(),
                    to: words[1].into(),
                    force,
                });
            }
            "hostpools" => {
                let core = &self.sim.core;
                let pools = core.host_pools();
                let members: Vec<String> =
                    pools.members().map(|(h, p)| format!("{h}={p}")).collect();
                let hosts = self.sim.engine.hosts();
                let tags: Vec<String> = hosts
                    .live_hosts()
                    .iter()
                    .map(|slot| {
                        let spec = hosts
                            .spec(hosts.lookup_slot(slot as usize).expect("live"))
                            .expect("live");
                        format!(
                            "{}={}",
                            spec.name,
                            crate::hostpools::host_pool_attribute(&spec).unwrap_or("-")
                        )
                    })
                    .collect();
                let store = &self.sim.store;
                let line = format!(
                    "  host pools: {} | members: {} | tags: {} | stored: {} {}",
                    pools.names().collect::<Vec<_>>().join(" "),
                    members.join(" "),
                    tags.join(" "),
                    store
                        .host_pools
                        .iter()
                        .map(|n| n.to_string())
                        .collect::<Vec<_>>()
                        .join(" "),
                    store
                        .host_pool_members
                        .iter()
                        .map(|(h, p)| format!("{h}={p}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                );
                self.sim.say(line);
            }
            "pool" => self.step(Input::CreatePool {
                path: words[1].into(),
                config: PoolConfig::default()
                    .with_reservation(Resources::new(num("cpu", 0) * 1000, num("mem", 0), 0, 0))
                    .with_controller_limit_pct(num("controller_limit", 100) as f64),
            }),
            "queue" => {
                let engine = &self.sim.engine;
                let pool = engine.resources().tree().lookup(words[1]).expect("pool");
                let entries = engine
                    .resources()
                    .queue_order(pool, 100)
                    .expect("live pool");
                let shown: Vec<String> = entries
                    .iter()
                    .map(|e| {
                        let h = peloton_engine::task::TaskHandle::from_u64(e.head.0);
                        let (k, i) = self.sim.core.instance_of(engine, h).expect("queued");
                        let job = &self.sim.core.job(k).expect("live").id;
                        format!("{job}/{i} {}", e.class.name())
                    })
                    .collect();
                self.sim
                    .say(format!("  queue {}: {}", words[1], shown.join(", ")));
            }
            "job" | "plan" => {
                let mut p = plan(
                    arg("pool").expect("pool="),
                    num("n", 1) as u32,
                    num("cpu", 1) * 1000,
                );
                p.default_mut().request =
                    Resources::new(num("cpu", 1) * 1000, num("mem", 64), 0, 0);
                p.gang = num("gang", 1) as u32;
                p.elastic_min = num("elastic", 0) as u32;
                p.name = arg("name").unwrap_or(words[1]).into();
                p.owner = arg("owner").unwrap_or("-").into();
                p.priority = num("priority", 0) as u32;
                p.preemptible = flag("preemptible") || flag("revocable");
                p.default_mut().revocable = flag("revocable");
                p.max_running = num("max_running", 0) as u32;
                p.default_mut().max_per_host = num("per_host", 0) as u16;
                p.max_unavailable = num("max_unavailable", 1) as u32;
                p.default_mut().restart.max_failures = num("max_failures", 0) as u32;
                p.default_mut().restart.backoff_ms = num("backoff", 1000);
                p.default_mut().health_check = flag("health");
                p.default_mut().shutdown_delay_ms = num("shutdown_delay", 0);
                p.default_mut().preemption_notice_ms = num("notice", 0);
                p.default_mut().request.0[2] = num("disk", 0);
                p.default_mut().request.0[3] = num("gpu", 0);
                p.default_mut().expected_runtime_ms = num("expect", 0);
                if let Some(names) = arg("ports") {
                    let names: Box<[Box<str>]> = names.split(',').map(Box::from).collect();
                    p.default_mut().ports = names.len() as u16;
                    p.default_mut().port_names = names;
                }
                if let Some(framework) = arg("rendezvous") {
                    p.rendezvous = Some(Arc::new(crate::rendezvous::RendezvousAsk {
                        framework: framework.into(),
                        port: "".into(),
                    }));
                }
                if let Some(c) = arg("cmd") {
                    p.default_mut().command_key = command_key([c]);
                }
                p.max_running_time_ms = num("max_time", 0);
                if let Some((i, ms)) = arg("expect_override").and_then(|a| a.split_once(':')) {
                    let mut t = TaskTemplate::clone(&p.default);
                    t.expected_runtime_ms = ms.parse().expect("ms");
                    p.overrides
                        .insert(i.parse().expect("instance"), Arc::new(t));
                }
                if flag("service") {
                    p.kind = JobKind::Service;
                }
                if flag("daemon") {
                    p.kind = JobKind::Daemon;
                }
                if let Some(c) = arg("constraint") {
                    p.default_mut().constraint = c.replace('_', " ");
                }
                if let Some(hp) = arg("host_pool") {
                    // As the shell's validation ANDs it in.
                    p.host_pool = hp.into();
                    let tag = format!("{HOST_POOL_ATTRIBUTE} == \"{hp}\"");
                    let t = p.default_mut();
                    t.constraint = match t.constraint.as_str() {
                        "" => tag,
                        c => format!("({c}) and {tag}"),
                    };
                }
                if let Some(mb) = arg("volume") {
                    p.default_mut().volume = Some(VolumeTemplate {
                        size_mb: mb.parse().expect("MiB"),
                        path: "data".into(),
                    });
                }
                if flag("controller") {
                    let mut t = TaskTemplate::clone(&p.default);
                    t.controller = true;
                    p.overrides.insert(0, Arc::new(t));
                }
                if let Some(ms) = arg("relocate") {
                    p.volume_policy = VolumePolicy {
                        host_down_timeout_ms: ms.parse().expect("ms"),
                        relocate: true,
                    };
                }
                if let Some(after) = arg("after") {
                    p.after = after
                        .split(',')
                        .map(|d| {
                            let (condition, job) = d.split_once(':').expect("COND:J");
                            let condition = match condition {
                                "succeeded" => AfterCondition::Succeeded,
                                "finished" => AfterCondition::Finished,
                                "failed" => AfterCondition::Failed,
                                c => panic!("condition {c}"),
                            };
                            Dependency {
                                job: job.into(),
                                condition,
                            }
                        })
                        .collect();
                }
                if let Some(cron) = arg("cron") {
                    let overlap = match arg("overlap").unwrap_or("allow") {
                        "allow" => Overlap::Allow,
                        "forbid" => Overlap::Forbid,
                        "replace" => Overlap::Replace,
                        o => panic!("overlap {o}"),
                    };
                    let keep = arg("keep").map(|k| {
                        let (s, f) = k.split_once(':').expect("keep=S:F");
                        (s.parse().expect("n"), f.parse().expect("n"))
                    });
                    match Schedule::new(
                        &cron.replace('_', " "),
                        arg("tz").unwrap_or(""),
                        overlap,
                        keep.map(|k: (u32, u32)| k.0),
                        keep.map(|k| k.1),
                        Arc::from(&b"tick"[..]),
                    ) {
                        Ok(s) => p.schedule = Some(Arc::new(s)),
                        Err((field, why)) => {
                            self.sim.say(format!("  refused: schedule.{field}: {why}"));
                            return;
                        }
                    }
                }
                if words[0] == "plan" {
                    let config = exact_forecast();
                    let before = self.sim.core.revision();
                    let line = match self.sim.core.plan_job(&self.sim.engine, &p, &config) {
                        Ok(a) => {
                            let mut line = format!("  plan {} ({:?}):", words[1], a.stopped);
                            for x in &a.instances {
                                match x.start_ms {
                                    Some(ms) => line.push_str(&format!(
                                        " {}@{}+{} pos {};",
                                        x.instance,
                                        x.host.as_deref().unwrap_or("-"),
                                        ms - START_MS,
                                        x.position
                                    )),
                                    None => line.push_str(&format!(
                                        " {} none ({});",
                                        x.instance,
                                        x.why_not.as_deref().unwrap_or("-")
                                    )),
                                }
                            }
                            if a.victims.is_empty() {
                                line.push_str(" preempts none");
                            }
                            for v in &a.victims {
                                line.push_str(&format!(
                                    "\n    {} {}/{} @{} {} priority {} +{} ({})",
                                    if v.gang_mate { "stops" } else { "preempts" },
                                    v.job,
                                    v.instance,
                                    v.host,
                                    v.pool,
                                    v.priority,
                                    v.at_ms - START_MS,
                                    v.reason
                                ));
                            }
                            line
                        }
                        Err(e) => format!("  plan {} refused: {e}", words[1]),
                    };
                    assert_eq!(self.sim.core.revision(), before, "a plan changes nothing");
                    self.sim.engine.check_invariants();
                    self.sim.say(line);
                    return;
                }
                self.step(Input::CreateJob {
                    id: words[1].into(),
                    plan: Box::new(p),
                });
            }
            "app" => {
                // A client-mode application (registered, no executors yet).
                let mut p = plan(arg("pool").unwrap_or("/"), 0, 1000);
                p.kind = JobKind::Application;
                p.preemptible = true;
                p.app = Some(AppPlan {
                    max_executors: 10,
                    driver_in_job: false,
                    registered: true,
                });
                self.step(Input::CreateJob {
                    id: words[1].into(),
                    plan: Box::new(p),
                });
            }
            "target" => self.step(Input::AppTarget {
                id: words[1].into(),
                generation: num("generation", 1),
                total: words[2].parse().expect("executors"),
            }),
            "heard" => self.step(Input::AppHeard {
                id: words[1].into(),
            }),
            "lease" => {
                let k = self.sim.core.job_key(words[1]).expect("job");
                let line = match self.sim.core.app_last_heard(k) {
                    Some(at) => format!("  lease {}: heard {} ms ago", words[1], self.sim.now - at),
                    None => format!("  lease {}: none", words[1]),
                };
                self.sim.say(line);
            }
            "token" => {
                let name = words[2].to_string();
                self.step(match words[1] {
                    "create" => Input::CreateToken(Box::new(Token {
                        name,
                        grants: vec![
                            peloton_authz::Grant::new(peloton_authz::Role::Viewer, "/")
                                .expect("a grant"),
                        ],
                        created_at_ms: 0,
                        created_by: "admin".into(),
                        digest: [num("digest", 1) as u8; 32],
                        certificates: Vec::new(),
                    })),
                    "revoke" => Input::RevokeToken { name },
                    other => panic!("token {other}?"),
                });
            }
            "cert" => {
                let name = words[2].to_string();
                let fingerprint = [num("fp", 1) as u8; 32];
                self.step(match words[1] {
                    "issue" => Input::IssueCertificate {
                        name,
                        certificate: Certificate {
                            fingerprint,
                            issued_at_ms: 0,
                            not_after_ms: START_MS + num("until", 1000),
                        },
                    },
                    "revoke" => Input::RevokeCertificate { name, fingerprint },
                    other => panic!("cert {other}?"),
                });
            }
            "audit" => self.step(Input::Audit(Box::new(AuditEntry {
                principal: words[1].into(),
                method: words[2].into(),
                ..AuditEntry::default()
            }))),
            "audit-bound" => {
                assert_eq!(self.sim.core.n_jobs(), 0, "audit-bound comes first");
                self.sim = Sim::with_config(CoreConfig {
                    max_audit_entries: num("max", 3) as usize,
                    ..crate::sim::config()
                });
                self.sim.say(format!("> {line}"));
            }
            "ledger-bound" => {
                assert_eq!(self.sim.core.n_jobs(), 0, "ledger-bound comes first");
                self.sim = Sim::with_config(CoreConfig {
                    max_usage_records: num("max", 3) as usize,
                    usage_retention_ms: num("ms", USAGE_RETENTION_MS),
                    ..crate::sim::config()
                });
                self.sim.say(format!("> {line}"));
            }
            "ledger" => {
                // Every record, oldest first, and the stored rows.
                let lines: Vec<String> = self
                    .sim
                    .core
                    .ledger()
                    .records()
                    .map(|r| {
                        format!(
                            "  #{} {}/{}#{} {:?} exit={} @{} pool={} owner={} name={} \
                         start={} end={} wall={}ms cpu_req={}s cpu_used={}s \
                         mem_req={}MiBs peak={}MiB measured={}",
                            r.seq,
                            r.job_id,
                            r.instance,
                            r.run,
                            r.state,
                            r.exit_code,
                            r.host,
                            r.pool,
                            r.owner,
                            r.job_name,
                            r.started_ms.saturating_sub(START_MS),
                            r.finished_ms.saturating_sub(START_MS),
                            r.wall_ms(),
                            r.cpu_requested_core_s(),
                            r.cpu_used_core_s(),
                            r.memory_requested_mib_s(),
                            r.memory_peak_bytes >> 20,
                            r.used_until_ms.saturating_sub(START_MS),
                        )
                    })
                    .collect();
                for line in lines {
                    self.sim.say(line);
                }
                let stored: Vec<&u64> = self.sim.store.usage.keys().collect();
                self.sim.say(format!("  stored: {stored:?}"));
            }
            "access" => {
                let a = self.sim.core.access();
                let tokens: Vec<String> = a
                    .tokens()
                    .map(|t| {
                        let certs: Vec<String> = t
                            .certificates
                            .iter()
                            .map(|c| format!("{:02x}", c.fingerprint[0]))
                            .collect();
                        format!("{}[{}]", t.name, certs.join(","))
                    })
                    .collect();
                let audit: Vec<String> = a
                    .audit_newest_first()
                    .map(|e| format!("{}:{}", e.seq, e.principal))
                    .collect();
                let store = &self.sim.store;
                let line = format!(
                    "  tokens: {} | audit (newest first): {} | stored: {} tokens, audit {:?}",
                    tokens.join(" "),
                    audit.join(" "),
                    store.tokens.len(),
                    store.audit.keys().collect::<Vec<_>>()
                );
                self.sim.say(line);
            }
            "secrets" => {
                let secrets = words[2..]
                    .iter()
                    .map(|w| {
                        let (name, value) = w.split_once('=').expect("name=value");
                        Secret {
                            name: name.into(),
                            value: value.as_bytes().to_vec(),
                        }
                    })
                    .collect();
                self.step(Input::SetSecrets {
                    job_id: words[1].into(),
                    secrets,
                });
            }
            "show-secrets" => {
                let k = self.sim.core.job_key(words[1]).expect("job");
                let shown: Vec<String> = self
                    .sim
                    .core
                    .secrets_of(k)
                    .map(|s| {
                        s.iter()
                            .map(|s| format!("{}={}", s.name, String::from_utf8_lossy(&s.value)))
                            .collect()
                    })
                    .unwrap_or_default();
                self.sim
                    .say(format!("  secrets {}: {}", words[1], shown.join(" ")));
            }
            "cycle" => self.step(Input::Cycle),
            "lends" => {
                let hosts = self.sim.engine.hosts();
                let slot = hosts.lookup(words[1]).expect("host").idx();
                let show = |r: Resources| format!("cpu={} mem={}", r.0[0], r.0[1]);
                let line = format!(
                    "  {} lends {}, borrowed {}, free {}",
                    words[1],
                    show(hosts.reclaimable(slot)),
                    show(hosts.borrowed(slot)),
                    show(hosts.free(slot))
                );
                self.sim.say(line);
            }
            "usage" => {
                // `usage H t=MS J/I=CPU_MS:MEM_MIB...`: H's agent reports,
                // at its time MS, each run's cumulative CPU ms and memory.
                let runs = words[2..]
                    .iter()
                    .filter_map(|w| {
                        let (target, amounts) = w.split_once('=')?;
                        if !target.contains('/') {
                            return None;
                        }
                        let (cpu, mem) = amounts.split_once(':').expect("CPU_MS:MEM_MIB");
                        let key = match self.sim.current_key(target) {
                            Some((_, key)) => key,
                            None => {
                                let (job, i) = target.split_once('/').expect("J/I");
                                AgentRunKey {
                                    job_id: job.into(),
                                    instance: i.parse().expect("instance"),
                                    run: 1,
                                    launch: 1,
                                }
                            }
                        };
                        Some(usage::RunUsage {
                            key,
                            cpu_usec: cpu.parse::<u64>().expect("ms") * 1000,
                            memory_bytes: mem.parse::<u64>().expect("MiB") << 20,
                            disk_bytes: 0,
                        })
                    })
                    .collect();
                let report = usage::UsageReport {
                    host: words[1].into(),
                    time_ms: crate::sim::START_MS + num("t", 0),
                    runs,
                };
                let sim = &mut self.sim;
                let r = sim.core.step(
                    &mut sim.engine,
                    Input::Usage(Box::new(report)),
                    sim.now,
                    &mut sim.fx,
                );
                assert!(r.is_ok(), "{r:?}");
                let (rows, events) = (sim.fx.rows.len(), sim.fx.events.len());
                sim.commit();
                if rows + events > 0 {
                    sim.say(format!("  rows: {rows}, events: {events}"));
                }
            }
            "used" => {
                // `used J/I`, `used J`, `used @H`: usage as reads show it.
                let core = &self.sim.core;
                let shown = if let Some(host) = words[1].strip_prefix('@') {
                    let slot = self.sim.engine.hosts().lookup(host).expect("host").idx();
                    core.host_usage(HostSlot(slot as u32))
                } else if let Some((job, i)) = words[1].split_once('/') {
                    let k = core.job_key(job).expect("job");
                    core.run_usage(k, i.parse().expect("instance"))
                } else {
                    core.job_usage(core.job_key(words[1]).expect("job"))
                };
                let line = match shown {
                    None => format!("  used {}: none", words[1]),
                    Some(u) => format!(
                        "  used {}: cpu={}m mem={}MiB peak={}MiB",
                        words[1],
                        u.cpu_millis,
                        u.memory_bytes >> 20,
                        u.memory_peak_bytes >> 20
                    ),
                };
                self.sim.say(line);
            }
            "tick" => {
                self.sim.now += words[1].parse::<u64>().expect("ms");
                self.step(Input::Tick);
            }
            "exit" => {
                let code: i32 = words[2].parse().expect("code");
                let (host, key) = self.current(words[1]);
                let phase = if code == 0 {
                    RunPhase::Succeeded
                } else {
                    RunPhase::Failed
                };
                self.sim.end_run(&host, key.launch, phase, code);
            }
            "healthy" | "unhealthy" => {
                let health = if words[0] == "healthy" {
                    Health::Healthy
                } else {
                    Health::Unhealthy
                };
                let (host, key) = self.current(words[1]);
                self.sim.health(&host, key, health);
            }
            "checkpoint" => {
                let (host, key) = self.current(words[1]);
                self.sim.checkpoint(&host, key);
            }
            "confirm" => self.sim.confirm_kills(None),
            // `stall H`: H's agent takes launches without starting them
            // (until `start H`).
            "stall" => {
                self.sim.agents.get_mut(words[1]).expect("host").stalled = true;
            }
            "start" => self.sim.start_launches(&Arc::from(words[1])),
            "lost-host" => {
                let _ = self.sim.lose_host(words[1], true);
            }
            "partition" => {
                // Lost, but its agent and runs live on (they come back with
                // `register`).
                let _ = self.sim.lose_host(words[1], false);
            }
            "update" => {
                let k = self.sim.core.job_key(words[1]).expect("job");
                let mut p = self.sim.core.job(k).expect("job").plan.clone();
                p.instance_count = num("n", u64::from(p.instance_count)) as u32;
                p.default_mut().request =
                    Resources::new(num("cpu", 1) * 1000, num("mem", 64), 0, 0);
                if flag("health") {
                    p.default_mut().health_check = true;
                }
                if let Some(name) = arg("name") {
                    p.name = name.into();
                }
                self.step(Input::UpdateJob(Box::new(UpdateRequest {
                    job_id: words[1].into(),
                    version: 0,
                    id: words[2].into(),
                    plan: p,
                    spec: UpdateSpec {
                        batch_size: num("batch", 1) as u32,
                        max_instance_retries: num("retries", 0) as u32,
                        max_failed_instances: num("max_failed", 0) as u32,
                        rollback_on_failure: flag("rollback"),
                        start_paused: flag("paused"),
                    },
                })));
            }
            "update-status" => {
                let line = match self.sim.core.update(words[1]) {
                    Some(u) => {
                        let counts = self.sim.core.update_counts(u);
                        format!(
                            "  update {} {} done={}/{} failed={:?} failed_back={:?}{}",
                            u.id,
                            u.state.name(),
                            counts.done,
                            counts.total,
                            u.failed,
                            u.failed_back,
                            u.reason
                                .as_deref()
                                .map(|r| format!(" ({r})"))
                                .unwrap_or_default()
                        )
                    }
                    None => format!("  no update {}", words[1]),
                };
                self.sim.say(line);
            }
            "pause" | "resume" | "abort" | "rollback" => {
                let action = match words[0] {
                    "pause" => UpdateAction::Pause,
                    "resume" => UpdateAction::Resume,
                    "abort" => UpdateAction::Abort,
                    _ => UpdateAction::Rollback,
                };
                self.step(Input::UpdateAction {
                    id: words[1].into(),
                    action,
                });
            }
            "kill" | "restart" if words[1].contains('/') => {
                let (job, i) = words[1].split_once('/').expect("J/I");
                self.step(Input::TaskAction {
                    job_id: job.into(),
                    instances: vec![i.parse().expect("instance")],
                    version: 0,
                    restart: words[0] == "restart",
                });
            }
            "cron-run" | "cron-suspend" | "cron-resume" => {
                let action = match words[0] {
                    "cron-run" => JobAction::CronRunNow,
                    "cron-suspend" => JobAction::CronSuspend(true),
                    _ => JobAction::CronSuspend(false),
                };
                self.step(Input::JobAction {
                    id: words[1].into(),
                    version: 0,
                    action,
                });
            }
            "kill" | "restart" | "delete" | "scale" => {
                let action = match words[0] {
                    "kill" => JobAction::Kill,
                    "restart" => JobAction::Restart,
                    "delete" => JobAction::Delete,
                    _ => JobAction::Scale(words[2].parse().expect("count")),
                };
                self.step(Input::JobAction {
                    id: words[1].into(),
                    version: 0,
                    action,
                });
            }
            "edit" => {
                let opt = |name: &str| arg(name).map(|v| v.parse::<u64>().expect("number"));
                let edit = JobEdit {
                    priority: opt("priority").map(|v| v as u32),
                    max_running: opt("max_running").map(|v| v as u32),
                    max_running_time_ms: opt("max_time"),
                    max_failures: opt("max_failures").map(|v| v as u32),
                };
                self.step(Input::JobAction {
                    id: words[1].into(),
                    version: num("version", 0),
                    action: JobAction::Edit(edit),
                });
            }
            "sla" => {
                let k = self.sim.core.job_key(words[1]).expect("job");
                let job = self.sim.core.job(k).expect("job");
                let p = &job.plan;
                let configs: Vec<String> = job
                    .tasks
                    .iter()
                    .enumerate()
                    .map(|(i, t)| format!("{i}:{}", t.config))
                    .collect();
                let line = format!(
                    "  {} version {} config {} priority {} max_running {} max_time {} max_failures {} | instances' configs {} | kept {:?}",
                    words[1],
                    job.version,
                    job.config,
                    p.priority,
                    p.max_running,
                    p.max_running_time_ms,
                    p.default.restart.max_failures,
                    configs.join(" "),
                    job.old_configs.keys().collect::<Vec<_>>(),
                );
                self.sim.say(line);
            }
            "drain" | "up" => self.step(Input::Maintenance {
                hosts: vec![words[1].into()],
                start: words[0] == "drain",
            }),
            "task" => {
                let (job, i) = words[1].split_once('/').expect("J/I");
                let k = self.sim.core.job_key(job).expect("job");
                let i: u32 = i.parse().expect("instance");
                let t = &self.sim.core.job(k).expect("job").tasks[i as usize];
                let since = |ms: u64| ms.saturating_sub(START_MS);
                let line = format!(
                    "  {job}/{i}#{} {} started {} finished {}{}{}",
                    t.run,
                    t.state.name(),
                    since(t.started_at),
                    since(t.finished_at),
                    if t.checkpoint_at > 0 || t.lost_work > 0 {
                        format!(
                            " checkpoint {} lost work {} ms",
                            since(t.checkpoint_at),
                            t.lost_work
                        )
                    } else {
                        String::new()
                    },
                    if self.sim.core.held(k, i).is_some() {
                        " stopping"
                    } else {
                        ""
                    }
                );
                self.sim.say(line);
            }
            "forecast" => {
                let config = exact_forecast();
                let due = self.sim.core.forecast_due(&self.sim.engine, self.sim.now);
                let request = self.sim.core.forecast_request(&self.sim.engine, config);
                let answer = request.run();
                self.sim.say(format!(
                    "  forecast (due {due}): {:?} after {} steps",
                    answer.stopped, answer.steps
                ));
                self.step(Input::Forecast(Box::new(answer)));
                let core = &self.sim.core;
                let mut lines = Vec::new();
                let at = |ms: Option<u64>| {
                    ms.map_or("-".to_string(), |ms| format!("+{}", ms - START_MS))
                };
                for (k, job) in core.jobs_by_id("") {
                    if let Some(f) = core.job_forecast(k) {
                        lines.push(format!(
                            "  job {} starts {} (earliest {}) position {}",
                            job.id,
                            at(f.start_ms),
                            at(f.earliest_ms),
                            f.position
                        ));
                    }
                    for i in 0..job.tasks.len() as u32 {
                        if let Some(f) = core.forecast_of(&self.sim.engine, k, i) {
                            lines.push(format!(
                                "  {}/{i} starts {} (earliest {}) on {} position {}",
                                job.id,
                                at(f.start_ms),
                                at(f.earliest_ms),
                                f.host.as_deref().unwrap_or("-"),
                                f.position
                            ));
                        }
                    }
                }
                for l in lines {
                    self.sim.say(l);
                }
            }
            "estimate" => {
                let (job, i) = words[1].split_once('/').expect("J/I");
                let k = self.sim.core.job_key(job).expect("job");
                let line = match self
                    .sim
                    .core
                    .runtime_estimate(k, i.parse().expect("instance"))
                {
                    Some(e) => format!(
                        "  estimate {}: {}ms {}",
                        words[1],
                        e.ms,
                        e.source.describe()
                    ),
                    None => format!("  estimate {}: none", words[1]),
                };
                self.sim.say(line);
            }
            "crash" => self.sim.crash(),
            "retention" => {
                assert_eq!(self.sim.core.n_jobs(), 0, "retention comes first");
                self.sim = Sim::with_config(CoreConfig {
                    retention_ms: num("ms", 1000),
                    max_finished_jobs: num("max", 10) as usize,
                    ..crate::sim::config()
                });
                self.sim.say(format!("> {line}"));
            }
            "cron" => {
                let k = self.sim.core.job_key(words[1]).expect("job");
                let job = self.sim.core.job(k).expect("job");
                let state = job.cron.as_ref().expect("a cron job");
                let rel = |ms: u64| ms as i64 - START_MS as i64;
                let next = self
                    .sim
                    .core
                    .cron_next_tick(k)
                    .map_or("none".to_string(), |t| format!("{}", rel(t)));
                let ticks: Vec<String> = state
                    .ticks
                    .iter()
                    .map(|t| {
                        let st = self
                            .sim
                            .core
                            .job_key(&t.job)
                            .ok()
                            .and_then(|x| self.sim.core.job(x))
                            .map_or("gone", |j| j.state.name());
                        format!("{}@{} {st}", t.job, rel(t.at))
                    })
                    .collect();
                let row = self.sim.core.job_row(k).expect("row").cron;
                assert_eq!(row.as_ref(), Some(state), "the row holds the cron state");
                let line = format!(
                    "  cron {} {}{}: last {} next {} ticks [{}]{}",
                    words[1],
                    job.state.name(),
                    if state.suspended { " suspended" } else { "" },
                    rel(state.last_tick),
                    next,
                    ticks.join(", "),
                    if state.last_skip.is_empty() {
                        String::new()
                    } else {
                        format!("\n    skip: {}", state.last_skip)
                    }
                );
                self.sim.say(line);
            }
            "waits" => {
                let k = self.sim.core.job_key(words[1]).expect("job");
                let deps: Vec<String> = self
                    .sim
                    .core
                    .waiting_for(k)
                    .iter()
                    .map(|d| format!("{}:{}", d.condition.name(), d.job))
                    .collect();
                let job = self.sim.core.job(k).expect("job");
                let line = format!(
                    "  {} {} waits for [{}]",
                    words[1],
                    job.state.name(),
                    deps.join(" ")
                );
                self.sim.say(line);
            }
            "jobs" => {
                let live: Vec<String> = self
                    .sim
                    .core
                    .jobs_by_id("")
                    .map(|(_, j)| format!("{}={}", j.id, j.state.name()))
                    .collect();
                let store = &self.sim.store;
                let stored: Vec<String> = store
                    .jobs
                    .keys()
                    .map(|id| {
                        let tasks = store.tasks.keys().filter(|(j, _)| j == id).count();
                        let configs = store.configs.keys().filter(|(j, _)| j == id).count();
                        format!("{id}(tasks={tasks} configs={configs})")
                    })
                    .collect();
                let orphan_rows = store
                    .tasks
                    .keys()
                    .map(|(j, _)| j)
                    .chain(store.configs.keys().map(|(j, _)| j))
                    .filter(|j| !store.jobs.contains_key(*j))
                    .count();
                let line = format!(
                    "jobs: {} | stored: {} | rows of removed jobs: {orphan_rows} | finished {}",
                    live.join(" "),
                    stored.join(" "),
                    self.sim.core.n_finished_jobs()
                );
                self.sim.say(line);
            }
            other => panic!("unknown fixture command {other:?}"),
        }
    }
}

fn check(script: &str, expected: Expect) {
    let mut env = Env::new();
    for line in script.lines() {
        env.run_line(line);
    }
    expected.assert_eq(&env.sim.log);
}

#[test]
fn a_batch_job_runs_and_succeeds() {
    check(
        r"
        host h1 cpu=4
        job j pool=/ n=2 cpu=1
        cycle
        exit j/0 0
        exit j/1 0
        ",
        expect![[r#"
            > host h1 cpu=4
            > job j pool=/ n=2 cpu=1
            j/0#1 pending
            j/1#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/1#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
            j/1#1 placed @h1
            j/1#1 launching @h1
              launch j/0#1 @h1 config 1
              launch j/1#1 @h1 config 1
            j/0#1 running @h1
            j/1#1 running @h1
            job j running
            > exit j/0 0
            j/0#1 succeeded @h1
            > exit j/1 0
            j/1#1 succeeded @h1
            job j succeeded
        "#]],
    );
}

#[test]
fn a_failed_run_backs_off_and_retries_until_its_policy_gives_up() {
    check(
        r"
        host h1
        job j pool=/ n=1 max_failures=1 backoff=500
        cycle
        exit j/0 3
        tick 499      # not yet
        tick 1
        cycle
        exit j/0 4
        ",
        expect![[r#"
            > host h1
            > job j pool=/ n=1 max_failures=1 backoff=500
            j/0#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
              launch j/0#1 @h1 config 1
            j/0#1 running @h1
            job j running
            > exit j/0 3
            j/0#1 failed @h1 (exited with code 3)
            j/0#1 backoff @h1 (exited with code 3)
            job j pending
            > tick 499
            > tick 1
            j/0#2 initialized
            j/0#2 pending
            > cycle
            j/0#2 ready
            j/0#2 placed @h1
            j/0#2 launching @h1
              launch j/0#2 @h1 config 1
            j/0#2 running @h1
            job j running
            > exit j/0 4
            j/0#2 failed @h1 (exited with code 4)
            job j failed
        "#]],
    );
}

#[test]
fn a_service_runs_again_after_any_exit_until_it_is_killed() {
    check(
        r"
        host h1
        job s pool=/ n=1 service backoff=100
        cycle
        exit s/0 0     # a service that ends is started again
        tick 100
        cycle
        kill s
        confirm
        ",
        expect![[r#"
            > host h1
            > job s pool=/ n=1 service backoff=100
            s/0#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
              launch s/0#1 @h1 config 1
            s/0#1 running @h1
            job s running
            > exit s/0 0
            s/0#1 succeeded @h1 (service exited with code 0)
            s/0#1 backoff @h1 (service exited with code 0)
            > tick 100
            s/0#2 initialized
            s/0#2 pending
            > cycle
            s/0#2 ready
            s/0#2 placed @h1
            s/0#2 launching @h1
              launch s/0#2 @h1 config 1
            s/0#2 running @h1
            > kill s
            s/0#2 killed @h1 (job killed)
            job s killing
              kill s/0#2 @h1
            > confirm
            job s killed
        "#]],
    );
}

/// A deregistration delay: a run told to stop is shown stopping at once
/// (an event before its end in the books), its host is told to signal it
/// only after the delay, and the run ended when its host says it did, not
/// when it was told to stop. A restart starts the next run after that.
#[test]
fn a_shutdown_delay_shows_the_run_stopping_first_and_it_ends_when_its_host_says() {
    check(
        r"
        host h1
        job s pool=/ n=2 service shutdown_delay=5000
        cycle
        tick 1000
        kill s/0       # stopping now; the host signals it 5 s later
        task s/0
        tick 5000      # the delay
        tick 200       # SIGTERM to its exit
        confirm
        task s/0       # ended 6.2 s in, not 1 s in
        restart s/1
        tick 5200
        confirm        # the next run starts once the old one is gone
        cycle
        ",
        expect![[r#"
            > host h1
            > job s pool=/ n=2 service shutdown_delay=5000
            s/0#1 pending
            s/1#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
              launch s/0#1 @h1 config 1
              launch s/1#1 @h1 config 1
            s/0#1 running @h1
            s/1#1 running @h1
            job s running
            > tick 1000
            > kill s/0
            s/0#1 running @h1 (stopping: deregistration delay 5000 ms)
            s/0#1 killed @h1 (killed by request)
              kill s/0#1 @h1 after 5000 ms
            > task s/0
              s/0#1 killed started 0 finished 1000 stopping
            > tick 5000
            > tick 200
            > confirm
            > task s/0
              s/0#1 killed started 0 finished 6200
            > restart s/1
            s/1#1 running @h1 (stopping: deregistration delay 5000 ms)
            s/1#1 killed @h1 (restarted)
              kill s/1#1 @h1 after 5000 ms
            > tick 5200
            > confirm
            s/1#2 initialized
            s/1#2 pending
            > cycle
            s/1#2 ready
            s/1#2 placed @h1
            s/1#2 launching @h1
              launch s/1#2 @h1 config 1
            s/1#2 running @h1
        "#]],
    );
}

#[test]
fn an_unhealthy_task_is_stopped_and_restarted_once_its_host_confirms() {
    check(
        r"
        host h1
        job s pool=/ n=1 service health backoff=100
        cycle
        healthy s/0
        unhealthy s/0
        tick 100       # backed off, but the old run still holds its host
        cycle
        confirm
        cycle
        ",
        expect![[r#"
            > host h1
            > job s pool=/ n=1 service health backoff=100
            s/0#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
              launch s/0#1 @h1 config 1
            s/0#1 running @h1
            job s running
            > healthy s/0
            s/0#1 running @h1 [Healthy]
            > unhealthy s/0
            s/0#1 running @h1 [Unhealthy] (unhealthy: check failed)
            s/0#1 failed @h1 (unhealthy: check failed)
            s/0#1 backoff @h1 (unhealthy: check failed)
              kill s/0#1 @h1
            > tick 100
            > cycle
            > confirm
            s/0#2 initialized
            s/0#2 pending
            > cycle
            s/0#2 ready
            s/0#2 placed @h1
            s/0#2 launching @h1
              launch s/0#2 @h1 config 1
            s/0#2 running @h1
        "#]],
    );
}

/// Gang members' named ports are chosen by the server at placement, from
/// their host's registered ranges (31000-31099 here) from the top down,
/// never one another run on the host holds; each member's launch carries
/// them and the whole gang (rank, generation, every member's host and
/// ports). A restarted gang gets a new generation and a new, consistent
/// set; the ports are stored with the runs, so after a server restart new
/// gangs on those hosts still avoid them.
#[test]
fn gang_members_get_ports_chosen_at_placement_and_a_rendezvous() {
    check(
        r"
        host h1 cpu=4
        host h2 cpu=4
        job g pool=/ n=3 gang=3 cpu=2 ports=master,data rendezvous=pytorch max_failures=2 backoff=100
        job k pool=/ n=2 gang=2 cpu=1 ports=master
        cycle
        exit g/1 1     # the gang stops as one and starts again
        confirm
        tick 100
        cycle
        crash
        register h1
        register h2
        exit k/0 0
        exit k/1 0
        job m pool=/ n=2 gang=2 cpu=1 ports=master
        cycle
        ",
        expect![[r#"
            > host h1 cpu=4
            > host h2 cpu=4
            > job g pool=/ n=3 gang=3 cpu=2 ports=master,data rendezvous=pytorch max_failures=2 backoff=100
            g/0#1 pending
            g/1#1 pending
            g/2#1 pending
            job g pending
            > job k pool=/ n=2 gang=2 cpu=1 ports=master
            k/0#1 pending
            k/1#1 pending
            job k pending
            > cycle
            g/0#1 ready
            g/1#1 ready
            g/2#1 ready
            k/0#1 ready
            k/1#1 ready
            g/0#1 placed @h1
            g/0#1 launching @h1
            g/1#1 placed @h1
            g/1#1 launching @h1
            g/2#1 placed @h2
            g/2#1 launching @h2
            k/0#1 placed @h2
            k/0#1 launching @h2
            k/1#1 placed @h2
            k/1#1 launching @h2
              launch g/0#1 @h1 config 1 ports data=31098,master=31099 rank 0/3 gen 1 [0@h1 data=31098,master=31099, 1@h1 data=31096,master=31097, 2@h2 data=31098,master=31099]
              launch g/1#1 @h1 config 1 ports data=31096,master=31097 rank 1/3 gen 1
              launch g/2#1 @h2 config 1 ports data=31098,master=31099 rank 2/3 gen 1
              launch k/0#1 @h2 config 1 ports master=31097 rank 0/2 gen 1 [0@h2 master=31097, 1@h2 master=31096]
              launch k/1#1 @h2 config 1 ports master=31096 rank 1/2 gen 1
            g/0#1 running @h1
            g/1#1 running @h1
            job g running
            g/2#1 running @h2
            k/0#1 running @h2
            k/1#1 running @h2
            job k running
            > exit g/1 1
            g/1#1 failed @h1 (exited with code 1)
            g/1#1 backoff @h1 (exited with code 1)
            g/0#1 killed @h1 (gang member 1 ended: the gang starts again as one)
            g/2#1 killed @h2 (gang member 1 ended: the gang starts again as one)
            job g pending
              kill g/0#1 @h1
              kill g/2#1 @h2
            > confirm
            g/0#2 initialized
            g/2#2 initialized
            > tick 100
            g/1#2 initialized
            g/0#2 pending
            g/1#2 pending
            g/2#2 pending
            > cycle
            g/0#2 ready
            g/1#2 ready
            g/2#2 ready
            g/0#2 placed @h1
            g/0#2 launching @h1
            g/1#2 placed @h1
            g/1#2 launching @h1
            g/2#2 placed @h2
            g/2#2 launching @h2
              launch g/0#2 @h1 config 1 ports data=31098,master=31099 rank 0/3 gen 2 [0@h1 data=31098,master=31099, 1@h1 data=31096,master=31097, 2@h2 data=31098,master=31099]
              launch g/1#2 @h1 config 1 ports data=31096,master=31097 rank 1/3 gen 2
              launch g/2#2 @h2 config 1 ports data=31098,master=31099 rank 2/3 gen 2
            g/0#2 running @h1
            g/1#2 running @h1
            job g running
            g/2#2 running @h2
            > crash
            > register h1
            > register h2
            > exit k/0 0
            k/0#1 succeeded @h2
            > exit k/1 0
            k/1#1 succeeded @h2
            job k succeeded
            > job m pool=/ n=2 gang=2 cpu=1 ports=master
            m/0#1 pending
            m/1#1 pending
            job m pending
            > cycle
            m/0#1 ready
            m/1#1 ready
            m/0#1 placed @h2
            m/0#1 launching @h2
            m/1#1 placed @h2
            m/1#1 launching @h2
              launch m/0#1 @h2 config 1 ports master=31097 rank 0/2 gen 1 [0@h2 master=31097, 1@h2 master=31096]
              launch m/1#1 @h2 config 1 ports master=31096 rank 1/2 gen 1
            m/0#1 running @h2
            m/1#1 running @h2
            job m running
        "#]],
    );
}

/// A run told to stop holds its ports until its host confirms the end:
/// a gang placed on that host meanwhile gets others.
#[test]
fn a_stopping_runs_ports_are_not_given_to_a_new_gang() {
    check(
        r"
        host h1 cpu=8
        job a pool=/ n=2 gang=2 cpu=1 ports=p
        cycle
        kill a
        job b pool=/ n=2 gang=2 cpu=1 ports=p
        cycle
        ",
        expect![[r#"
            > host h1 cpu=8
            > job a pool=/ n=2 gang=2 cpu=1 ports=p
            a/0#1 pending
            a/1#1 pending
            job a pending
            > cycle
            a/0#1 ready
            a/1#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
            a/1#1 placed @h1
            a/1#1 launching @h1
              launch a/0#1 @h1 config 1 ports p=31099 rank 0/2 gen 1 [0@h1 p=31099, 1@h1 p=31098]
              launch a/1#1 @h1 config 1 ports p=31098 rank 1/2 gen 1
            a/0#1 running @h1
            a/1#1 running @h1
            job a running
            > kill a
            a/0#1 killed @h1 (job killed)
            a/1#1 killed @h1 (job killed)
            job a killing
              kill a/0#1 @h1
              kill a/1#1 @h1
            > job b pool=/ n=2 gang=2 cpu=1 ports=p
            b/0#1 pending
            b/1#1 pending
            job b pending
            > cycle
            b/0#1 ready
            b/1#1 ready
            b/0#1 placed @h1
            b/0#1 launching @h1
            b/1#1 placed @h1
            b/1#1 launching @h1
              launch b/0#1 @h1 config 1 ports p=31097 rank 0/2 gen 1 [0@h1 p=31097, 1@h1 p=31096]
              launch b/1#1 @h1 config 1 ports p=31096 rank 1/2 gen 1
            b/0#1 running @h1
            b/1#1 running @h1
            job b running
        "#]],
    );
}

/// An elastic gang (2 to 4 members) starts with 2 when only 2 hosts are
/// free, grows to 4 as the others free (the joining members get the new
/// membership with their launch, the running ones an update), goes on
/// with 3 when one member is preempted (only that one is stopped; the
/// others are told), and grows back once the room is free again. Every
/// change is a new generation.
#[test]
fn an_elastic_gang_starts_small_grows_and_shrinks_without_restarting() {
    check(
        r"
        pool /a cpu=2 mem=1024
        pool /b cpu=2 mem=1024
        host h1 cpu=1
        host h2 cpu=1
        host h3 cpu=1
        host h4 cpu=1
        job b pool=/a n=2 cpu=1 preemptible priority=3
        cycle
        job e pool=/a n=4 gang=4 elastic=2 cpu=1 ports=master preemptible
        cycle          # 2 fit: it starts with 2
        cycle          # nothing more
        exit b/0 0
        exit b/1 0
        cycle          # both free hosts (/b's idle share): it grows to 4
        job p pool=/b n=1 cpu=1
        cycle          # /b takes a core back: one member preempted, 3 go on
        confirm
        cycle
        exit p/0 0
        cycle          # back to 4
        ",
        expect![[r#"
            > pool /a cpu=2 mem=1024
            > pool /b cpu=2 mem=1024
            > host h1 cpu=1
            > host h2 cpu=1
            > host h3 cpu=1
            > host h4 cpu=1
            > job b pool=/a n=2 cpu=1 preemptible priority=3
            b/0#1 pending
            b/1#1 pending
            job b pending
            > cycle
            b/0#1 ready
            b/1#1 ready
            b/0#1 placed @h1
            b/0#1 launching @h1
            b/1#1 placed @h2
            b/1#1 launching @h2
              launch b/0#1 @h1 config 1
              launch b/1#1 @h2 config 1
            b/0#1 running @h1
            job b running
            b/1#1 running @h2
            > job e pool=/a n=4 gang=4 elastic=2 cpu=1 ports=master preemptible
            e/0#1 pending
            e/1#1 pending
            job e pending
            > cycle
            e/0#1 ready
            e/1#1 ready
            e/0#1 placed @h3
            e/0#1 launching @h3
            e/1#1 placed @h4
            e/1#1 launching @h4
            e/2#1 pending
            e/3#1 pending
              launch e/0#1 @h3 config 1 ports master=31099 rank 0/2 gen 21 [0@h3 master=31099, 1@h4 master=31099]
              launch e/1#1 @h4 config 1 ports master=31099 rank 1/2 gen 21
            e/0#1 running @h3
            job e running
            e/1#1 running @h4
            > cycle
            > exit b/0 0
            b/0#1 succeeded @h1
            > exit b/1 0
            b/1#1 succeeded @h2
            job b succeeded
            > cycle
            e/2#1 ready
            e/3#1 ready
            e/2#1 placed @h1
            e/2#1 launching @h1
            e/3#1 placed @h2
            e/3#1 launching @h2
              launch e/2#1 @h1 config 1 ports master=31099 rank 2/4 gen 35
              launch e/3#1 @h2 config 1 ports master=31099 rank 3/4 gen 35
              rendezvous e/0#1 @h3 rank 0/4 gen 35 [0@h3, 1@h4, 2@h1, 3@h2]
              rendezvous e/1#1 @h4 rank 1/4 gen 35 [0@h3, 1@h4, 2@h1, 3@h2]
            e/2#1 running @h1
            e/3#1 running @h2
            > job p pool=/b n=1 cpu=1
            p/0#1 pending
            job p pending
            > cycle
            p/0#1 ready
            p/0#1 placing
            e/3#1 preempted @h2 (preempted: pool over its entitlement in cpu: 4000 held, 3000 entitled; lost work: 0 ms since its start)
              rendezvous e/0#1 @h3 rank 0/3 gen 42 [0@h3, 1@h4, 2@h1]
              rendezvous e/1#1 @h4 rank 1/3 gen 42 [0@h3, 1@h4, 2@h1]
              rendezvous e/2#1 @h1 rank 2/3 gen 42 [0@h3, 1@h4, 2@h1]
              kill e/3#1 @h2
            > confirm
            e/3#2 initialized
            e/3#2 pending
            > cycle
            p/0#1 placed @h2
            p/0#1 launching @h2
              launch p/0#1 @h2 config 1
            p/0#1 running @h2
            job p running
            > exit p/0 0
            p/0#1 succeeded @h2
            job p succeeded
            > cycle
            e/3#2 ready
            e/3#2 placed @h2
            e/3#2 launching @h2
              launch e/3#2 @h2 config 1 ports master=31099 rank 3/4 gen 53
              rendezvous e/0#1 @h3 rank 0/4 gen 53 [0@h3, 1@h4, 2@h1, 3@h2]
              rendezvous e/1#1 @h4 rank 1/4 gen 53 [0@h3, 1@h4, 2@h1, 3@h2]
              rendezvous e/2#1 @h1 rank 2/4 gen 53 [0@h3, 1@h4, 2@h1, 3@h2]
            e/3#2 running @h2
        "#]],
    );
}

/// A job's name is held while the job has not ended: another job of its
/// pool cannot take it, and an ended job that holds it no more cannot come
/// back while another does. Pools have their own names; no name holds
/// nothing.
#[test]
fn a_pools_unfinished_jobs_have_distinct_names() {
    check(
        r"
        pool /a cpu=4 mem=1024
        pool /b cpu=4 mem=1024
        host h1 cpu=8
        job x pool=/a name=etl cpu=1
        job y pool=/a name=etl cpu=1   # refused: x holds the name
        job z pool=/b name=etl cpu=1   # another pool: its own names
        job u pool=/a name= cpu=1      # no name: nothing to hold
        job v pool=/a name= cpu=1
        kill x
        job y pool=/a name=etl cpu=1   # x ended: the name is free
        restart x                      # refused while y holds it
        kill y
        restart x
        ",
        expect![[r#"
            > pool /a cpu=4 mem=1024
            > pool /b cpu=4 mem=1024
            > host h1 cpu=8
            > job x pool=/a name=etl cpu=1
            x/0#1 pending
            job x pending
            > job y pool=/a name=etl cpu=1
            error: spec.name: job x in pool /a is named "etl" and is pending: a pool's unfinished jobs have distinct names (wait for it, kill it, or choose another name)
            > job z pool=/b name=etl cpu=1
            z/0#1 pending
            job z pending
            > job u pool=/a name= cpu=1
            u/0#1 pending
            job u pending
            > job v pool=/a name= cpu=1
            v/0#1 pending
            job v pending
            > kill x
            x/0#1 killed (job killed)
            job x killed
            > job y pool=/a name=etl cpu=1
            y/0#1 pending
            job y pending
            > restart x
            error: job x is named "etl" as job y of pool /a is, which is pending: a pool's unfinished jobs have distinct names, so this one starts again once that one has ended
            > kill y
            y/0#1 killed (job killed)
            job y killed
            > restart x
            x/0#2 initialized
            x/0#2 pending
            job x pending
        "#]],
    );
}

/// A job that ended by itself comes back by no path while another
/// unfinished job of its pool holds its name: not by an instance's restart,
/// nor by scaling it up (scaling it down revives nothing and goes).
#[test]
fn an_ended_job_does_not_come_back_under_a_held_name() {
    check(
        r"
        host h1 cpu=4
        job a pool=/ name=etl n=2 cpu=1
        cycle
        exit a/0 0
        exit a/1 0     # a succeeded: its name is free
        job b pool=/ name=etl cpu=1
        restart a/0
        scale a 3
        scale a 1
        ",
        expect![[r#"
            > host h1 cpu=4
            > job a pool=/ name=etl n=2 cpu=1
            a/0#1 pending
            a/1#1 pending
            job a pending
            > cycle
            a/0#1 ready
            a/1#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
            a/1#1 placed @h1
            a/1#1 launching @h1
              launch a/0#1 @h1 config 1
              launch a/1#1 @h1 config 1
            a/0#1 running @h1
            a/1#1 running @h1
            job a running
            > exit a/0 0
            a/0#1 succeeded @h1
            > exit a/1 0
            a/1#1 succeeded @h1
            job a succeeded
            > job b pool=/ name=etl cpu=1
            b/0#1 pending
            job b pending
            > restart a/0
            error: job a is named "etl" as job b of pool / is, which is pending: a pool's unfinished jobs have distinct names, so this one starts again once that one has ended
            > scale a 3
            error: job a is named "etl" as job b of pool / is, which is pending: a pool's unfinished jobs have distinct names, so this one starts again once that one has ended
            > scale a 1
        "#]],
    );
}

/// An update keeps the job's name: a rename is refused.
#[test]
fn an_update_cannot_rename_a_job() {
    check(
        r"
        host h1 cpu=4
        job s pool=/ name=web cpu=1 service
        cycle
        update s u1 name=api
        update s u2 cpu=2
        ",
        expect![[r#"
            > host h1 cpu=4
            > job s pool=/ name=web cpu=1 service
            s/0#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
              launch s/0#1 @h1 config 1
            s/0#1 running @h1
            job s running
            > update s u1 name=api
            error: spec.name: an update cannot rename the job (it is named "web")
            > update s u2 cpu=2
            update u2 v1->v2 rolling_forward cursor=1 batch={0} failed={} done=0
            s/0#1 killed @h1 (updated to a new spec)
              kill s/0#1 @h1
        "#]],
    );
}

/// An elastic gang finishes when a member succeeds: nothing more joins,
/// the instance that never joined ends killed, the others are told, and
/// the job succeeds once its members have.
#[test]
fn an_elastic_gang_finishes_when_a_member_succeeds() {
    check(
        r"
        host h1 cpu=2
        job e pool=/ n=3 gang=3 elastic=2 cpu=1
        cycle          # 2 start; the third waits for room
        exit e/0 0     # done: the third never joins
        exit e/1 0
        ",
        expect![[r#"
            > host h1 cpu=2
            > job e pool=/ n=3 gang=3 elastic=2 cpu=1
            e/0#1 pending
            e/1#1 pending
            job e pending
            > cycle
            e/0#1 ready
            e/1#1 ready
            e/0#1 placed @h1
            e/0#1 launching @h1
            e/1#1 placed @h1
            e/1#1 launching @h1
            e/2#1 pending
              launch e/0#1 @h1 config 1 rank 0/2 gen 9 [0@h1, 1@h1]
              launch e/1#1 @h1 config 1 rank 1/2 gen 9
            e/0#1 running @h1
            e/1#1 running @h1
            job e running
            > exit e/0 0
            e/0#1 succeeded @h1
            e/2#1 killed (the elastic gang finished (member 0 succeeded) before it joined)
              rendezvous e/1#1 @h1 rank 0/1 gen 15 [1@h1]
            > exit e/1 0
            e/1#1 succeeded @h1
            job e succeeded
        "#]],
    );
}

/// An elastic gang whose members fall below its minimum starts again as
/// one, like a fixed gang; a member failing above it leaves and comes
/// back after its back-off.
#[test]
fn an_elastic_gang_below_its_minimum_starts_again_as_one() {
    check(
        r"
        host h1 cpu=3
        job e pool=/ n=3 gang=3 elastic=2 cpu=1 max_failures=3 backoff=100
        cycle          # all 3 fit: 2 start, the third joins next cycle
        cycle
        exit e/2 1     # 2 left: they go on
        tick 100
        cycle          # it joins again
        exit e/0 1     # 2 left
        exit e/1 1     # 1 left: below the minimum, the gang starts again
        confirm
        tick 100
        cycle
        cycle
        ",
        expect![[r#"
            > host h1 cpu=3
            > job e pool=/ n=3 gang=3 elastic=2 cpu=1 max_failures=3 backoff=100
            e/0#1 pending
            e/1#1 pending
            job e pending
            > cycle
            e/0#1 ready
            e/1#1 ready
            e/0#1 placed @h1
            e/0#1 launching @h1
            e/1#1 placed @h1
            e/1#1 launching @h1
            e/2#1 pending
              launch e/0#1 @h1 config 1 rank 0/2 gen 9 [0@h1, 1@h1]
              launch e/1#1 @h1 config 1 rank 1/2 gen 9
            e/0#1 running @h1
            e/1#1 running @h1
            job e running
            > cycle
            e/2#1 ready
            e/2#1 placed @h1
            e/2#1 launching @h1
              launch e/2#1 @h1 config 1 rank 2/3 gen 16
              rendezvous e/0#1 @h1 rank 0/3 gen 16 [0@h1, 1@h1, 2@h1]
              rendezvous e/1#1 @h1 rank 1/3 gen 16 [0@h1, 1@h1, 2@h1]
            e/2#1 running @h1
            > exit e/2 1
            e/2#1 failed @h1 (exited with code 1)
            e/2#1 backoff @h1 (exited with code 1)
              rendezvous e/0#1 @h1 rank 0/2 gen 19 [0@h1, 1@h1]
              rendezvous e/1#1 @h1 rank 1/2 gen 19 [0@h1, 1@h1]
            > tick 100
            e/2#2 initialized
            e/2#2 pending
            > cycle
            e/2#2 ready
            e/2#2 placed @h1
            e/2#2 launching @h1
              launch e/2#2 @h1 config 1 rank 2/3 gen 24
              rendezvous e/0#1 @h1 rank 0/3 gen 24 [0@h1, 1@h1, 2@h1]
              rendezvous e/1#1 @h1 rank 1/3 gen 24 [0@h1, 1@h1, 2@h1]
            e/2#2 running @h1
            > exit e/0 1
            e/0#1 failed @h1 (exited with code 1)
            e/0#1 backoff @h1 (exited with code 1)
              rendezvous e/1#1 @h1 rank 0/2 gen 27 [1@h1, 2@h1]
              rendezvous e/2#2 @h1 rank 1/2 gen 27 [1@h1, 2@h1]
            > exit e/1 1
            e/1#1 failed @h1 (exited with code 1)
            e/1#1 backoff @h1 (exited with code 1)
            e/2#2 killed @h1 (gang member 1 ended: the gang starts again as one)
            job e pending
              kill e/2#2 @h1
            > confirm
            e/2#3 initialized
            > tick 100
            e/0#2 initialized
            e/1#2 initialized
            e/0#2 pending
            e/1#2 pending
            > cycle
            e/0#2 ready
            e/1#2 ready
            e/0#2 placed @h1
            e/0#2 launching @h1
            e/1#2 placed @h1
            e/1#2 launching @h1
            e/2#3 pending
              launch e/0#2 @h1 config 1 rank 0/2 gen 42 [0@h1, 1@h1]
              launch e/1#2 @h1 config 1 rank 1/2 gen 42
            e/0#2 running @h1
            e/1#2 running @h1
            job e running
            > cycle
            e/2#3 ready
            e/2#3 placed @h1
            e/2#3 launching @h1
              launch e/2#3 @h1 config 1 rank 2/3 gen 49
              rendezvous e/0#2 @h1 rank 0/3 gen 49 [0@h1, 1@h1, 2@h1]
              rendezvous e/1#2 @h1 rank 1/3 gen 49 [0@h1, 1@h1, 2@h1]
            e/2#3 running @h1
        "#]],
    );
}

#[test]
fn a_gang_restarts_as_one_when_a_member_fails() {
    check(
        r"
        host h1 cpu=8
        job g pool=/ n=3 gang=3 max_failures=2 backoff=100
        cycle
        exit g/1 1     # the other two are stopped
        confirm
        cycle          # nothing: the gang waits for its failed member
        tick 100
        cycle          # queued and placed as one
        ",
        expect![[r#"
            > host h1 cpu=8
            > job g pool=/ n=3 gang=3 max_failures=2 backoff=100
            g/0#1 pending
            g/1#1 pending
            g/2#1 pending
            job g pending
            > cycle
            g/0#1 ready
            g/1#1 ready
            g/2#1 ready
            g/0#1 placed @h1
            g/0#1 launching @h1
            g/1#1 placed @h1
            g/1#1 launching @h1
            g/2#1 placed @h1
            g/2#1 launching @h1
              launch g/0#1 @h1 config 1 rank 0/3 gen 1 [0@h1, 1@h1, 2@h1]
              launch g/1#1 @h1 config 1 rank 1/3 gen 1
              launch g/2#1 @h1 config 1 rank 2/3 gen 1
            g/0#1 running @h1
            g/1#1 running @h1
            g/2#1 running @h1
            job g running
            > exit g/1 1
            g/1#1 failed @h1 (exited with code 1)
            g/1#1 backoff @h1 (exited with code 1)
            g/0#1 killed @h1 (gang member 1 ended: the gang starts again as one)
            g/2#1 killed @h1 (gang member 1 ended: the gang starts again as one)
            job g pending
              kill g/0#1 @h1
              kill g/2#1 @h1
            > confirm
            g/0#2 initialized
            g/2#2 initialized
            > cycle
            > tick 100
            g/1#2 initialized
            g/0#2 pending
            g/1#2 pending
            g/2#2 pending
            > cycle
            g/0#2 ready
            g/1#2 ready
            g/2#2 ready
            g/0#2 placed @h1
            g/0#2 launching @h1
            g/1#2 placed @h1
            g/1#2 launching @h1
            g/2#2 placed @h1
            g/2#2 launching @h1
              launch g/0#2 @h1 config 1 rank 0/3 gen 2 [0@h1, 1@h1, 2@h1]
              launch g/1#2 @h1 config 1 rank 1/3 gen 2
              launch g/2#2 @h1 config 1 rank 2/3 gen 2
            g/0#2 running @h1
            g/1#2 running @h1
            g/2#2 running @h1
            job g running
        "#]],
    );
}

#[test]
fn a_higher_priority_task_evicts_lower_priority_work_of_its_pool() {
    check(
        r"
        host h1 cpu=2
        host h2 cpu=2
        job low pool=/ n=2 cpu=1 preemptible priority=1 per_host=1
        cycle
        job high pool=/ n=1 cpu=2 preemptible priority=5
        cycle          # admitted, fits no host: a low task is evicted
        cycle          # the victim still holds its host: nothing more
        confirm
        cycle
        ",
        expect![[r#"
            > host h1 cpu=2
            > host h2 cpu=2
            > job low pool=/ n=2 cpu=1 preemptible priority=1 per_host=1
            low/0#1 pending
            low/1#1 pending
            job low pending
            > cycle
            low/0#1 ready
            low/1#1 ready
            low/0#1 placed @h1
            low/0#1 launching @h1
            low/1#1 placed @h2
            low/1#1 launching @h2
              launch low/0#1 @h1 config 1
              launch low/1#1 @h2 config 1
            low/0#1 running @h1
            job low running
            low/1#1 running @h2
            > job high pool=/ n=1 cpu=2 preemptible priority=5
            high/0#1 pending
            job high pending
            > cycle
            high/0#1 ready
            high/0#1 placing
            low/0#1 preempted @h1 (preempted: a higher-priority task of its pool (high/0) needs room on host h1; lost work: 0 ms since its start)
              kill low/0#1 @h1
            > cycle
            > confirm
            low/0#2 initialized
            low/0#2 pending
            > cycle
            low/0#2 ready
            high/0#1 placed @h1
            high/0#1 launching @h1
            low/0#2 placing
              launch high/0#1 @h1 config 1
            high/0#1 running @h1
            job high running
        "#]],
    );
}

#[test]
fn an_eviction_takes_the_equal_run_that_checkpointed_last_and_shows_the_work_lost() {
    check(
        r"
        host h1 cpu=2
        host h2 cpu=2
        job low pool=/ n=2 cpu=1 preemptible priority=1 per_host=1 notice=30000
        cycle
        tick 1000
        checkpoint low/1   # without it h1's low/0 would go (the lower slot)
        tick 4000
        task low/1
        crash              # the checkpoint is stored with the run
        register h1
        register h2
        tick 10000         # the reconnect slack
        job high pool=/ n=1 cpu=2 preemptible priority=5
        cycle
        task low/1
        tick 2000
        checkpoint low/1   # saved during its notice: nothing lost
        task low/1
        confirm
        cycle
        ",
        expect![[r#"
            > host h1 cpu=2
            > host h2 cpu=2
            > job low pool=/ n=2 cpu=1 preemptible priority=1 per_host=1 notice=30000
            low/0#1 pending
            low/1#1 pending
            job low pending
            > cycle
            low/0#1 ready
            low/1#1 ready
            low/0#1 placed @h1
            low/0#1 launching @h1
            low/1#1 placed @h2
            low/1#1 launching @h2
              launch low/0#1 @h1 config 1
              launch low/1#1 @h2 config 1
            low/0#1 running @h1
            job low running
            low/1#1 running @h2
            > tick 1000
            > checkpoint low/1
            > tick 4000
            > task low/1
              low/1#1 running started 0 finished 0 checkpoint 1000 lost work 0 ms
            > crash
            > register h1
            > register h2
            > tick 10000
            > job high pool=/ n=1 cpu=2 preemptible priority=5
            high/0#1 pending
            job high pending
            > cycle
            high/0#1 ready
            high/0#1 placing
            low/1#1 preempted @h2 (preempted: a higher-priority task of its pool (high/0) needs room on host h2; lost work: 14000 ms since its last checkpoint)
              kill low/1#1 @h2 with notice 30000 ms
            > task low/1
              low/1#1 preempted started 0 finished 15000 checkpoint 1000 lost work 14000 ms stopping
            > tick 2000
            > checkpoint low/1
              kill low/1#1 @h2 with notice 30000 ms
            > task low/1
              low/1#1 preempted started 0 finished 15000 checkpoint 17000 lost work 0 ms stopping
            > confirm
            low/1#2 initialized
            low/1#2 pending
            > cycle
            low/1#2 ready
            high/0#1 placed @h2
            high/0#1 launching @h2
            low/1#2 placing
              launch high/0#1 @h2 config 1
            high/0#1 running @h2
            job high running
        "#]],
    );
}

#[test]
fn a_restarted_server_adopts_the_runs_its_agents_report() {
    check(
        r"
        host h1
        host h2
        job j pool=/ n=2 cpu=3
        cycle
        crash
        register h1    # j/0 is adopted, not launched again
        tick 20000
        register h2
        exit j/0 0
        exit j/1 0
        ",
        expect![[r#"
            > host h1
            > host h2
            > job j pool=/ n=2 cpu=3
            j/0#1 pending
            j/1#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/1#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
            j/1#1 placed @h2
            j/1#1 launching @h2
              launch j/0#1 @h1 config 1
              launch j/1#1 @h2 config 1
            j/0#1 running @h1
            job j running
            j/1#1 running @h2
            > crash
            > register h1
            > tick 20000
            > register h2
            > exit j/0 0
            j/0#1 succeeded @h1
            > exit j/1 0
            j/1#1 succeeded @h2
            job j succeeded
        "#]],
    );
}

/// Each launch carries the GPU devices the engine gave its run; a restarted
/// server adopts each run on the devices it was started with (stored with
/// its row), so new work goes to the device they left free.
#[test]
fn a_run_keeps_its_gpu_devices_across_a_restart() {
    check(
        r"
        host g cpu=8 gpus=4
        job first pool=/ gpu=1000
        cycle
        job two pool=/ n=2 gpu=1000
        job half pool=/ gpu=500
        cycle
        exit first/0 0
        crash
        register g
        job after pool=/ gpu=1000
        cycle
        ",
        expect![[r#"
            > host g cpu=8 gpus=4
            > job first pool=/ gpu=1000
            first/0#1 pending
            job first pending
            > cycle
            first/0#1 ready
            first/0#1 placed @g
            first/0#1 launching @g
              launch first/0#1 @g config 1 gpus 0
            first/0#1 running @g
            job first running
            > job two pool=/ n=2 gpu=1000
            two/0#1 pending
            two/1#1 pending
            job two pending
            > job half pool=/ gpu=500
            half/0#1 pending
            job half pending
            > cycle
            two/0#1 ready
            two/1#1 ready
            half/0#1 ready
            two/0#1 placed @g
            two/0#1 launching @g
            two/1#1 placed @g
            two/1#1 launching @g
            half/0#1 placed @g
            half/0#1 launching @g
              launch two/0#1 @g config 1 gpus 1
              launch two/1#1 @g config 1 gpus 2
              launch half/0#1 @g config 1 gpus 3 share 500
            two/0#1 running @g
            two/1#1 running @g
            half/0#1 running @g
            job two running
            job half running
            > exit first/0 0
            first/0#1 succeeded @g
            job first succeeded
            > crash
            > register g
            > job after pool=/ gpu=1000
            after/0#1 pending
            job after pending
            > cycle
            after/0#1 ready
            after/0#1 placed @g
            after/0#1 launching @g
              launch after/0#1 @g config 1 gpus 0
            after/0#1 running @g
            job after running
        "#]],
    );
}

#[test]
fn a_restart_queues_waiting_instances_again_without_events_until_they_leave_the_queue() {
    // j/1 and j/2 wait (pending, then placing) before the crash; after it
    // they are queued again silently: no event until j/1 is placed.
    check(
        r"
        host h1
        job j pool=/ n=3 cpu=3
        cycle
        crash
        register h1
        cycle
        exit j/0 0
        cycle
        ",
        expect![[r#"
            > host h1
            > job j pool=/ n=3 cpu=3
            j/0#1 pending
            j/1#1 pending
            j/2#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
              launch j/0#1 @h1 config 1
            j/0#1 running @h1
            job j running
            > crash
            > register h1
            > cycle
            > exit j/0 0
            j/0#1 succeeded @h1
            job j pending
            > cycle
            j/1#1 placed @h1
            j/1#1 launching @h1
              launch j/1#1 @h1 config 1
            j/1#1 running @h1
            job j running
        "#]],
    );
}

#[test]
fn a_drained_host_goes_down_once_its_runs_are_confirmed_gone() {
    check(
        r"
        host h1
        host h2
        job j pool=/ n=1 cpu=1
        cycle
        drain h1
        confirm
        cycle
        up h1
        ",
        expect![[r#"
            > host h1
            > host h2
            > job j pool=/ n=1 cpu=1
            j/0#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
              launch j/0#1 @h1 config 1
            j/0#1 running @h1
            job j running
            > drain h1
            j/0#1 preempted @h1 (host h1 drained for maintenance; lost work: 0 ms since its start)
            job j pending
              kill j/0#1 @h1
            > confirm
            j/0#2 initialized
            j/0#2 pending
            > cycle
            j/0#2 ready
            j/0#2 placed @h2
            j/0#2 launching @h2
              launch j/0#2 @h2 config 1
            j/0#2 running @h2
            job j running
            > up h1
        "#]],
    );
}

#[test]
fn runs_of_a_lost_host_start_again_elsewhere() {
    check(
        r"
        host h1
        job j pool=/ n=1 cpu=1
        cycle
        host h2
        lost-host h1
        cycle
        register h1    # it comes back without the run
        ",
        expect![[r#"
            > host h1
            > job j pool=/ n=1 cpu=1
            j/0#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
              launch j/0#1 @h1 config 1
            j/0#1 running @h1
            job j running
            > host h2
            > lost-host h1
            j/0#1 lost @h1 (host h1 lost: no heartbeat for 10000 ms)
            j/0#2 initialized
            j/0#2 pending
            job j pending
            > cycle
            j/0#2 ready
            j/0#2 placed @h2
            j/0#2 launching @h2
              launch j/0#2 @h2 config 1
            j/0#2 running @h2
            job j running
            > register h1
        "#]],
    );
}

#[test]
fn refused_inputs_change_nothing() {
    check(
        r"
        host h1
        job j pool=/nope n=1
        job j pool=/ n=1
        job j pool=/ n=1
        scale j 0
        kill j/7
        delete j
        kill x
        drain nowhere
        ",
        expect![[r#"
            > host h1
            > job j pool=/nope n=1
            error: spec.pool: pool /nope not found
            > job j pool=/ n=1
            j/0#1 pending
            job j pending
            > job j pool=/ n=1
            error: job j exists already
            > scale j 0
            error: instance_count: must be at least 1 (kill the job to stop it)
            > kill j/7
            error: job j has no instance 7 (it has 1)
            > delete j
            error: job j is pending; kill it before deleting it
            > kill x
            error: job x not found
            > drain nowhere
            error: host nowhere not found
        "#]],
    );
}

#[test]
fn a_rolling_update_moves_a_batch_at_a_time_and_waits_for_health() {
    check(
        r"
        host h1 cpu=8
        job s pool=/ n=3 service health
        cycle
        healthy s/0
        healthy s/1
        healthy s/2
        update s u1 batch=2 health
        confirm        # the first two stop; their new runs start
        cycle
        healthy s/0    # one done: the third may go
        confirm
        cycle
        healthy s/1
        healthy s/2    # all on the new spec and healthy
        ",
        expect![[r#"
            > host h1 cpu=8
            > job s pool=/ n=3 service health
            s/0#1 pending
            s/1#1 pending
            s/2#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/2#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
            s/2#1 placed @h1
            s/2#1 launching @h1
              launch s/0#1 @h1 config 1
              launch s/1#1 @h1 config 1
              launch s/2#1 @h1 config 1
            s/0#1 running @h1
            s/1#1 running @h1
            s/2#1 running @h1
            job s running
            > healthy s/0
            s/0#1 running @h1 [Healthy]
            > healthy s/1
            s/1#1 running @h1 [Healthy]
            > healthy s/2
            s/2#1 running @h1 [Healthy]
            > update s u1 batch=2 health
            update u1 v1->v2 rolling_forward cursor=2 batch={0, 1} failed={} done=0
            s/0#1 killed @h1 (updated to a new spec)
            s/1#1 killed @h1 (updated to a new spec)
              kill s/0#1 @h1
              kill s/1#1 @h1
            > confirm
            s/0#2 initialized
            s/1#2 initialized
            s/0#2 pending
            s/1#2 pending
            > cycle
            s/0#2 ready
            s/1#2 ready
            s/0#2 placed @h1
            s/0#2 launching @h1
            s/1#2 placed @h1
            s/1#2 launching @h1
              launch s/0#2 @h1 config 2
              launch s/1#2 @h1 config 2
            s/0#2 running @h1
            s/1#2 running @h1
            > healthy s/0
            update u1 v1->v2 rolling_forward cursor=3 batch={1, 2} failed={} done=1
            s/0#2 running @h1 [Healthy]
            s/2#1 killed @h1 (updated to a new spec)
              kill s/2#1 @h1
            > confirm
            s/2#2 initialized
            s/2#2 pending
            > cycle
            s/2#2 ready
            s/2#2 placed @h1
            s/2#2 launching @h1
              launch s/2#2 @h1 config 2
            s/2#2 running @h1
            > healthy s/1
            update u1 v1->v2 rolling_forward cursor=3 batch={2} failed={} done=2
            s/1#2 running @h1 [Healthy]
            > healthy s/2
            update u1 v1->v2 succeeded cursor=3 batch={} failed={} done=3
            s/2#2 running @h1 [Healthy]
        "#]],
    );
}

#[test]
fn an_update_whose_instances_fail_rolls_back_by_itself() {
    check(
        r"
        host h1 cpu=8
        job s pool=/ n=2 service health backoff=100
        cycle
        healthy s/0
        healthy s/1
        update s u1 batch=1 retries=1 rollback
        confirm
        cycle
        unhealthy s/0  # first failure on the new spec: one retry left
        confirm
        tick 100
        cycle
        unhealthy s/0  # failed: the update rolls back
        confirm
        tick 100
        cycle
        healthy s/0    # back on the old spec and healthy
        ",
        expect![[r#"
            > host h1 cpu=8
            > job s pool=/ n=2 service health backoff=100
            s/0#1 pending
            s/1#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
              launch s/0#1 @h1 config 1
              launch s/1#1 @h1 config 1
            s/0#1 running @h1
            s/1#1 running @h1
            job s running
            > healthy s/0
            s/0#1 running @h1 [Healthy]
            > healthy s/1
            s/1#1 running @h1 [Healthy]
            > update s u1 batch=1 retries=1 rollback
            update u1 v1->v2 rolling_forward cursor=1 batch={0} failed={} done=0
            s/0#1 killed @h1 (updated to a new spec)
              kill s/0#1 @h1
            > confirm
            s/0#2 initialized
            s/0#2 pending
            > cycle
            s/0#2 ready
            s/0#2 placed @h1
            s/0#2 launching @h1
              launch s/0#2 @h1 config 2
            s/0#2 running @h1
            > unhealthy s/0
            s/0#2 running @h1 [Unhealthy] (unhealthy: check failed)
            s/0#2 failed @h1 (unhealthy: check failed)
            s/0#2 backoff @h1 (unhealthy: check failed)
              kill s/0#2 @h1
            > confirm
            > tick 100
            s/0#3 initialized
            s/0#3 pending
            > cycle
            s/0#3 ready
            s/0#3 placed @h1
            s/0#3 launching @h1
              launch s/0#3 @h1 config 2
            s/0#3 running @h1
            > unhealthy s/0
            update u1 v1->v2 rolling_backward cursor=1 batch={0} failed={0} done=1 (1 instance(s) failed on the new spec (more than max_failed_instances 0))
            s/0#3 running @h1 [Unhealthy] (unhealthy: check failed)
            s/0#3 failed @h1 (unhealthy: check failed)
            s/0#3 backoff @h1 (unhealthy: check failed)
              kill s/0#3 @h1
            > confirm
            s/0#4 initialized
            s/0#4 pending
            > tick 100
            > cycle
            s/0#4 ready
            s/0#4 placed @h1
            s/0#4 launching @h1
              launch s/0#4 @h1 config 1
            s/0#4 running @h1
            > healthy s/0
            update u1 v1->v2 rolled_back cursor=2 batch={} failed={0} done=2 (1 instance(s) failed on the new spec (more than max_failed_instances 0))
            s/0#4 running @h1 [Healthy]
        "#]],
    );
}

#[test]
fn an_update_pauses_resumes_aborts_and_survives_a_crash() {
    check(
        r"
        host h1 cpu=8
        job s pool=/ n=3 service
        cycle
        update s u1 batch=1 paused
        resume u1
        pause u1
        confirm
        cycle          # s/0 runs the new spec; nothing else moves
        crash
        register h1
        resume u1
        confirm
        cycle
        abort u1       # s/2 was moving already: it comes back on the new spec
        update s u2 n=2 batch=2
        confirm
        cycle
        rollback u2
        confirm
        cycle
        ",
        expect![[r#"
            > host h1 cpu=8
            > job s pool=/ n=3 service
            s/0#1 pending
            s/1#1 pending
            s/2#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/2#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
            s/2#1 placed @h1
            s/2#1 launching @h1
              launch s/0#1 @h1 config 1
              launch s/1#1 @h1 config 1
              launch s/2#1 @h1 config 1
            s/0#1 running @h1
            s/1#1 running @h1
            s/2#1 running @h1
            job s running
            > update s u1 batch=1 paused
            update u1 v1->v2 paused cursor=0 batch={} failed={} done=0
            > resume u1
            update u1 v1->v2 rolling_forward cursor=1 batch={0} failed={} done=0
            s/0#1 killed @h1 (updated to a new spec)
              kill s/0#1 @h1
            > pause u1
            update u1 v1->v2 paused cursor=1 batch={0} failed={} done=0
            > confirm
            s/0#2 initialized
            s/0#2 pending
            > cycle
            s/0#2 ready
            s/0#2 placed @h1
            s/0#2 launching @h1
              launch s/0#2 @h1 config 2
            s/0#2 running @h1
            > crash
            > register h1
            > resume u1
            update u1 v1->v2 rolling_forward cursor=2 batch={1} failed={} done=1
            s/1#1 killed @h1 (updated to a new spec)
              kill s/1#1 @h1
            > confirm
            s/1#2 initialized
            s/1#2 pending
            > cycle
            s/1#2 ready
            s/1#2 placed @h1
            s/1#2 launching @h1
              launch s/1#2 @h1 config 2
            update u1 v1->v2 rolling_forward cursor=3 batch={2} failed={} done=2
            s/1#2 running @h1
            s/2#1 killed @h1 (updated to a new spec)
              kill s/2#1 @h1
            > abort u1
            update u1 v1->v2 aborted cursor=3 batch={2} failed={} done=2 (aborted by request)
            > update s u2 n=2 batch=2
            update u2 v2->v3 rolling_forward cursor=2 batch={0, 1} failed={} done=0
            s/0#2 killed @h1 (updated to a new spec)
            s/1#2 killed @h1 (updated to a new spec)
              kill s/0#2 @h1
              kill s/1#2 @h1
            > confirm
            s/0#3 initialized
            s/1#3 initialized
            s/0#3 pending
            s/1#3 pending
            > cycle
            s/0#3 ready
            s/1#3 ready
            s/0#3 placed @h1
            s/0#3 launching @h1
            s/1#3 placed @h1
            s/1#3 launching @h1
              launch s/0#3 @h1 config 3
              launch s/1#3 @h1 config 3
            update u2 v2->v3 succeeded cursor=2 batch={} failed={} done=2
            s/0#3 running @h1
            s/1#3 running @h1
            > rollback u2
            update u2 v2->v3 rolling_backward cursor=2 batch={0, 1} failed={} done=0 (rolled back by request)
            s/0#3 killed @h1 (updated to a new spec)
            s/1#3 killed @h1 (updated to a new spec)
            s/2#1 pending
              kill s/0#3 @h1
              kill s/1#3 @h1
            > confirm
            s/0#4 initialized
            s/1#4 initialized
            s/0#4 pending
            s/1#4 pending
            > cycle
            s/2#1 ready
            s/0#4 ready
            s/1#4 ready
            s/2#1 placed @h1
            s/2#1 launching @h1
            s/0#4 placed @h1
            s/0#4 launching @h1
            s/1#4 placed @h1
            s/1#4 launching @h1
              launch s/2#1 @h1 config 2
              launch s/0#4 @h1 config 2
              launch s/1#4 @h1 config 2
            update u2 v2->v3 rolled_back cursor=3 batch={} failed={} done=3 (rolled back by request)
            s/2#1 running @h1
            s/0#4 running @h1
            s/1#4 running @h1
        "#]],
    );
}

#[test]
fn a_drain_stops_a_service_no_faster_than_its_sla_allows() {
    check(
        r"
        host h1 cpu=8
        job s pool=/ n=3 service health
        job b pool=/ n=1
        cycle
        healthy s/0
        healthy s/1
        healthy s/2
        host h2 cpu=8
        drain h1       # the batch task goes; one service instance at a time
        confirm
        cycle
        confirm        # nothing more until the replacement is healthy
        healthy s/0
        confirm
        cycle
        healthy s/1
        confirm
        cycle
        healthy s/2    # h1 went down once empty
        ",
        expect![[r#"
            > host h1 cpu=8
            > job s pool=/ n=3 service health
            s/0#1 pending
            s/1#1 pending
            s/2#1 pending
            job s pending
            > job b pool=/ n=1
            b/0#1 pending
            job b pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/2#1 ready
            b/0#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
            s/2#1 placed @h1
            s/2#1 launching @h1
            b/0#1 placed @h1
            b/0#1 launching @h1
              launch s/0#1 @h1 config 1
              launch s/1#1 @h1 config 1
              launch s/2#1 @h1 config 1
              launch b/0#1 @h1 config 1
            s/0#1 running @h1
            s/1#1 running @h1
            s/2#1 running @h1
            b/0#1 running @h1
            job s running
            job b running
            > healthy s/0
            s/0#1 running @h1 [Healthy]
            > healthy s/1
            s/1#1 running @h1 [Healthy]
            > healthy s/2
            s/2#1 running @h1 [Healthy]
            > host h2 cpu=8
            > drain h1
            s/0#1 preempted @h1 (host h1 drained for maintenance; lost work: 0 ms since its start)
            b/0#1 preempted @h1 (host h1 drained for maintenance; lost work: 0 ms since its start)
            job b pending
              kill s/0#1 @h1
              kill b/0#1 @h1
            > confirm
            s/0#2 initialized
            b/0#2 initialized
            s/0#2 pending
            b/0#2 pending
            > cycle
            s/0#2 ready
            b/0#2 ready
            s/0#2 placed @h2
            s/0#2 launching @h2
            b/0#2 placed @h2
            b/0#2 launching @h2
              launch s/0#2 @h2 config 1
              launch b/0#2 @h2 config 1
            s/0#2 running @h2
            b/0#2 running @h2
            job b running
            > confirm
            > healthy s/0
            s/0#2 running @h2 [Healthy]
            s/1#1 preempted @h1 (host h1 drained for maintenance; lost work: 0 ms since its start)
              kill s/1#1 @h1
            > confirm
            s/1#2 initialized
            s/1#2 pending
            > cycle
            s/1#2 ready
            s/1#2 placed @h2
            s/1#2 launching @h2
              launch s/1#2 @h2 config 1
            s/1#2 running @h2
            > healthy s/1
            s/1#2 running @h2 [Healthy]
            s/2#1 preempted @h1 (host h1 drained for maintenance; lost work: 0 ms since its start)
              kill s/2#1 @h1
            > confirm
            s/2#2 initialized
            s/2#2 pending
            > cycle
            s/2#2 ready
            s/2#2 placed @h2
            s/2#2 launching @h2
              launch s/2#2 @h2 config 1
            s/2#2 running @h2
            > healthy s/2
            s/2#2 running @h2 [Healthy]
        "#]],
    );
}

#[test]
fn a_finished_updates_record_is_history() {
    // Once an update ends, its counts are frozen: later updates move the
    // instances on, but u1 still reads 2/2 and u2 (rolled back) 2/2 with
    // the instance that failed on its new spec, as its reason says; so do
    // they after a restart.
    check(
        r"
        host h1 cpu=8
        job s pool=/ n=2 service health backoff=100
        cycle
        healthy s/0
        healthy s/1
        update s u1 batch=2
        confirm
        cycle
        healthy s/0
        healthy s/1       # u1 succeeded
        update s u2 batch=1 rollback
        confirm
        cycle
        unhealthy s/0     # failed on the new spec: u2 rolls back
        confirm
        tick 100
        cycle
        healthy s/0       # u2 rolled back
        update s u3 batch=2
        confirm
        cycle
        healthy s/0
        healthy s/1       # u3 succeeded
        update-status u1
        update-status u2
        update-status u3
        crash
        register h1
        update-status u1
        update-status u2
        ",
        expect![[r#"
            > host h1 cpu=8
            > job s pool=/ n=2 service health backoff=100
            s/0#1 pending
            s/1#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
              launch s/0#1 @h1 config 1
              launch s/1#1 @h1 config 1
            s/0#1 running @h1
            s/1#1 running @h1
            job s running
            > healthy s/0
            s/0#1 running @h1 [Healthy]
            > healthy s/1
            s/1#1 running @h1 [Healthy]
            > update s u1 batch=2
            update u1 v1->v2 rolling_forward cursor=2 batch={0, 1} failed={} done=0
            s/0#1 killed @h1 (updated to a new spec)
            s/1#1 killed @h1 (updated to a new spec)
              kill s/0#1 @h1
              kill s/1#1 @h1
            > confirm
            s/0#2 initialized
            s/1#2 initialized
            s/0#2 pending
            s/1#2 pending
            > cycle
            s/0#2 ready
            s/1#2 ready
            s/0#2 placed @h1
            s/0#2 launching @h1
            s/1#2 placed @h1
            s/1#2 launching @h1
              launch s/0#2 @h1 config 2
              launch s/1#2 @h1 config 2
            s/0#2 running @h1
            s/1#2 running @h1
            > healthy s/0
            update u1 v1->v2 rolling_forward cursor=2 batch={1} failed={} done=1
            s/0#2 running @h1 [Healthy]
            > healthy s/1
            update u1 v1->v2 succeeded cursor=2 batch={} failed={} done=2
            s/1#2 running @h1 [Healthy]
            > update s u2 batch=1 rollback
            update u2 v2->v3 rolling_forward cursor=1 batch={0} failed={} done=0
            s/0#2 killed @h1 (updated to a new spec)
              kill s/0#2 @h1
            > confirm
            s/0#3 initialized
            s/0#3 pending
            > cycle
            s/0#3 ready
            s/0#3 placed @h1
            s/0#3 launching @h1
              launch s/0#3 @h1 config 3
            s/0#3 running @h1
            > unhealthy s/0
            update u2 v2->v3 rolling_backward cursor=1 batch={0} failed={0} done=1 (1 instance(s) failed on the new spec (more than max_failed_instances 0))
            s/0#3 running @h1 [Unhealthy] (unhealthy: check failed)
            s/0#3 failed @h1 (unhealthy: check failed)
            s/0#3 backoff @h1 (unhealthy: check failed)
              kill s/0#3 @h1
            > confirm
            s/0#4 initialized
            s/0#4 pending
            > tick 100
            > cycle
            s/0#4 ready
            s/0#4 placed @h1
            s/0#4 launching @h1
              launch s/0#4 @h1 config 2
            s/0#4 running @h1
            > healthy s/0
            update u2 v2->v3 rolled_back cursor=2 batch={} failed={0} done=2 (1 instance(s) failed on the new spec (more than max_failed_instances 0))
            s/0#4 running @h1 [Healthy]
            > update s u3 batch=2
            update u3 v2->v4 rolling_forward cursor=2 batch={0, 1} failed={} done=0
            s/0#4 killed @h1 (updated to a new spec)
            s/1#2 killed @h1 (updated to a new spec)
              kill s/0#4 @h1
              kill s/1#2 @h1
            > confirm
            s/1#3 initialized
            s/0#5 initialized
            s/0#5 pending
            s/1#3 pending
            > cycle
            s/0#5 ready
            s/1#3 ready
            s/0#5 placed @h1
            s/0#5 launching @h1
            s/1#3 placed @h1
            s/1#3 launching @h1
              launch s/0#5 @h1 config 4
              launch s/1#3 @h1 config 4
            s/0#5 running @h1
            s/1#3 running @h1
            > healthy s/0
            update u3 v2->v4 rolling_forward cursor=2 batch={1} failed={} done=1
            s/0#5 running @h1 [Healthy]
            > healthy s/1
            update u3 v2->v4 succeeded cursor=2 batch={} failed={} done=2
            s/1#3 running @h1 [Healthy]
            > update-status u1
              update u1 succeeded done=2/2 failed={} failed_back={}
            > update-status u2
              update u2 rolled_back done=2/2 failed={0} failed_back={} (1 instance(s) failed on the new spec (more than max_failed_instances 0))
            > update-status u3
              update u3 succeeded done=2/2 failed={} failed_back={}
            > crash
            > register h1
            > update-status u1
              update u1 succeeded done=2/2 failed={} failed_back={}
            > update-status u2
              update u2 rolled_back done=2/2 failed={0} failed_back={} (1 instance(s) failed on the new spec (more than max_failed_instances 0))
        "#]],
    );
}

#[test]
fn a_rollback_that_fails_lists_what_failed_each_way() {
    // s/0 fails on the new spec (u1 rolls back), then on the old one: the
    // update fails, listing it once for each spec, as its reasons say.
    check(
        r"
        host h1 cpu=8
        job s pool=/ n=2 service health backoff=100
        cycle
        healthy s/0
        healthy s/1
        update s u1 batch=1 rollback
        confirm
        cycle
        unhealthy s/0     # failed on the new spec: u1 rolls back
        confirm
        tick 100
        cycle
        unhealthy s/0     # and on the old one: u1 fails
        update-status u1
        ",
        expect![[r#"
            > host h1 cpu=8
            > job s pool=/ n=2 service health backoff=100
            s/0#1 pending
            s/1#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
              launch s/0#1 @h1 config 1
              launch s/1#1 @h1 config 1
            s/0#1 running @h1
            s/1#1 running @h1
            job s running
            > healthy s/0
            s/0#1 running @h1 [Healthy]
            > healthy s/1
            s/1#1 running @h1 [Healthy]
            > update s u1 batch=1 rollback
            update u1 v1->v2 rolling_forward cursor=1 batch={0} failed={} done=0
            s/0#1 killed @h1 (updated to a new spec)
              kill s/0#1 @h1
            > confirm
            s/0#2 initialized
            s/0#2 pending
            > cycle
            s/0#2 ready
            s/0#2 placed @h1
            s/0#2 launching @h1
              launch s/0#2 @h1 config 2
            s/0#2 running @h1
            > unhealthy s/0
            update u1 v1->v2 rolling_backward cursor=1 batch={0} failed={0} done=1 (1 instance(s) failed on the new spec (more than max_failed_instances 0))
            s/0#2 running @h1 [Unhealthy] (unhealthy: check failed)
            s/0#2 failed @h1 (unhealthy: check failed)
            s/0#2 backoff @h1 (unhealthy: check failed)
              kill s/0#2 @h1
            > confirm
            s/0#3 initialized
            s/0#3 pending
            > tick 100
            > cycle
            s/0#3 ready
            s/0#3 placed @h1
            s/0#3 launching @h1
              launch s/0#3 @h1 config 1
            s/0#3 running @h1
            > unhealthy s/0
            update u1 v1->v2 failed cursor=1 batch={} failed={0} failed_back={0} done=1 (1 instance(s) failed on the old spec while rolling back (more than max_failed_instances 0))
            s/0#3 running @h1 [Unhealthy] (unhealthy: check failed)
            s/0#3 failed @h1 (unhealthy: check failed)
            s/0#3 backoff @h1 (unhealthy: check failed)
              kill s/0#3 @h1
            > update-status u1
              update u1 failed done=1/2 failed={0} failed_back={0} (1 instance(s) failed on the old spec while rolling back (more than max_failed_instances 0))
        "#]],
    );
}

#[test]
fn a_drain_stops_every_instance_pinned_to_its_host() {
    // Both instances' volumes are on h1: stopped, they can only wait for
    // h1, so the SLA (one down at a time) cannot be kept by waiting for
    // the first to come back; the drain stops both and h1 goes down. They
    // return to their volumes when h1 is up.
    check(
        r"
        host h1 cpu=4 disk=10000
        job s pool=/ n=2 cpu=1 disk=100 volume=1000 service
        cycle
        host h2 cpu=4 disk=10000
        drain h1
        confirm
        cycle             # h2 has room, but not their volumes
        hosts h1 h2
        tick 75000
        up h1
        cycle
        hosts h1 h2
        volumes
        ",
        expect![[r#"
            > host h1 cpu=4 disk=10000
            > job s pool=/ n=2 cpu=1 disk=100 volume=1000 service
            s/0#1 pending
            s/1#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-6 1000MiB
              launch s/1#1 @h1 config 1 volume s-1-8 1000MiB
            s/0#1 running @h1
            s/1#1 running @h1
            job s running
            > host h2 cpu=4 disk=10000
            > drain h1
            s/0#1 preempted @h1 (host h1 drained for maintenance; lost work: 0 ms since its start)
            s/1#1 preempted @h1 (host h1 drained for maintenance; lost work: 0 ms since its start)
              kill s/0#1 @h1
              kill s/1#1 @h1
            > confirm
            s/0#2 initialized
            s/1#2 initialized
            s/0#2 pending
            s/1#2 pending
            > cycle
            s/0#2 ready
            s/1#2 ready
            s/0#2 placing
            s/1#2 placing
            > hosts h1 h2
              hosts: h1=Down h2=Up
            > tick 75000
            > up h1
            > cycle
            s/0#2 placed @h1
            s/0#2 launching @h1
            s/1#2 placed @h1
            s/1#2 launching @h1
              launch s/0#2 @h1 config 1 volume s-0-6 1000MiB
              launch s/1#2 @h1 config 1 volume s-1-8 1000MiB
            s/0#2 running @h1
            s/1#2 running @h1
            > hosts h1 h2
              hosts: h1=Up h2=Up
            > volumes
              volume s-0-6 @h1 1000MiB in use
              volume s-1-8 @h1 1000MiB in use
        "#]],
    );
}

#[test]
fn a_drain_of_pinned_instances_waits_for_the_rest_of_the_job() {
    // s/2, on h2, is not healthy yet: the job is at its SLA's limit, so
    // the drain of h1 stops nothing until it is; then both instances
    // pinned to h1 go.
    check(
        r"
        host h1 cpu=2 disk=10000
        job s pool=/ n=2 cpu=1 disk=100 volume=1000 service health
        cycle
        healthy s/0
        healthy s/1
        host h2 cpu=4 disk=10000
        scale s 3         # h1 is full: s/2 goes to h2
        cycle
        drain h1          # s/2 is not healthy yet: nothing stops
        healthy s/2       # now both of h1's go
        confirm
        hosts h1
        ",
        expect![[r#"
            > host h1 cpu=2 disk=10000
            > job s pool=/ n=2 cpu=1 disk=100 volume=1000 service health
            s/0#1 pending
            s/1#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-6 1000MiB
              launch s/1#1 @h1 config 1 volume s-1-8 1000MiB
            s/0#1 running @h1
            s/1#1 running @h1
            job s running
            > healthy s/0
            s/0#1 running @h1 [Healthy]
            > healthy s/1
            s/1#1 running @h1 [Healthy]
            > host h2 cpu=4 disk=10000
            > scale s 3
            s/2#1 pending
            > cycle
            s/2#1 ready
            s/2#1 placed @h2
            s/2#1 launching @h2
              launch s/2#1 @h2 config 1 volume s-2-17 1000MiB
            s/2#1 running @h2
            > drain h1
            > healthy s/2
            s/2#1 running @h2 [Healthy]
            s/0#1 preempted @h1 (host h1 drained for maintenance; lost work: 0 ms since its start)
            s/1#1 preempted @h1 (host h1 drained for maintenance; lost work: 0 ms since its start)
              kill s/0#1 @h1
              kill s/1#1 @h1
            > confirm
            s/0#2 initialized
            s/1#2 initialized
            s/0#2 pending
            s/1#2 pending
            > hosts h1
              hosts: h1=Down
        "#]],
    );
}

#[test]
fn a_rollback_keeps_its_batch_and_versions_are_never_reused() {
    check(
        r"
        host h1 cpu=8
        job s pool=/ n=4 service backoff=100
        cycle
        update s u1 batch=2
        confirm
        cycle          # 0 and 1 run version 2; 2 and 3 are being moved
        rollback u1    # 2 and 3 (down) go back first, in the same batch
        confirm
        cycle
        confirm
        cycle
        update s u2 batch=4  # version 3, not 2 again
        kill s
        confirm
        delete s
        pause u2       # gone with its job
        ",
        expect![[r#"
            > host h1 cpu=8
            > job s pool=/ n=4 service backoff=100
            s/0#1 pending
            s/1#1 pending
            s/2#1 pending
            s/3#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/2#1 ready
            s/3#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
            s/2#1 placed @h1
            s/2#1 launching @h1
            s/3#1 placed @h1
            s/3#1 launching @h1
              launch s/0#1 @h1 config 1
              launch s/1#1 @h1 config 1
              launch s/2#1 @h1 config 1
              launch s/3#1 @h1 config 1
            s/0#1 running @h1
            s/1#1 running @h1
            s/2#1 running @h1
            s/3#1 running @h1
            job s running
            > update s u1 batch=2
            update u1 v1->v2 rolling_forward cursor=2 batch={0, 1} failed={} done=0
            s/0#1 killed @h1 (updated to a new spec)
            s/1#1 killed @h1 (updated to a new spec)
              kill s/0#1 @h1
              kill s/1#1 @h1
            > confirm
            s/0#2 initialized
            s/1#2 initialized
            s/0#2 pending
            s/1#2 pending
            > cycle
            s/0#2 ready
            s/1#2 ready
            s/0#2 placed @h1
            s/0#2 launching @h1
            s/1#2 placed @h1
            s/1#2 launching @h1
              launch s/0#2 @h1 config 2
              launch s/1#2 @h1 config 2
            update u1 v1->v2 rolling_forward cursor=4 batch={2, 3} failed={} done=2
            s/0#2 running @h1
            s/1#2 running @h1
            s/2#1 killed @h1 (updated to a new spec)
            s/3#1 killed @h1 (updated to a new spec)
              kill s/2#1 @h1
              kill s/3#1 @h1
            > rollback u1
            update u1 v1->v2 rolling_backward cursor=0 batch={2, 3} failed={} done=0 (rolled back by request)
            > confirm
            s/2#2 initialized
            s/3#2 initialized
            s/2#2 pending
            s/3#2 pending
            > cycle
            s/2#2 ready
            s/3#2 ready
            s/2#2 placed @h1
            s/2#2 launching @h1
            s/3#2 placed @h1
            s/3#2 launching @h1
              launch s/2#2 @h1 config 1
              launch s/3#2 @h1 config 1
            update u1 v1->v2 rolling_backward cursor=2 batch={0, 1} failed={} done=2 (rolled back by request)
            s/2#2 running @h1
            s/3#2 running @h1
            s/0#2 killed @h1 (updated to a new spec)
            s/1#2 killed @h1 (updated to a new spec)
              kill s/0#2 @h1
              kill s/1#2 @h1
            > confirm
            s/0#3 initialized
            s/1#3 initialized
            s/0#3 pending
            s/1#3 pending
            > cycle
            s/0#3 ready
            s/1#3 ready
            s/0#3 placed @h1
            s/0#3 launching @h1
            s/1#3 placed @h1
            s/1#3 launching @h1
              launch s/0#3 @h1 config 1
              launch s/1#3 @h1 config 1
            update u1 v1->v2 rolled_back cursor=4 batch={} failed={} done=4 (rolled back by request)
            s/0#3 running @h1
            s/1#3 running @h1
            > update s u2 batch=4
            update u2 v1->v3 rolling_forward cursor=4 batch={0, 1, 2, 3} failed={} done=0
            s/0#3 killed @h1 (updated to a new spec)
            s/1#3 killed @h1 (updated to a new spec)
            s/2#2 killed @h1 (updated to a new spec)
            s/3#2 killed @h1 (updated to a new spec)
              kill s/0#3 @h1
              kill s/1#3 @h1
              kill s/2#2 @h1
              kill s/3#2 @h1
            > kill s
            update u2 v1->v3 aborted cursor=4 batch={0, 1, 2, 3} failed={} done=0 (the job was killed)
            job s killing
            > confirm
            job s killed
            > delete s
            job s killed deleted
            > pause u2
            error: update u2 not found
        "#]],
    );
}

#[test]
fn a_stateful_instance_comes_back_to_its_volume_and_keeps_its_place() {
    check(
        r"
        host h1 cpu=4 disk=10000
        host h2 cpu=4 disk=10000
        job s pool=/ n=1 cpu=2 disk=100 volume=5000 service backoff=1000
        cycle
        volumes
        reserved h1
        exit s/0 1           # it fails: it backs off, its place stays held
        reserved h1
        job b pool=/ n=3 cpu=2 disk=100
        cycle                # h1 has room for one beside the held place: b/2 waits
        tick 1000
        cycle                # s/0 goes back to its volume on h1
        delete-volume s-0-4  # refused: in use
        drain h1             # preempted; pinned to h1, it waits for it
        confirm
        cycle
        reserved h1
        up h1
        cycle
        volumes
        kill s
        confirm
        reserved h1          # only the volume's disk stays held
        delete-volume s-0-4
        reserved h1
        ",
        expect![[r#"
            > host h1 cpu=4 disk=10000
            > host h2 cpu=4 disk=10000
            > job s pool=/ n=1 cpu=2 disk=100 volume=5000 service backoff=1000
            s/0#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-4 5000MiB
            s/0#1 running @h1
            job s running
            > volumes
              volume s-0-4 @h1 5000MiB in use
            > reserved h1
              reserved @h1: cpu=0 memory=0 disk=0 gpu=0; free: cpu=2000 memory=4032 disk=4900 gpu=0
            > exit s/0 1
            s/0#1 failed @h1 (exited with code 1)
            s/0#1 backoff @h1 (exited with code 1)
            > reserved h1
              reserved @h1: cpu=2000 memory=64 disk=5100 gpu=0; free: cpu=2000 memory=4032 disk=4900 gpu=0
            > job b pool=/ n=3 cpu=2 disk=100
            b/0#1 pending
            b/1#1 pending
            b/2#1 pending
            job b pending
            > cycle
            b/0#1 ready
            b/1#1 ready
            b/2#1 ready
            b/0#1 placed @h1
            b/0#1 launching @h1
            b/1#1 placed @h2
            b/1#1 launching @h2
            b/2#1 placed @h2
            b/2#1 launching @h2
              launch b/0#1 @h1 config 1
              launch b/1#1 @h2 config 1
              launch b/2#1 @h2 config 1
            b/0#1 running @h1
            job b running
            b/1#1 running @h2
            b/2#1 running @h2
            > tick 1000
            s/0#2 initialized
            s/0#2 pending
            > cycle
            s/0#2 ready
            s/0#2 placed @h1
            s/0#2 launching @h1
              launch s/0#2 @h1 config 1 volume s-0-4 5000MiB
            s/0#2 running @h1
            > delete-volume s-0-4
            error: volume s-0-4 is in use: a run of s/0 holds host h1; stop it first
            > drain h1
            s/0#2 preempted @h1 (host h1 drained for maintenance; lost work: 0 ms since its start)
            b/0#1 preempted @h1 (host h1 drained for maintenance; lost work: 1000 ms since its start)
              kill s/0#2 @h1
              kill b/0#1 @h1
            > confirm
            b/0#2 initialized
            s/0#3 initialized
            s/0#3 pending
            b/0#2 pending
            > cycle
            > reserved h1
              reserved @h1: cpu=2000 memory=64 disk=5100 gpu=0; free: cpu=2000 memory=4032 disk=4900 gpu=0
            > up h1
            > cycle
            s/0#3 ready
            b/0#2 ready
            s/0#3 placed @h1
            s/0#3 launching @h1
            b/0#2 placed @h1
            b/0#2 launching @h1
              launch s/0#3 @h1 config 1 volume s-0-4 5000MiB
              launch b/0#2 @h1 config 1
            s/0#3 running @h1
            b/0#2 running @h1
            > volumes
              volume s-0-4 @h1 5000MiB in use
            > kill s
            s/0#3 killed @h1 (job killed)
            job s killing
              kill s/0#3 @h1
            > confirm
            job s killed
            > reserved h1
              reserved @h1: cpu=0 memory=0 disk=5000 gpu=0; free: cpu=2000 memory=4032 disk=4900 gpu=0
            > delete-volume s-0-4
              delete volume s-0-4 @h1
            > reserved h1
              reserved @h1: cpu=0 memory=0 disk=0 gpu=0; free: cpu=2000 memory=4032 disk=9900 gpu=0
        "#]],
    );
}

#[test]
fn a_volume_whose_host_stays_down_is_given_up_if_the_job_says_so() {
    check(
        r"
        host h1 cpu=4 disk=10000
        host h2 cpu=4 disk=10000
        job s pool=/ n=1 cpu=1 volume=1000 service relocate=60000
        job w pool=/ n=1 cpu=1 volume=1000 service
        cycle
        volumes
        lost-host h1
        tick 30000
        cycle
        tick 30000           # s gives its volume up and starts fresh on h2; w waits
        cycle
        cycle
        volumes
        register h1          # h1 comes back: it is told to delete s's old volume
        cycle
        volumes
        crash
        register h1
        register h2
        cycle
        volumes
        ",
        expect![[r#"
            > host h1 cpu=4 disk=10000
            > host h2 cpu=4 disk=10000
            > job s pool=/ n=1 cpu=1 volume=1000 service relocate=60000
            s/0#1 pending
            job s pending
            > job w pool=/ n=1 cpu=1 volume=1000 service
            w/0#1 pending
            job w pending
            > cycle
            s/0#1 ready
            w/0#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            w/0#1 placed @h1
            w/0#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-7 1000MiB
              launch w/0#1 @h1 config 1 volume w-0-9 1000MiB
            s/0#1 running @h1
            w/0#1 running @h1
            job s running
            job w running
            > volumes
              volume s-0-7 @h1 1000MiB in use
              volume w-0-9 @h1 1000MiB in use
            > lost-host h1
            s/0#1 lost @h1 (host h1 lost: no heartbeat for 10000 ms)
            s/0#2 initialized
            w/0#1 lost @h1 (host h1 lost: no heartbeat for 10000 ms)
            w/0#2 initialized
            s/0#2 pending
            w/0#2 pending
            > tick 30000
            > cycle
            s/0#2 ready
            w/0#2 ready
            s/0#2 placing
            w/0#2 placing
            > tick 30000
            s/0#2 preempted (volume s-0-7 given up: host h1 down for 60 s; starting fresh elsewhere)
            s/0#3 initialized
            s/0#3 pending
              delete volume s-0-7 @h1
            > cycle
            s/0#3 ready
            s/0#3 placed @h2
            s/0#3 launching @h2
              launch s/0#3 @h2 config 1 volume s-0-29 1000MiB
            s/0#3 running @h2
            > cycle
            > volumes
              volume s-0-29 @h2 1000MiB in use
              volume w-0-9 @h1 1000MiB
            > register h1
              delete volume s-0-7 @h1
            > cycle
            w/0#2 placed @h1
            w/0#2 launching @h1
              launch w/0#2 @h1 config 1 volume w-0-9 1000MiB
            w/0#2 running @h1
            > volumes
              volume s-0-29 @h2 1000MiB in use
              volume w-0-9 @h1 1000MiB in use
            > crash
            > register h1
            > register h2
            > cycle
            > volumes
              volume s-0-29 @h2 1000MiB in use
              volume w-0-9 @h1 1000MiB in use
        "#]],
    );
}

#[test]
fn a_daemon_job_follows_the_hosts_it_matches() {
    check(
        r"
        host h1 cpu=4 zone=a
        host h2 cpu=4 zone=a
        host h3 cpu=4 zone=b
        job d pool=/ cpu=1 daemon
        job z pool=/ cpu=1 daemon constraint=zone_==_a
        cycle
        host h4 cpu=4 zone=a
        cycle                # a fourth host gets one of each
        job b pool=/ n=1 cpu=1
        cycle
        drain h1             # b's run and d and z stay until b's is gone: then d and z go last
        confirm
        cycle
        confirm
        cycle
        up h1
        cycle                # h1 is back: d and z start there again
        crash
        register h1
        register h2
        register h3
        register h4
        cycle
        ",
        expect![[r#"
            > host h1 cpu=4 zone=a
            > host h2 cpu=4 zone=a
            > host h3 cpu=4 zone=b
            > job d pool=/ cpu=1 daemon
            d/0#1 pending
            d/1#1 pending
            d/2#1 pending
            job d pending
            > job z pool=/ cpu=1 daemon constraint=zone_==_a
            z/0#1 pending
            z/1#1 pending
            job z pending
            > cycle
            d/0#1 ready
            d/1#1 ready
            d/2#1 ready
            z/0#1 ready
            z/1#1 ready
            d/0#1 placed @h1
            d/0#1 launching @h1
            d/1#1 placed @h2
            d/1#1 launching @h2
            d/2#1 placed @h3
            d/2#1 launching @h3
            z/0#1 placed @h1
            z/0#1 launching @h1
            z/1#1 placed @h2
            z/1#1 launching @h2
              launch d/0#1 @h1 config 1
              launch d/1#1 @h2 config 1
              launch d/2#1 @h3 config 1
              launch z/0#1 @h1 config 1
              launch z/1#1 @h2 config 1
            d/0#1 running @h1
            z/0#1 running @h1
            job d running
            job z running
            d/1#1 running @h2
            z/1#1 running @h2
            d/2#1 running @h3
            > host h4 cpu=4 zone=a
            > cycle
            d/3#1 pending
            z/2#1 pending
            d/3#1 ready
            z/2#1 ready
            d/3#1 placed @h4
            d/3#1 launching @h4
            z/2#1 placed @h4
            z/2#1 launching @h4
              launch d/3#1 @h4 config 1
              launch z/2#1 @h4 config 1
            d/3#1 running @h4
            z/2#1 running @h4
            > job b pool=/ n=1 cpu=1
            b/0#1 pending
            job b pending
            > cycle
            b/0#1 ready
            b/0#1 placed @h1
            b/0#1 launching @h1
              launch b/0#1 @h1 config 1
            b/0#1 running @h1
            job b running
            > drain h1
            b/0#1 preempted @h1 (host h1 drained for maintenance; lost work: 0 ms since its start)
            job b pending
              kill b/0#1 @h1
            > confirm
            b/0#2 initialized
            d/0#1 killed @h1 (host h1 drained for maintenance)
            z/0#1 killed @h1 (host h1 drained for maintenance)
            b/0#2 pending
              kill d/0#1 @h1
              kill z/0#1 @h1
            > cycle
            b/0#2 ready
            b/0#2 placed @h2
            b/0#2 launching @h2
              launch b/0#2 @h2 config 1
            b/0#2 running @h2
            job b running
            > confirm
            > cycle
            > up h1
            > cycle
            d/0#2 initialized
            z/0#2 initialized
            d/0#2 pending
            z/0#2 pending
            d/0#2 ready
            z/0#2 ready
            d/0#2 placed @h1
            d/0#2 launching @h1
            z/0#2 placed @h1
            z/0#2 launching @h1
              launch d/0#2 @h1 config 1
              launch z/0#2 @h1 config 1
            d/0#2 running @h1
            z/0#2 running @h1
            > crash
            > register h1
            > register h2
            > register h3
            > register h4
            > cycle
        "#]],
    );
}

#[test]
fn a_daemon_evicts_preemptible_work_on_its_host() {
    check(
        r"
        host h1 cpu=2
        host h2 cpu=2
        pool /a
        pool /d cpu=2 mem=128
        job b pool=/a n=4 cpu=1 preemptible
        cycle
        job d pool=/d cpu=1 daemon
        cycle                # /a gives back its overage; d evicts where it must
        confirm
        cycle
        confirm
        cycle
        ",
        expect![[r#"
            > host h1 cpu=2
            > host h2 cpu=2
            > pool /a
            > pool /d cpu=2 mem=128
            > job b pool=/a n=4 cpu=1 preemptible
            b/0#1 pending
            b/1#1 pending
            b/2#1 pending
            b/3#1 pending
            job b pending
            > cycle
            b/0#1 ready
            b/1#1 ready
            b/2#1 ready
            b/3#1 ready
            b/0#1 placed @h1
            b/0#1 launching @h1
            b/1#1 placed @h1
            b/1#1 launching @h1
            b/2#1 placed @h2
            b/2#1 launching @h2
            b/3#1 placed @h2
            b/3#1 launching @h2
              launch b/0#1 @h1 config 1
              launch b/1#1 @h1 config 1
              launch b/2#1 @h2 config 1
              launch b/3#1 @h2 config 1
            b/0#1 running @h1
            b/1#1 running @h1
            job b running
            b/2#1 running @h2
            b/3#1 running @h2
            > job d pool=/d cpu=1 daemon
            d/0#1 pending
            d/1#1 pending
            job d pending
            > cycle
            d/0#1 ready
            d/1#1 ready
            d/0#1 placing
            d/1#1 placing
            b/3#1 preempted @h2 (preempted: pool over its entitlement in cpu: 4000 held, 2000 entitled; lost work: 0 ms since its start)
            b/2#1 preempted @h2 (preempted: pool over its entitlement in cpu: 4000 held, 2000 entitled; lost work: 0 ms since its start)
              kill b/3#1 @h2
              kill b/2#1 @h2
            > confirm
            b/2#2 initialized
            b/3#2 initialized
            b/2#2 pending
            b/3#2 pending
            > cycle
            d/1#1 placed @h2
            d/1#1 launching @h2
            b/1#1 preempted @h1 (preempted: daemon d/0 needs room on host h1; lost work: 0 ms since its start)
              launch d/1#1 @h2 config 1
              kill b/1#1 @h1
            d/1#1 running @h2
            job d running
            > confirm
            b/1#2 initialized
            b/1#2 pending
            > cycle
            b/2#2 ready
            d/0#1 placed @h1
            d/0#1 launching @h1
            b/2#2 placed @h2
            b/2#2 launching @h2
              launch d/0#1 @h1 config 1
              launch b/2#2 @h2 config 1
            d/0#1 running @h1
            b/2#2 running @h2
        "#]],
    );
}

/// Found by the model-based driver (`sim::ops`): a daemon that fits
/// nowhere evicts a preemptible stateful instance from its host; the
/// instance, pinned there, got its whole request reserved again while it
/// came back, so it took back the room it was evicted for, and was evicted
/// again, for ever. Now an instance preempted to make room holds only its
/// volume's disk until it is placed again, and the daemon gets the room.
#[test]
fn a_daemon_keeps_the_room_it_evicted_a_stateful_instance_for() {
    check(
        r"
        host h1 cpu=2 disk=10000
        host h2 cpu=3 disk=10000
        job s pool=/ n=2 cpu=1 volume=1000 service preemptible
        cycle
        job d pool=/ cpu=1 daemon
        cycle                # d/0 evicts s/1 from h1
        confirm
        reserved h1          # s/1 holds only its volume's disk; the room is d/0's
        cycle                # d/0 gets the room; s/1 waits for room on h1
        confirm
        cycle
        reserved h1
        ",
        expect![[r#"
            > host h1 cpu=2 disk=10000
            > host h2 cpu=3 disk=10000
            > job s pool=/ n=2 cpu=1 volume=1000 service preemptible
            s/0#1 pending
            s/1#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-6 1000MiB
              launch s/1#1 @h1 config 1 volume s-1-8 1000MiB
            s/0#1 running @h1
            s/1#1 running @h1
            job s running
            > job d pool=/ cpu=1 daemon
            d/0#1 pending
            d/1#1 pending
            job d pending
            > cycle
            d/0#1 ready
            d/1#1 ready
            d/1#1 placed @h2
            d/1#1 launching @h2
            d/0#1 placing
            s/1#1 preempted @h1 (preempted: daemon d/0 needs room on host h1; lost work: 0 ms since its start)
              launch d/1#1 @h2 config 1
              kill s/1#1 @h1
            d/1#1 running @h2
            job d running
            > confirm
            s/1#2 initialized
            s/1#2 pending
            > reserved h1
              reserved @h1: cpu=1000 memory=64 disk=1000 gpu=0; free: cpu=0 memory=3968 disk=8000 gpu=0
            > cycle
            s/1#2 ready
            d/0#1 placed @h1
            d/0#1 launching @h1
            s/1#2 placing
              launch d/0#1 @h1 config 1
            d/0#1 running @h1
            > confirm
            > cycle
            > reserved h1
              reserved @h1: cpu=0 memory=0 disk=1000 gpu=0; free: cpu=0 memory=3968 disk=8000 gpu=0
        "#]],
    );
}

/// Found by the model-based driver: a preemptible daemon evicts a
/// preemptible stateful instance of higher priority from its host; the
/// instance, pinned there, then evicted the daemon by the intra-pool rule
/// (same pool, lower priority), and so on for ever. A daemon is never
/// evicted for another pinned task (the engine's rule, now kept by its
/// intra-pool planner too): the stateful instance waits for room.
#[test]
fn a_pinned_task_never_evicts_a_daemon() {
    check(
        r"
        host h1 cpu=2 disk=10000
        host h2 cpu=3 disk=10000
        job s pool=/ n=1 cpu=1 volume=1000 priority=1 preemptible
        job t pool=/ n=1 cpu=1
        cycle
        job d pool=/ cpu=1 daemon preemptible
        cycle                # d evicts s (preemptible, any pool and priority)
        confirm
        cycle                # d runs; s waits for room on its host
        cycle
        ",
        expect![[r#"
            > host h1 cpu=2 disk=10000
            > host h2 cpu=3 disk=10000
            > job s pool=/ n=1 cpu=1 volume=1000 priority=1 preemptible
            s/0#1 pending
            job s pending
            > job t pool=/ n=1 cpu=1
            t/0#1 pending
            job t pending
            > cycle
            s/0#1 ready
            t/0#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            t/0#1 placed @h1
            t/0#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-7 1000MiB
              launch t/0#1 @h1 config 1
            s/0#1 running @h1
            t/0#1 running @h1
            job s running
            job t running
            > job d pool=/ cpu=1 daemon preemptible
            d/0#1 pending
            d/1#1 pending
            job d pending
            > cycle
            d/0#1 ready
            d/1#1 ready
            d/1#1 placed @h2
            d/1#1 launching @h2
            d/0#1 placing
            s/0#1 preempted @h1 (preempted: daemon d/0 needs room on host h1; lost work: 0 ms since its start)
            job s pending
              launch d/1#1 @h2 config 1
              kill s/0#1 @h1
            d/1#1 running @h2
            job d running
            > confirm
            s/0#2 initialized
            s/0#2 pending
            > cycle
            s/0#2 ready
            d/0#1 placed @h1
            d/0#1 launching @h1
            s/0#2 placing
              launch d/0#1 @h1 config 1
            d/0#1 running @h1
            > cycle
        "#]],
    );
}

/// Found by the model-based driver: rolling back an update of a daemon
/// job scaled it to the instance count of the old spec (here the count it
/// was created with, though no host matched), which added an instance
/// bound to no host: it was queued unpinned, to run on any host it
/// matches, beside the host's own instance. A daemon's count follows the
/// hosts, in a rollback too.
#[test]
fn rolling_back_a_daemon_update_adds_no_instance() {
    check(
        r"
        host h1 cpu=4 zone=a
        job d pool=/ cpu=1 daemon constraint=zone_==_b
        cycle
        update d u1 cpu=2
        rollback u1
        cycle
        host h2 cpu=4 zone=b
        cycle                # one instance, on h2
        ",
        expect![[r#"
            > host h1 cpu=4 zone=a
            > job d pool=/ cpu=1 daemon constraint=zone_==_b
            job d pending
            > cycle
            > update d u1 cpu=2
            update u1 v1->v2 succeeded cursor=0 batch={} failed={} done=0
            > rollback u1
            update u1 v1->v2 rolled_back cursor=0 batch={} failed={} done=0 (rolled back by request)
            > cycle
            > host h2 cpu=4 zone=b
            > cycle
            d/0#1 pending
            d/0#1 ready
            d/0#1 placed @h2
            d/0#1 launching @h2
              launch d/0#1 @h2 config 1
            d/0#1 running @h2
            job d running
        "#]],
    );
}

/// Found by the model-based driver: an update gave a waiting stateful
/// instance its new spec without a transition, so the place reserved for
/// it on its volume's host kept the old request (here 1 cpu held for a
/// task of 2, which then may not fit in the place kept for it). The
/// reservation follows the instance's spec.
#[test]
fn an_update_resizes_the_place_kept_for_a_waiting_stateful_instance() {
    check(
        r"
        host h1 cpu=4 disk=10000
        job s pool=/ n=2 cpu=1 volume=1000 service max_running=1 backoff=1000
        cycle
        exit s/0 1           # s/1 takes the running slot
        cycle
        tick 1000            # s/0 waits on h1, its place kept
        cycle
        reserved h1
        update s u1 cpu=2
        reserved h1          # its place is now 2 cpu
        ",
        expect![[r#"
            > host h1 cpu=4 disk=10000
            > job s pool=/ n=2 cpu=1 volume=1000 service max_running=1 backoff=1000
            s/0#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-4 1000MiB
            s/0#1 running @h1
            job s running
            > exit s/0 1
            s/0#1 failed @h1 (exited with code 1)
            s/0#1 backoff @h1 (exited with code 1)
            s/1#1 pending
            > cycle
            s/1#1 ready
            s/1#1 placed @h1
            s/1#1 launching @h1
              launch s/1#1 @h1 config 1 volume s-1-12 1000MiB
            s/1#1 running @h1
            > tick 1000
            s/0#2 initialized
            > cycle
            > reserved h1
              reserved @h1: cpu=1000 memory=64 disk=1000 gpu=0; free: cpu=2000 memory=3968 disk=8000 gpu=0
            > update s u1 cpu=2
            update u1 v1->v2 rolling_forward cursor=1 batch={0} failed={} done=0
            > reserved h1
              reserved @h1: cpu=2000 memory=64 disk=1000 gpu=0; free: cpu=1000 memory=3968 disk=8000 gpu=0
        "#]],
    );
}

/// Found by the model-based driver (with more cases): an instance failed
/// on the update's new spec (tolerated: max_failed=1) and was then killed
/// by its user; as a failed instance still down it kept taking the
/// update's only batch slot, so the update never moved on to the next
/// instance and never ended. An instance its user stopped is not the
/// update's to wait for, failed or not.
#[test]
fn an_update_moves_on_past_a_failed_instance_its_user_killed() {
    check(
        r"
        host h1 cpu=4
        job s pool=/ n=2 cpu=1 service health
        cycle
        healthy s/0
        healthy s/1
        update s u1 cpu=1 mem=128 batch=1 max_failed=1
        confirm
        cycle
        unhealthy s/0        # fails on the new spec: tolerated
        confirm
        kill s/0             # its user stops it: the update goes on with s/1
        cycle
        confirm
        cycle
        healthy s/1
        ",
        expect![[r#"
            > host h1 cpu=4
            > job s pool=/ n=2 cpu=1 service health
            s/0#1 pending
            s/1#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
              launch s/0#1 @h1 config 1
              launch s/1#1 @h1 config 1
            s/0#1 running @h1
            s/1#1 running @h1
            job s running
            > healthy s/0
            s/0#1 running @h1 [Healthy]
            > healthy s/1
            s/1#1 running @h1 [Healthy]
            > update s u1 cpu=1 mem=128 batch=1 max_failed=1
            update u1 v1->v2 rolling_forward cursor=1 batch={0} failed={} done=0
            s/0#1 killed @h1 (updated to a new spec)
              kill s/0#1 @h1
            > confirm
            s/0#2 initialized
            s/0#2 pending
            > cycle
            s/0#2 ready
            s/0#2 placed @h1
            s/0#2 launching @h1
              launch s/0#2 @h1 config 2
            s/0#2 running @h1
            > unhealthy s/0
            update u1 v1->v2 rolling_forward cursor=1 batch={} failed={0} done=0
            s/0#2 running @h1 [Unhealthy] (unhealthy: check failed)
            s/0#2 failed @h1 (unhealthy: check failed)
            s/0#2 backoff @h1 (unhealthy: check failed)
              kill s/0#2 @h1
            > confirm
            > kill s/0
            update u1 v1->v2 rolling_forward cursor=2 batch={1} failed={0} done=0
            s/0#2 killed @h1 (killed by request)
            s/1#1 killed @h1 (updated to a new spec)
              kill s/1#1 @h1
            > cycle
            > confirm
            s/1#2 initialized
            s/1#2 pending
            > cycle
            s/1#2 ready
            s/1#2 placed @h1
            s/1#2 launching @h1
              launch s/1#2 @h1 config 2
            s/1#2 running @h1
            > healthy s/1
            update u1 v1->v2 succeeded cursor=2 batch={} failed={0} done=1
            s/1#2 running @h1 [Healthy]
        "#]],
    );
}

/// Found by the model-based driver: after a restart, a stateful
/// instance's run that its agent had not reported yet (here killed
/// meanwhile, its end unconfirmed) held no engine task, and no place was
/// reserved for it either: its volume's disk looked free, and another
/// stateful job's volume was put there, more than the disk holds (the
/// killed job's volume could then not be reserved at all). Such a run's
/// place is reserved until its agent reports it.
#[test]
fn a_recovered_stateful_run_keeps_its_volume_disk() {
    check(
        r"
        host h1 cpu=4 disk=4000
        job s pool=/ n=1 cpu=1 volume=3000 service
        cycle
        crash
        reserved h1          # the run's place, until its agent reports it
        kill s               # its agent is away: the end waits
        register h1          # it still runs: killed again
        reserved h1
        job t pool=/ n=1 cpu=1 volume=3000 service
        cycle                # no room for t's volume on h1
        confirm
        reserved h1          # s's volume stays held
        ",
        expect![[r#"
            > host h1 cpu=4 disk=4000
            > job s pool=/ n=1 cpu=1 volume=3000 service
            s/0#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-4 3000MiB
            s/0#1 running @h1
            job s running
            > crash
            > reserved h1
              reserved @h1: cpu=1000 memory=64 disk=3000 gpu=0; free: cpu=3000 memory=4032 disk=1000 gpu=0
            > kill s
            s/0#1 killed @h1 (job killed)
            job s killing
              kill s/0#1 @h1
            > register h1
              kill s/0#1 @h1
            > reserved h1
              reserved @h1: cpu=1000 memory=64 disk=3000 gpu=0; free: cpu=3000 memory=4032 disk=1000 gpu=0
            > job t pool=/ n=1 cpu=1 volume=3000 service
            t/0#1 pending
            job t pending
            > cycle
            t/0#1 ready
            t/0#1 placing
            > confirm
            job s killed
            > reserved h1
              reserved @h1: cpu=0 memory=0 disk=3000 gpu=0; free: cpu=4000 memory=4096 disk=1000 gpu=0
        "#]],
    );
}

/// Found by the model-based driver: a pinned instance whose place could
/// not be reserved (its room taken while it was not coming back) never
/// got it reserved once room was free again, so other work could take
/// that room first; and a place given up later in the same step (here a
/// daemon instance's, retired) was not seen by the instances before it.
/// A reservation that does not fit is tried again after every step.
#[test]
fn a_place_that_did_not_fit_is_reserved_once_room_frees() {
    check(
        r"
        host h1 cpu=2 disk=10000
        job s pool=/ n=1 cpu=1 volume=1000 service
        cycle
        kill s
        confirm
        job b pool=/ n=2 cpu=1
        cycle                # b takes all of h1
        restart s            # s comes back: no room for its place on h1
        reserved h1
        exit b/0 0
        reserved h1          # now its place is held
        cycle
        ",
        expect![[r#"
            > host h1 cpu=2 disk=10000
            > job s pool=/ n=1 cpu=1 volume=1000 service
            s/0#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-4 1000MiB
            s/0#1 running @h1
            job s running
            > kill s
            s/0#1 killed @h1 (job killed)
            job s killing
              kill s/0#1 @h1
            > confirm
            job s killed
            > job b pool=/ n=2 cpu=1
            b/0#1 pending
            b/1#1 pending
            job b pending
            > cycle
            b/0#1 ready
            b/1#1 ready
            b/0#1 placed @h1
            b/0#1 launching @h1
            b/1#1 placed @h1
            b/1#1 launching @h1
              launch b/0#1 @h1 config 1
              launch b/1#1 @h1 config 1
            b/0#1 running @h1
            b/1#1 running @h1
            job b running
            > restart s
            s/0#2 initialized
            s/0#2 pending
            job s running
            > reserved h1
              reserved @h1: cpu=0 memory=0 disk=1000 gpu=0; free: cpu=0 memory=3968 disk=9000 gpu=0
            > exit b/0 0
            b/0#1 succeeded @h1
            > reserved h1
              reserved @h1: cpu=1000 memory=64 disk=1000 gpu=0; free: cpu=0 memory=3968 disk=9000 gpu=0
            > cycle
            s/0#2 ready
            s/0#2 placed @h1
            s/0#2 launching @h1
              launch s/0#2 @h1 config 1 volume s-0-4 1000MiB
            s/0#2 running @h1
        "#]],
    );
}

/// Found by the model-based driver: an instance scaled away keeps its
/// volume (and the volume's disk reserved), but while its last run was
/// still stopping there the disk was reserved on top of what that run's
/// task holds: counted twice, it left too little for another volume,
/// which then got no reservation at all. The disk is reserved once the
/// run is gone.
#[test]
fn a_scaled_away_instance_holds_its_volume_disk_once() {
    check(
        r"
        host h1 cpu=4 disk=4000
        job s pool=/ n=2 cpu=1 volume=1000 service
        cycle
        scale s 1            # s/1 stops; its volume stays
        reserved h1          # its run still holds the disk
        confirm
        reserved h1          # now its volume's disk is reserved
        ",
        expect![[r#"
            > host h1 cpu=4 disk=4000
            > job s pool=/ n=2 cpu=1 volume=1000 service
            s/0#1 pending
            s/1#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-6 1000MiB
              launch s/1#1 @h1 config 1 volume s-1-8 1000MiB
            s/0#1 running @h1
            s/1#1 running @h1
            job s running
            > scale s 1
            s/1#1 killed @h1 (job scaled down)
              kill s/1#1 @h1
            > reserved h1
              reserved @h1: cpu=0 memory=0 disk=0 gpu=0; free: cpu=2000 memory=3968 disk=2000 gpu=0
            > confirm
            > reserved h1
              reserved @h1: cpu=0 memory=0 disk=1000 gpu=0; free: cpu=3000 memory=4032 disk=2000 gpu=0
        "#]],
    );
}

/// Found by the model-based driver: an instance scaled away keeps its
/// volume; scaled back, it is pinned to it again, but while it waited
/// (here for the running slot) only the volume's disk was reserved, not
/// its place: instances added by a scale-up had their reservation
/// computed only at their first transition.
#[test]
fn an_instance_scaled_back_keeps_its_place_while_it_waits() {
    check(
        r"
        host h1 cpu=4 disk=10000
        job s pool=/ n=2 cpu=1 volume=1000 service max_running=1 backoff=1000
        cycle
        exit s/0 1           # s/1 takes the running slot
        cycle
        scale s 1            # s/1 goes; its volume stays
        confirm
        tick 1000
        cycle                # s/0 runs again
        scale s 2            # s/1 is back and waits for the slot
        reserved h1          # its place on its volume's host is kept
        ",
        expect![[r#"
            > host h1 cpu=4 disk=10000
            > job s pool=/ n=2 cpu=1 volume=1000 service max_running=1 backoff=1000
            s/0#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-4 1000MiB
            s/0#1 running @h1
            job s running
            > exit s/0 1
            s/0#1 failed @h1 (exited with code 1)
            s/0#1 backoff @h1 (exited with code 1)
            s/1#1 pending
            > cycle
            s/1#1 ready
            s/1#1 placed @h1
            s/1#1 launching @h1
              launch s/1#1 @h1 config 1 volume s-1-12 1000MiB
            s/1#1 running @h1
            > scale s 1
            s/1#1 killed @h1 (job scaled down)
              kill s/1#1 @h1
            > confirm
            > tick 1000
            s/0#2 initialized
            s/0#2 pending
            > cycle
            s/0#2 ready
            s/0#2 placed @h1
            s/0#2 launching @h1
              launch s/0#2 @h1 config 1 volume s-0-4 1000MiB
            s/0#2 running @h1
            > scale s 2
            > reserved h1
              reserved @h1: cpu=1000 memory=64 disk=1000 gpu=0; free: cpu=2000 memory=3968 disk=8000 gpu=0
        "#]],
    );
}

#[test]
fn a_returning_hosts_old_daemon_run_stops_before_a_new_one_starts() {
    check(
        r"
        host h1 cpu=4
        host h2 cpu=4
        job d pool=/ cpu=1 daemon
        cycle
        partition h1
        cycle
        cycle
        register h1
        cycle
        cycle
        confirm
        cycle
        ",
        expect![[r#"
            > host h1 cpu=4
            > host h2 cpu=4
            > job d pool=/ cpu=1 daemon
            d/0#1 pending
            d/1#1 pending
            job d pending
            > cycle
            d/0#1 ready
            d/1#1 ready
            d/0#1 placed @h1
            d/0#1 launching @h1
            d/1#1 placed @h2
            d/1#1 launching @h2
              launch d/0#1 @h1 config 1
              launch d/1#1 @h2 config 1
            d/0#1 running @h1
            job d running
            d/1#1 running @h2
            > partition h1
            d/0#1 lost @h1 (host h1 lost: no heartbeat for 10000 ms)
            d/0#2 initialized
            d/0#2 pending
            > cycle
            d/0#2 killed (host h1 no longer matches the daemon job)
            > cycle
            > register h1
              kill d/0#1 @h1
            > cycle
            > cycle
            > confirm
            > cycle
            d/0#3 initialized
            d/0#3 pending
            d/0#3 ready
            d/0#3 placed @h1
            d/0#3 launching @h1
              launch d/0#3 @h1 config 1
            d/0#3 running @h1
        "#]],
    );
}

#[test]
fn a_returning_hosts_old_stateful_run_stops_before_the_next_starts() {
    check(
        r"
        host h1 cpu=4 disk=10000
        host h2 cpu=4 disk=10000
        job s pool=/ n=1 cpu=1 volume=1000 service
        cycle
        partition h1         # run 1 lives on, out of sight; run 2 waits for h1
        cycle
        register h1          # run 1 is stopped first (held); run 2 gives way
        cycle
        confirm
        cycle                # only now the next run starts, on its volume
        ",
        expect![[r#"
            > host h1 cpu=4 disk=10000
            > host h2 cpu=4 disk=10000
            > job s pool=/ n=1 cpu=1 volume=1000 service
            s/0#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-4 1000MiB
            s/0#1 running @h1
            job s running
            > partition h1
            s/0#1 lost @h1 (host h1 lost: no heartbeat for 10000 ms)
            s/0#2 initialized
            s/0#2 pending
            > cycle
            s/0#2 ready
            s/0#2 placing
            > register h1
            s/0#2 preempted (waiting for its earlier run on host h1 to end)
              kill s/0#1 @h1
            > cycle
            > confirm
            s/0#3 initialized
            s/0#3 pending
            > cycle
            s/0#3 ready
            s/0#3 placed @h1
            s/0#3 launching @h1
              launch s/0#3 @h1 config 1 volume s-0-4 1000MiB
            s/0#3 running @h1
        "#]],
    );
}

#[test]
fn finished_jobs_go_after_their_retention_and_beyond_the_count_never_a_live_one() {
    check(
        r"
        retention ms=10000 max=2
        host h1 cpu=8
        job a pool=/ n=1
        job b pool=/ n=2
        job c pool=/ n=1
        job live pool=/ n=1
        cycle
        exit a/0 0
        tick 1000
        exit b/0 0
        exit b/1 1      # b fails, still finished
        tick 1000
        exit c/0 0      # three finished, two kept: a goes at the next tick
        jobs
        tick 1
        jobs
        tick 8998       # b finished 9,999 ms ago
        jobs
        tick 1          # b's retention is over
        jobs
        crash           # what retention removed stays removed
        register h1
        jobs
        tick 100000     # c goes; live runs on, however old
        jobs
        kill live
        confirm
        tick 9999
        jobs
        tick 1
        jobs
        ",
        expect![[r#"
            > retention ms=10000 max=2
            > host h1 cpu=8
            > job a pool=/ n=1
            a/0#1 pending
            job a pending
            > job b pool=/ n=2
            b/0#1 pending
            b/1#1 pending
            job b pending
            > job c pool=/ n=1
            c/0#1 pending
            job c pending
            > job live pool=/ n=1
            live/0#1 pending
            job live pending
            > cycle
            a/0#1 ready
            b/0#1 ready
            b/1#1 ready
            c/0#1 ready
            live/0#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
            b/0#1 placed @h1
            b/0#1 launching @h1
            b/1#1 placed @h1
            b/1#1 launching @h1
            c/0#1 placed @h1
            c/0#1 launching @h1
            live/0#1 placed @h1
            live/0#1 launching @h1
              launch a/0#1 @h1 config 1
              launch b/0#1 @h1 config 1
              launch b/1#1 @h1 config 1
              launch c/0#1 @h1 config 1
              launch live/0#1 @h1 config 1
            a/0#1 running @h1
            b/0#1 running @h1
            b/1#1 running @h1
            c/0#1 running @h1
            live/0#1 running @h1
            job a running
            job b running
            job c running
            job live running
            > exit a/0 0
            a/0#1 succeeded @h1
            job a succeeded
            > tick 1000
            > exit b/0 0
            b/0#1 succeeded @h1
            > exit b/1 1
            b/1#1 failed @h1 (exited with code 1)
            job b failed
            > tick 1000
            > exit c/0 0
            c/0#1 succeeded @h1
            job c succeeded
            > jobs
            jobs: a=succeeded b=failed c=succeeded live=running | stored: a(tasks=1 configs=1) b(tasks=2 configs=1) c(tasks=1 configs=1) live(tasks=1 configs=1) | rows of removed jobs: 0 | finished 3
            > tick 1
            job a succeeded deleted (retention)
            > jobs
            jobs: b=failed c=succeeded live=running | stored: b(tasks=2 configs=1) c(tasks=1 configs=1) live(tasks=1 configs=1) | rows of removed jobs: 0 | finished 2
            > tick 8998
            > jobs
            jobs: b=failed c=succeeded live=running | stored: b(tasks=2 configs=1) c(tasks=1 configs=1) live(tasks=1 configs=1) | rows of removed jobs: 0 | finished 2
            > tick 1
            job b failed deleted (retention)
            > jobs
            jobs: c=succeeded live=running | stored: c(tasks=1 configs=1) live(tasks=1 configs=1) | rows of removed jobs: 0 | finished 1
            > crash
            > register h1
            > jobs
            jobs: c=succeeded live=running | stored: c(tasks=1 configs=1) live(tasks=1 configs=1) | rows of removed jobs: 0 | finished 1
            > tick 100000
            job c succeeded deleted (retention)
            > jobs
            jobs: live=running | stored: live(tasks=1 configs=1) | rows of removed jobs: 0 | finished 0
            > kill live
            live/0#1 killed @h1 (job killed)
            job live killing
              kill live/0#1 @h1
            > confirm
            job live killed
            > tick 9999
            > jobs
            jobs: live=killed | stored: live(tasks=1 configs=1) | rows of removed jobs: 0 | finished 1
            > tick 1
            job live killed deleted (retention)
            > jobs
            jobs:  | stored:  | rows of removed jobs: 0 | finished 0
        "#]],
    );
}

#[test]
fn retention_removes_a_large_backlog_in_chunks() {
    let mut sim = Sim::with_config(CoreConfig {
        retention_ms: u64::MAX / 2,
        max_finished_jobs: 100,
        ..crate::sim::config()
    });
    sim.quiet = true;
    sim.add_host("h1", 64, 64 * 1024).expect("host");
    let n = 2 * retention::RETENTION_CHUNK + 500;
    for j in 0..n {
        let id = format!("j{j:05}");
        sim.step(Input::CreateJob {
            id: id.as_str().into(),
            plan: Box::new(plan("/", 1, 10)),
        })
        .expect("created");
        sim.step(Input::JobAction {
            id,
            version: 0,
            action: JobAction::Kill,
        })
        .expect("killed");
    }
    assert_eq!(sim.core.n_finished_jobs(), n);
    // Beyond the count: due now.
    assert_eq!(sim.core.next_deadline(), Some(sim.now));
    let mut removed = Vec::new();
    while sim.core.n_finished_jobs() > 100 {
        let before = sim.core.n_jobs();
        sim.step(Input::Tick).expect("tick");
        removed.push(before - sim.core.n_jobs());
    }
    assert_eq!(removed, [1000, 1000, 400]);
    // The oldest went: the newest 100 are left.
    let left: Vec<String> = sim
        .core
        .jobs_by_id("")
        .map(|(_, j)| j.id.to_string())
        .collect();
    assert_eq!(left.first().map(String::as_str), Some("j02400"));
    assert_eq!(left.len(), 100);
    assert_eq!(sim.store.jobs.len(), 100);
    assert_eq!(sim.engine.tasks().len(), 0);
    // Nothing is due until the oldest left reaches its age.
    assert_eq!(sim.core.next_deadline(), Some(sim.now + u64::MAX / 2));
}

/// Random jobs, runs, kills, restarts (a finished job may run again),
/// deletes, crashes and time on a core with a short retention: after every
/// step the invariants hold (the finished index among them); a job that
/// was not finished is never removed; after a tick no finished job is older
/// than the retention and at most `max` are kept.
#[test]
fn retention_under_random_operations_removes_only_finished_jobs() {
    const RETENTION_MS: u64 = 50;
    const MAX: usize = 3;
    let mut removed = 0;
    for seed in 0..20u64 {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut sim = Sim::with_config(CoreConfig {
            retention_ms: RETENTION_MS,
            max_finished_jobs: MAX,
            ..crate::sim::config()
        });
        sim.quiet = true;
        sim.add_host("h1", 16, 16 * 1024).expect("host");
        let mut ids: Vec<String> = Vec::new();
        for step in 0..400 {
            let live_before: Vec<String> = sim
                .core
                .jobs_by_id("")
                .filter(|(_, j)| !j.state.is_terminal())
                .map(|(_, j)| j.id.to_string())
                .collect();
            let pick = |ids: &[String], r: u64| ids[r as usize % ids.len()].clone();
            let mut ticked = false;
            match next(10) {
                0 | 1 => {
                    let id = format!("j{step}");
                    let _ = sim.step(Input::CreateJob {
                        id: id.as_str().into(),
                        plan: Box::new(plan("/", 1 + next(3) as u32, 1000)),
                    });
                    ids.push(id);
                }
                2 | 3 if !ids.is_empty() => {
                    let id = pick(&ids, next(1000));
                    if let Some((host, key)) = sim.current(&id, next(3) as u32) {
                        let code = next(2) as i32;
                        let phase = if code == 0 {
                            RunPhase::Succeeded
                        } else {
                            RunPhase::Failed
                        };
                        sim.end_run(&host, key.launch, phase, code);
                    }
                }
                4 if !ids.is_empty() => {
                    let action = match next(3) {
                        0 => JobAction::Kill,
                        1 => JobAction::Restart,
                        _ => JobAction::Delete,
                    };
                    let _ = sim.step(Input::JobAction {
                        id: pick(&ids, next(1000)),
                        version: 0,
                        action,
                    });
                }
                5 => sim.confirm_kills(None),
                6 if next(8) == 0 => {
                    sim.crash();
                    let _ = sim.register("h1");
                }
                7 => {
                    let _ = sim.step(Input::Cycle);
                }
                _ => {
                    sim.now += next(40);
                    let before = sim.core.n_jobs();
                    let _ = sim.step(Input::Tick);
                    removed += before - sim.core.n_jobs();
                    ticked = true;
                }
            }
            for id in &live_before {
                assert!(
                    sim.core.job_key(id).is_ok(),
                    "seed {seed} step {step}: job {id} was removed while not finished"
                );
            }
            if ticked {
                assert!(sim.core.n_finished_jobs() <= MAX, "seed {seed} step {step}");
                for (_, j) in sim.core.jobs_by_id("") {
                    if j.state.is_terminal() {
                        assert!(
                            j.completed_at + RETENTION_MS > sim.now,
                            "seed {seed} step {step}: {} is past its retention",
                            j.id
                        );
                    }
                }
            }
        }
    }
    assert!(removed > 100, "retention removed only {removed} jobs");
}

#[test]
fn work_that_could_never_be_admitted_is_refused_when_submitted() {
    check(
        r"
        host h1 cpu=8
        pool /a cpu=2 mem=1024
        job big pool=/a n=1 cpu=3             # non-preemptible above the reservation
        job gang pool=/a n=4 gang=2 cpu=2     # a gang of 2 × 2 cores above it
        job huge pool=/a n=1 cpu=9 preemptible  # no host could ever hold it
        job ok pool=/a n=2 cpu=1
        scale ok 3                            # one more task of 1 core is fine
        job p pool=/a n=1 cpu=3 preemptible   # preemptible work may borrow
        ",
        expect![[r#"
            > host h1 cpu=8
            > pool /a cpu=2 mem=1024
            > job big pool=/a n=1 cpu=3
            error: spec.default_task.resources.cpu: each task needs 3 cores, and could never be admitted: pool /a's reservation of cpu is 2 cores (non-preemptible work runs only within its pool's reservation: raise it, or make the job preemptible (sla.preemptible))
            > job gang pool=/a n=4 gang=2 cpu=2
            error: spec.sla.min_running_instances: a gang of 2 tasks (instances 0–1) needs 4 cores in all, and could never be admitted (or use smaller gangs): pool /a's reservation of cpu is 2 cores (non-preemptible work runs only within its pool's reservation: raise it, or make the job preemptible (sla.preemptible))
            > job huge pool=/a n=1 cpu=9 preemptible
            error: spec.default_task.resources.cpu: no host of the cluster could ever hold a task of cpu 9 cores, memory 64 MiB (the largest capacities are cpu 8 cores, memory 4096 MiB)
            > job ok pool=/a n=2 cpu=1
            ok/0#1 pending
            ok/1#1 pending
            job ok pending
            > scale ok 3
            ok/2#1 pending
            > job p pool=/a n=1 cpu=3 preemptible
            p/0#1 pending
            job p pending
        "#]],
    );
}

#[test]
fn an_agent_that_blinks_keeps_its_hosts_capacity_and_nothing_is_preempted() {
    // Two hosts full of one pool's preemptible work. h2's agent loses its
    // session (restarting): h2 takes no new work, but its tasks still hold
    // what they hold, so the pool's entitlement does not shrink under them
    // — nothing is preempted, on h2 or on the healthy h1. Its agent comes
    // back with its runs: kept as they were. Only a host declared lost
    // gives its runs up.
    check(
        r"
        host h1 cpu=2
        host h2 cpu=2
        job j pool=/ n=4 cpu=1 preemptible
        cycle
        disconnect h2
        cycle
        tick 5000
        cycle
        job more pool=/ n=1 cpu=1
        cycle          # no room: h2's unused rest is not offered either
        register h2
        cycle
        disconnect h2
        lost-host h2
        cycle
        ",
        expect![[r#"
            > host h1 cpu=2
            > host h2 cpu=2
            > job j pool=/ n=4 cpu=1 preemptible
            j/0#1 pending
            j/1#1 pending
            j/2#1 pending
            j/3#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/1#1 ready
            j/2#1 ready
            j/3#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
            j/1#1 placed @h1
            j/1#1 launching @h1
            j/2#1 placed @h2
            j/2#1 launching @h2
            j/3#1 placed @h2
            j/3#1 launching @h2
              launch j/0#1 @h1 config 1
              launch j/1#1 @h1 config 1
              launch j/2#1 @h2 config 1
              launch j/3#1 @h2 config 1
            j/0#1 running @h1
            j/1#1 running @h1
            job j running
            j/2#1 running @h2
            j/3#1 running @h2
            > disconnect h2
            > cycle
            > tick 5000
            > cycle
            > job more pool=/ n=1 cpu=1
            more/0#1 pending
            job more pending
            > cycle
            > register h2
            > cycle
            > disconnect h2
            > lost-host h2
            j/2#1 lost @h2 (host h2 lost: no heartbeat for 10000 ms)
            j/2#2 initialized
            j/3#1 lost @h2 (host h2 lost: no heartbeat for 10000 ms)
            j/3#2 initialized
            j/2#2 pending
            j/3#2 pending
            > cycle
        "#]],
    );
}

#[test]
fn a_host_is_bound_to_its_agent_until_it_is_lost() {
    // Another agent given h1's name (another work directory, so another
    // identity) is refused while h1 is not lost — even while h1's own
    // agent is away restarting — and nothing of h1 changes; h1's agent
    // comes back to its runs. Once h1 is declared lost the other agent may
    // take the name (the runs were lost and started again).
    check(
        r"
        host h1 cpu=2
        host h2 cpu=2
        job j pool=/ n=1 cpu=1
        cycle
        twin h1
        disconnect h1
        twin h1
        cycle
        register h1
        cycle
        disconnect h1
        lost-host h1
        twin h1
        cycle
        ",
        expect![[r#"
            > host h1 cpu=2
            > host h2 cpu=2
            > job j pool=/ n=1 cpu=1
            j/0#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
              launch j/0#1 @h1 config 1
            j/0#1 running @h1
            job j running
            > twin h1
            error: host h1 belongs to another agent (agent id "agent-h1") and is not lost; this agent (agent id "twin-of-h1") may take it only once that one has stayed away past the host-lost timeout — give each agent its own --host
            > disconnect h1
            > twin h1
            error: host h1 belongs to another agent (agent id "agent-h1") and is not lost; this agent (agent id "twin-of-h1") may take it only once that one has stayed away past the host-lost timeout — give each agent its own --host
            > cycle
            > register h1
            > cycle
            > disconnect h1
            > lost-host h1
            j/0#1 lost @h1 (host h1 lost: no heartbeat for 10000 ms)
            j/0#2 initialized
            j/0#2 pending
            job j pending
            > twin h1
            > cycle
            j/0#2 ready
            j/0#2 placed @h1
            j/0#2 launching @h1
              launch j/0#2 @h1 config 1
        "#]],
    );
}

#[test]
fn a_preempted_run_that_exited_0_before_the_kill_keeps_its_result() {
    // low/0 is chosen as a victim, but its host reports that it exited 0
    // by itself before the kill reached it: it is SUCCEEDED, and no second
    // run of finished work is started. (A victim that was killed starts
    // again, as before.)
    check(
        r"
        host h1 cpu=2
        host h2 cpu=2
        job low pool=/ n=2 cpu=1 preemptible priority=1 per_host=1
        cycle
        job high pool=/ n=1 cpu=2 preemptible priority=5
        cycle          # low/0 is evicted from h1
        exit low/0 0   # ... but had finished by itself
        cycle
        exit low/1 0
        ",
        expect![[r#"
            > host h1 cpu=2
            > host h2 cpu=2
            > job low pool=/ n=2 cpu=1 preemptible priority=1 per_host=1
            low/0#1 pending
            low/1#1 pending
            job low pending
            > cycle
            low/0#1 ready
            low/1#1 ready
            low/0#1 placed @h1
            low/0#1 launching @h1
            low/1#1 placed @h2
            low/1#1 launching @h2
              launch low/0#1 @h1 config 1
              launch low/1#1 @h2 config 1
            low/0#1 running @h1
            job low running
            low/1#1 running @h2
            > job high pool=/ n=1 cpu=2 preemptible priority=5
            high/0#1 pending
            job high pending
            > cycle
            high/0#1 ready
            high/0#1 placing
            low/0#1 preempted @h1 (preempted: a higher-priority task of its pool (high/0) needs room on host h1; lost work: 0 ms since its start)
              kill low/0#1 @h1
            > exit low/0 0
            low/0#1 succeeded @h1 (exited 0 before its preemption reached it: its result stands)
            > cycle
            high/0#1 placed @h1
            high/0#1 launching @h1
              launch high/0#1 @h1 config 1
            high/0#1 running @h1
            job high running
            > exit low/1 0
            low/1#1 succeeded @h2
            job low succeeded
        "#]],
    );
}

#[test]
fn a_batch_jobs_controller_instance_is_queued_and_capped_as_a_controller() {
    // Instance 0 alone goes to the controller queue; a pool's first
    // controller runs whatever the limit, a second waits for room under it
    // while the workers of both jobs run.
    check(
        r"
        host h1 cpu=8
        pool /p controller_limit=10
        job a pool=/p n=2 cpu=1 preemptible controller
        job b pool=/p n=2 cpu=1 preemptible controller
        queue /p
        cycle
        task b/0
        exit a/0 0
        confirm
        cycle
        task b/0
        ",
        expect![[r#"
            > host h1 cpu=8
            > pool /p controller_limit=10
            > job a pool=/p n=2 cpu=1 preemptible controller
            a/0#1 pending
            a/1#1 pending
            job a pending
            > job b pool=/p n=2 cpu=1 preemptible controller
            b/0#1 pending
            b/1#1 pending
            job b pending
            > queue /p
              queue /p: a/0 controller, a/1 normal, b/0 controller, b/1 normal
            > cycle
            a/0#1 ready
            a/1#1 ready
            b/1#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
            a/1#1 placed @h1
            a/1#1 launching @h1
            b/1#1 placed @h1
            b/1#1 launching @h1
              launch a/0#1 @h1 config 1
              launch a/1#1 @h1 config 1
              launch b/1#1 @h1 config 1
            a/0#1 running @h1
            a/1#1 running @h1
            b/1#1 running @h1
            job a running
            job b running
            > task b/0
              b/0#1 pending started 0 finished 0
            > exit a/0 0
            a/0#1 succeeded @h1
            a/1#1 killed @h1 (the job's controller task (instance 0) succeeded)
              kill a/1#1 @h1
            > confirm
            job a succeeded
            > cycle
            b/0#1 ready
            b/0#1 placed @h1
            b/0#1 launching @h1
              launch b/0#1 @h1 config 1
            b/0#1 running @h1
            > task b/0
              b/0#1 running started 0 finished 0
        "#]],
    );
}

#[test]
fn a_controller_that_succeeds_stops_the_others_and_the_job_succeeds() {
    check(
        r"
        host h1 cpu=4
        job j pool=/ n=3 cpu=1 controller
        cycle
        exit j/0 0    # the workers still run: they are stopped
        crash         # what the store holds says so too
        register h1
        confirm
        task j/1
        ",
        expect![[r#"
            > host h1 cpu=4
            > job j pool=/ n=3 cpu=1 controller
            j/0#1 pending
            j/1#1 pending
            j/2#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/1#1 ready
            j/2#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
            j/1#1 placed @h1
            j/1#1 launching @h1
            j/2#1 placed @h1
            j/2#1 launching @h1
              launch j/0#1 @h1 config 1
              launch j/1#1 @h1 config 1
              launch j/2#1 @h1 config 1
            j/0#1 running @h1
            j/1#1 running @h1
            j/2#1 running @h1
            job j running
            > exit j/0 0
            j/0#1 succeeded @h1
            j/1#1 killed @h1 (the job's controller task (instance 0) succeeded)
            j/2#1 killed @h1 (the job's controller task (instance 0) succeeded)
              kill j/1#1 @h1
              kill j/2#1 @h1
            > crash
            > register h1
              kill j/1#1 @h1
              kill j/2#1 @h1
            > confirm
            job j succeeded
            > task j/1
              j/1#1 killed started 0 finished 0
        "#]],
    );
}

#[test]
fn a_controller_decides_the_jobs_end_whatever_its_workers_did() {
    // Peloton's test_job_succecced_controller_task: the workers fail, the
    // controller succeeds, the job succeeds.
    check(
        r"
        host h1 cpu=4
        job j pool=/ n=3 cpu=1 controller
        cycle
        exit j/1 1
        exit j/2 1
        exit j/0 0
        ",
        expect![[r#"
            > host h1 cpu=4
            > job j pool=/ n=3 cpu=1 controller
            j/0#1 pending
            j/1#1 pending
            j/2#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/1#1 ready
            j/2#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
            j/1#1 placed @h1
            j/1#1 launching @h1
            j/2#1 placed @h1
            j/2#1 launching @h1
              launch j/0#1 @h1 config 1
              launch j/1#1 @h1 config 1
              launch j/2#1 @h1 config 1
            j/0#1 running @h1
            j/1#1 running @h1
            j/2#1 running @h1
            job j running
            > exit j/1 1
            j/1#1 failed @h1 (exited with code 1)
            > exit j/2 1
            j/2#1 failed @h1 (exited with code 1)
            > exit j/0 0
            j/0#1 succeeded @h1
            job j succeeded
        "#]],
    );
}

#[test]
fn a_controller_that_fails_for_good_stops_the_others_and_the_job_fails() {
    // A failure it retries stops nothing; the one it gives up on does.
    check(
        r"
        host h1 cpu=4
        job j pool=/ n=2 cpu=1 controller max_failures=1 backoff=1000
        cycle
        exit j/0 3
        tick 1000
        cycle
        exit j/0 3
        confirm
        ",
        expect![[r#"
            > host h1 cpu=4
            > job j pool=/ n=2 cpu=1 controller max_failures=1 backoff=1000
            j/0#1 pending
            j/1#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/1#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
            j/1#1 placed @h1
            j/1#1 launching @h1
              launch j/0#1 @h1 config 1
              launch j/1#1 @h1 config 1
            j/0#1 running @h1
            j/1#1 running @h1
            job j running
            > exit j/0 3
            j/0#1 failed @h1 (exited with code 3)
            j/0#1 backoff @h1 (exited with code 3)
            > tick 1000
            j/0#2 initialized
            j/0#2 pending
            > cycle
            j/0#2 ready
            j/0#2 placed @h1
            j/0#2 launching @h1
              launch j/0#2 @h1 config 1
            j/0#2 running @h1
            > exit j/0 3
            j/0#2 failed @h1 (exited with code 3)
            j/1#1 killed @h1 (the job's controller task (instance 0) failed)
              kill j/1#1 @h1
            > confirm
            job j failed
        "#]],
    );
}

#[test]
fn killing_the_controller_instance_kills_the_job() {
    check(
        r"
        host h1 cpu=4
        job j pool=/ n=2 cpu=1 controller
        cycle
        kill j/0
        confirm
        ",
        expect![[r#"
            > host h1 cpu=4
            > job j pool=/ n=2 cpu=1 controller
            j/0#1 pending
            j/1#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/1#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
            j/1#1 placed @h1
            j/1#1 launching @h1
              launch j/0#1 @h1 config 1
              launch j/1#1 @h1 config 1
            j/0#1 running @h1
            j/1#1 running @h1
            job j running
            > kill j/0
            j/0#1 killed @h1 (killed by request)
            j/1#1 killed @h1 (the job's controller task (instance 0) killed)
              kill j/0#1 @h1
              kill j/1#1 @h1
            > confirm
            job j killed
        "#]],
    );
}

#[test]
fn a_launch_that_never_reached_its_agent_is_sent_again_when_it_registers() {
    // h1's session breaks before the server hears of it (as when a lapsed
    // lease ends every session while the store cannot write, and the
    // launches committed before go out once it can): the launch of j/0 is
    // lost with the session. Its agent registers again without the run,
    // which never started: the same launch goes again, the run stays run
    // 1, nothing is lost. The same after a restart of the server between
    // the commit and the send (k/0, recovered as an orphan).
    check(
        r"
        host h1 cpu=4
        job j pool=/ n=1 cpu=1
        cut h1
        cycle            # the launch is lost with the session
        disconnect h1
        register h1      # sent again
        job k pool=/ n=1 cpu=1
        cut h1
        cycle
        crash
        register h1      # j/0 is there; k/0 is sent again
        ",
        expect![[r#"
            > host h1 cpu=4
            > job j pool=/ n=1 cpu=1
            j/0#1 pending
            job j pending
            > cut h1
            > cycle
            j/0#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
              launch j/0#1 @h1 config 1
            > disconnect h1
            > register h1
              launch j/0#1 @h1 config 1
            j/0#1 running @h1
            job j running
            > job k pool=/ n=1 cpu=1
            k/0#1 pending
            job k pending
            > cut h1
            > cycle
            k/0#1 ready
            k/0#1 placed @h1
            k/0#1 launching @h1
              launch k/0#1 @h1 config 1
            > crash
            > register h1
              launch k/0#1 @h1 config 1
            k/0#1 running @h1
            job k running
        "#]],
    );
}

#[test]
fn host_pools_partition_the_hosts_and_moving_a_host_with_runs_needs_force() {
    check(
        "
        hostpool create gpu
        hostpool create gpu            # exists
        host h1 cpu=4
        host h2 cpu=4
        hostpools
        job g pool=/ n=1 cpu=1 host_pool=gpu
        job d pool=/ n=1 cpu=1
        job x pool=/ n=1 cpu=1 host_pool=nope
        cycle                          # g waits: no host in gpu
        move gpu h2 nope               # all or nothing
        move nowhere h2
        move gpu h2
        cycle
        move gpu h1                    # d runs on h1: refused
        move gpu h1 --force            # d's run stops; it waits for a default host
        confirm
        hostpools
        hostpool delete default
        hostpool delete nope
        hostpool delete gpu            # has hosts
        move default h1                # nothing of another pool runs there
        cycle                          # d runs on h1 again
        move default h1 h2             # g runs on h2: refused, nothing moves
        move default h2 --force        # g waits for a host in gpu
        confirm
        hostpool delete gpu            # g still names it
        kill g
        crash
        hostpools
        register h1
        register h2
        hostpool delete gpu
        hostpools
        ",
        expect![[r#"
            > hostpool create gpu
              row host pool gpu
            > hostpool create gpu
            error: host pool "gpu" already exists
            > host h1 cpu=4
            > host h2 cpu=4
            > hostpools
              host pools: gpu | members:  | tags: h1=default h2=default | stored: gpu 
            > job g pool=/ n=1 cpu=1 host_pool=gpu
            g/0#1 pending
            job g pending
            > job d pool=/ n=1 cpu=1
            d/0#1 pending
            job d pending
            > job x pool=/ n=1 cpu=1 host_pool=nope
            error: spec.host_pool: host pool "nope" does not exist (create it with `peloton hostpool create`)
            > cycle
            g/0#1 ready
            d/0#1 ready
            d/0#1 placed @h1
            d/0#1 launching @h1
            g/0#1 placing
              launch d/0#1 @h1 config 1
            d/0#1 running @h1
            job d running
            > move gpu h2 nope
            error: host nope not found
            > move nowhere h2
            error: host pool "nowhere" not found
            > move gpu h2
              row host h2 in gpu
            > cycle
            g/0#1 placed @h2
            g/0#1 launching @h2
              launch g/0#1 @h2 config 1
            g/0#1 running @h2
            job g running
            > move gpu h1
            error: 1 task(s) of jobs outside host pool "gpu" run on these hosts: h1 (1); a move with force stops those tasks (they start again in their own host pools), or drain the hosts first
            > move gpu h1 --force
              row host h1 in gpu
            d/0#1 preempted @h1 (host h1 moved to host pool gpu; lost work: 0 ms since its start)
            job d pending
              kill d/0#1 @h1
            > confirm
            d/0#2 initialized
            d/0#2 pending
            > hostpools
              host pools: gpu | members: h1=gpu h2=gpu | tags: h1=gpu h2=gpu | stored: gpu h1=gpu h2=gpu
            > hostpool delete default
            error: host pool "default" cannot be deleted
            > hostpool delete nope
            error: host pool "nope" not found
            > hostpool delete gpu
            error: host pool "gpu" still has 2 host(s) (h1, h2); move them to another host pool first
            > move default h1
              row host h1 in default
            > cycle
            d/0#2 ready
            d/0#2 placed @h1
            d/0#2 launching @h1
              launch d/0#2 @h1 config 1
            d/0#2 running @h1
            job d running
            > move default h1 h2
            error: 1 task(s) of jobs outside host pool "default" run on these hosts: h2 (1); a move with force stops those tasks (they start again in their own host pools), or drain the hosts first
            > move default h2 --force
              row host h2 in default
            g/0#1 preempted @h2 (host h2 moved to host pool default; lost work: 0 ms since its start)
            job g pending
              kill g/0#1 @h2
            > confirm
            g/0#2 initialized
            g/0#2 pending
            > hostpool delete gpu
            error: host pool "gpu" is named by job g which is not terminal
            > kill g
            g/0#2 killed (job killed)
            job g killed
            > crash
            > hostpools
              host pools: gpu | members:  | tags: h1=default h2=default | stored: gpu 
            > register h1
            > register h2
            > hostpool delete gpu
              row host pool gpu deleted
            > hostpools
              host pools:  | members:  | tags: h1=default h2=default | stored:  
        "#]],
    );
}

#[test]
fn host_pools_survive_a_restart_and_an_agent_cannot_name_its_own() {
    check(
        "
        hostpool create a
        host h1 cpu=4
        move a h1
        crash
        hostpools
        register h1
        hostpools
        ",
        expect![[r#"
            > hostpool create a
              row host pool a
            > host h1 cpu=4
            > move a h1
              row host h1 in a
            > crash
            > hostpools
              host pools: a | members: h1=a | tags: h1=a | stored: a h1=a
            > register h1
            > hostpools
              host pools: a | members: h1=a | tags: h1=a | stored: a h1=a
        "#]],
    );
    let mut sim = Sim::new();
    let mut spec = crate::sim::host_spec("h9", 4, 4096);
    spec.attributes
        .push((HOST_POOL_ATTRIBUTE.into(), "default".into()));
    let e = sim.add_host_spec(spec).unwrap_err();
    assert_eq!(
        e.to_string(),
        "register.attributes.peloton.host_pool: is set by the server from the host's host pool; an agent may not set it"
    );
    assert!(sim.engine.hosts().lookup("h9").is_none());
}

#[test]
fn a_client_mode_application_whose_driver_goes_silent_is_unregistered() {
    check(
        "
        host h1 cpu=4
        app a
        target a 1
        cycle
        tick 30000
        heard a                 # the driver calls: the lease starts again
        tick 40000              # 70 s since it registered, 40 s since heard
        lease a
        crash                   # a restart gives the lease again
        register h1
        tick 59000
        lease a
        tick 2000               # 61 s silent: unregistered
        lease a
        confirm
        heard a                 # too late: no lease any more
        lease a
        ",
        expect![[r#"
            > host h1 cpu=4
            > app a
            job a pending
            > target a 1
            a/0#1 pending
            > cycle
            a/0#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
              launch a/0#1 @h1 config 1
            a/0#1 running @h1
            job a running
            > tick 30000
            > heard a
            > tick 40000
            > lease a
              lease a: heard 40000 ms ago
            > crash
            > register h1
            > tick 59000
            > lease a
              lease a: heard 59000 ms ago
            > tick 2000
            a/0#1 killed @h1 (the application's driver was not heard from for its lease; the application was unregistered)
              kill a/0#1 @h1
            > lease a
              lease a: none
            > confirm
            job a succeeded
            > heard a
            > lease a
              lease a: none
        "#]],
    );
}

#[test]
fn tokens_and_certificates_are_kept_and_published_after_their_commit() {
    check(
        "
        token create ci digest=7
        token create ci digest=8      # exists
        cert issue ci fp=1 until=1000
        cert issue ci fp=2 until=5000
        cert issue nope fp=3
        tick 2000                     # fp 1 expires
        cert issue ci fp=3 until=9000 # the expired one goes first
        cert revoke ci fp=9
        cert revoke ci fp=2
        access
        crash
        access
        token revoke ci
        token revoke ci
        access
        ",
        expect![[r#"
            > token create ci digest=7
              access: token ci created
              row token ci certificates=0
            > token create ci digest=8
            error: token ci already exists (revoke it first)
            > cert issue ci fp=1 until=1000
              access: certificate 01 of 07 until 1000
              row token ci certificates=1
            > cert issue ci fp=2 until=5000
              access: certificate 02 of 07 until 5000
              row token ci certificates=2
            > cert issue nope fp=3
            error: token nope not found
            > tick 2000
            > cert issue ci fp=3 until=9000
              access: certificates removed: 01
              access: certificate 03 of 07 until 9000
              row token ci certificates=2
            > cert revoke ci fp=9
            error: token ci has no certificate 0909090909090909090909090909090909090909090909090909090909090909
            > cert revoke ci fp=2
              access: certificates removed: 02
              row token ci certificates=1
            > access
              tokens: ci[03] | audit (newest first):  | stored: 1 tokens, audit []
            > crash
            > access
              tokens: ci[03] | audit (newest first):  | stored: 1 tokens, audit []
            > token revoke ci
              access: token 07 revoked with 1 certificates
              row token ci deleted
            > token revoke ci
            error: token ci not found
            > access
              tokens:  | audit (newest first):  | stored: 0 tokens, audit []
        "#]],
    );
}

#[test]
fn the_audit_log_keeps_its_newest_entries_and_never_reuses_a_number() {
    check(
        "
        audit-bound max=3
        audit ci /a
        audit ci /b
        audit admin /c
        audit ci /d                   # the first goes
        access
        crash
        audit ci /e
        access
        ",
        expect![[r#"
            > audit-bound max=3
            > audit ci /a
              row audit 1 ci /a
            > audit ci /b
              row audit 2 ci /b
            > audit admin /c
              row audit 3 admin /c
            > audit ci /d
              row audit 4 ci /d
              row audit 1 deleted
            > access
              tokens:  | audit (newest first): 4:ci 3:admin 2:ci | stored: 0 tokens, audit [2, 3, 4]
            > crash
            > audit ci /e
              row audit 5 ci /e
              row audit 2 deleted
            > access
              tokens:  | audit (newest first): 5:ci 4:ci 3:admin | stored: 0 tokens, audit [3, 4, 5]
        "#]],
    );
}

#[test]
fn a_jobs_secrets_are_replaced_as_a_set_and_go_with_the_job() {
    check(
        "
        host h1 cpu=4
        job j pool=/ n=1 cpu=1
        secrets j a=1 b=2
        secrets j a= c=3          # a kept, b dropped
        show-secrets j
        secrets j d=              # nothing to keep: refused, nothing changes
        show-secrets j
        secrets nope a=1
        crash
        show-secrets j
        register h1
        cycle
        exit j/0 0
        delete j                  # its secrets and their row go with it
        ",
        expect![[r#"
            > host h1 cpu=4
            > job j pool=/ n=1 cpu=1
            j/0#1 pending
            job j pending
            > secrets j a=1 b=2
              row secrets j: a b
            > secrets j a= c=3
              row secrets j: a c
            > show-secrets j
              secrets j: a=1 c=3
            > secrets j d=
            error: spec.secrets[0].value: empty, and the job has no secret "d" to keep (an empty value keeps the current one in an update)
            > show-secrets j
              secrets j: a=1 c=3
            > secrets nope a=1
            error: job nope not found
            > crash
            > show-secrets j
              secrets j: a=1 c=3
            > register h1
            > cycle
            j/0#1 placed @h1
            j/0#1 launching @h1
              launch j/0#1 @h1 config 1
            j/0#1 running @h1
            job j running
            > exit j/0 0
            j/0#1 succeeded @h1
            job j succeeded
            > delete j
              row secrets j deleted
            job j succeeded deleted
        "#]],
    );
}

/// The new state's invariants are checked: a host whose host pool tag was
/// changed outside a step is caught.
#[test]
#[should_panic(expected = "carries its host pool")]
fn a_host_pool_tag_changed_outside_a_step_breaks_an_invariant() {
    let mut sim = Sim::new();
    sim.add_host("h1", 4, 4096).unwrap();
    let id = sim.engine.hosts().lookup("h1").unwrap();
    let mut spec = sim.engine.hosts().spec(id).unwrap();
    spec.attributes.retain(|(k, _)| k != HOST_POOL_ATTRIBUTE);
    spec.attributes
        .push((HOST_POOL_ATTRIBUTE.into(), "gpu".into()));
    sim.engine.hosts_mut().update(id, &spec).unwrap();
    sim.core.check_invariants(&sim.engine);
}

/// Only a host pool move sets the host pool attribute.
#[test]
fn the_host_pool_attribute_is_set_by_moves_only() {
    let mut sim = Sim::new();
    sim.add_host("h1", 4, 4096).unwrap();
    let e = sim
        .step(Input::SetHostAttribute {
            hosts: vec!["h1".into()],
            key: HOST_POOL_ATTRIBUTE.into(),
            value: "gpu".into(),
        })
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "attribute: peloton.host_pool is the host's host pool: move the host instead"
    );
}

#[test]
fn hosts_silent_past_the_timeout_are_lost_and_their_sessions_ended() {
    // The core decides from the last-heard times the shell hands it: h1 was
    // heard 1 s ago, h2 not since the server started (the start's slack is
    // long over), so h2 is lost, its run is queued again, and its session
    // is ended. A lost host is watched no more.
    check(
        r"
        host h1 cpu=2
        host h2 cpu=2
        job j pool=/ n=2 cpu=2
        cycle
        tick 30000
        agents-heard h1=29000
        cycle
        tick 1000
        agents-heard h1=30500
        ",
        expect![[r#"
            > host h1 cpu=2
            > host h2 cpu=2
            > job j pool=/ n=2 cpu=2
            j/0#1 pending
            j/1#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/1#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
            j/1#1 placed @h2
            j/1#1 launching @h2
              launch j/0#1 @h1 config 1
              launch j/1#1 @h2 config 1
            j/0#1 running @h1
            job j running
            j/1#1 running @h2
            > tick 30000
            > agents-heard h1=29000
            session of h2 ended
            j/1#1 lost @h2 (host h2 lost: no heartbeat for 10000 ms)
            j/1#2 initialized
            j/1#2 pending
            > cycle
            > tick 1000
            > agents-heard h1=30500
        "#]],
    );
}

#[test]
fn no_host_is_lost_while_agents_cannot_reach_the_server_and_they_get_slack_after() {
    // While this server does not lead, agents cannot reach it: their
    // silence does not count. When they can again, each gets the
    // reconnect slack (10 s) on top of the timeout (10 s) before it is
    // lost.
    check(
        r"
        host h1 cpu=2
        job j pool=/ n=1 cpu=1
        cycle
        reachable false
        tick 60000
        agents-heard
        reachable true
        tick 19000
        agents-heard
        tick 1500
        agents-heard
        ",
        expect![[r#"
            > host h1 cpu=2
            > job j pool=/ n=1 cpu=1
            j/0#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
              launch j/0#1 @h1 config 1
            j/0#1 running @h1
            job j running
            > reachable false
            > tick 60000
            > agents-heard
            > reachable true
            > tick 19000
            > agents-heard
            > tick 1500
            > agents-heard
            session of h1 ended
            j/0#1 lost @h1 (host h1 lost: no heartbeat for 10000 ms)
            j/0#2 initialized
            j/0#2 pending
            job j pending
        "#]],
    );
}

#[test]
fn a_host_held_by_a_live_session_is_taken_over_only_once_it_is_silent() {
    // An agent that sends no identity is bound by none, so only the session
    // keeps it off: it is refused while the holder's session was heard
    // within the takeover time (3 s), and takes the host once it was not;
    // the holder's own agent (same identity) always may.
    check(
        r"
        host h1 cpu=2
        tick 1000
        claim h1 holder=agent-h1 heard=500
        claim h1 agent=agent-h1 holder=agent-h1 heard=500
        tick 5000
        claim h1 holder=agent-h1 heard=500
        ",
        expect![[r#"
            > host h1 cpu=2
            > tick 1000
            > claim h1 holder=agent-h1 heard=500
            error: host h1 is held by another agent (agent id "agent-h1", connected, heard from 500 ms ago); this agent (agent id "") may take it only once that one has been silent for 3000 ms — give each agent its own --host
            > claim h1 agent=agent-h1 holder=agent-h1 heard=500
            > tick 5000
            > claim h1 holder=agent-h1 heard=500
        "#]],
    );
}

#[test]
fn cpu_use_is_the_rate_between_two_readings_and_writes_nothing() {
    check(
        r"
        host h1 cpu=4
        job j pool=/ n=2 cpu=2 mem=1024
        cycle
        used j/0                       # nothing reported yet
        usage h1 t=1000 j/0=500:100 j/1=0:10
        used j/0                       # one reading: the average since it started
        # 10 s later: j/0 used 10 s of CPU (one core), j/1 2.5 s.
        usage h1 t=11000 j/0=10500:200 j/1=2500:10
        used j/0
        used j/1
        used j
        used @h1
        ",
        expect![[r#"
            > host h1 cpu=4
            > job j pool=/ n=2 cpu=2 mem=1024
            j/0#1 pending
            j/1#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/1#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
            j/1#1 placed @h1
            j/1#1 launching @h1
              launch j/0#1 @h1 config 1
              launch j/1#1 @h1 config 1
            j/0#1 running @h1
            j/1#1 running @h1
            job j running
            > used j/0
              used j/0: none
            > usage h1 t=1000 j/0=500:100 j/1=0:10
            > used j/0
              used j/0: cpu=500m mem=100MiB peak=100MiB
            > usage h1 t=11000 j/0=10500:200 j/1=2500:10
            > used j/0
              used j/0: cpu=1000m mem=200MiB peak=200MiB
            > used j/1
              used j/1: cpu=250m mem=10MiB peak=10MiB
            > used j
              used j: cpu=1250m mem=210MiB peak=210MiB
            > used @h1
              used @h1: cpu=1250m mem=210MiB peak=210MiB
        "#]],
    );
}

#[test]
fn the_memory_peak_decays_by_half_every_half_life() {
    check(
        r"
        host h1 cpu=4
        job j pool=/ n=1 cpu=1
        cycle
        usage h1 t=0 j/0=0:100
        usage h1 t=10000 j/0=0:900      # a spike: the peak rises at once
        used j/0
        usage h1 t=40000 j/0=0:100      # one half-life later
        used j/0
        usage h1 t=70000 j/0=0:100      # two
        used j/0
        usage h1 t=80000 j/0=0:500      # a smaller spike lifts it again
        used j/0
        used @h1
        ",
        expect![[r#"
            > host h1 cpu=4
            > job j pool=/ n=1 cpu=1
            j/0#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
              launch j/0#1 @h1 config 1
            j/0#1 running @h1
            job j running
            > usage h1 t=0 j/0=0:100
            > usage h1 t=10000 j/0=0:900
            > used j/0
              used j/0: cpu=0m mem=900MiB peak=900MiB
            > usage h1 t=40000 j/0=0:100
            > used j/0
              used j/0: cpu=0m mem=100MiB peak=500MiB
            > usage h1 t=70000 j/0=0:100
            > used j/0
              used j/0: cpu=0m mem=100MiB peak=300MiB
            > usage h1 t=80000 j/0=0:500
            > used j/0
              used j/0: cpu=0m mem=500MiB peak=500MiB
            > used @h1
              used @h1: cpu=0m mem=500MiB peak=500MiB
        "#]],
    );
}

#[test]
fn usage_of_unknown_or_ended_runs_is_ignored_and_an_ended_run_stops_counting() {
    check(
        r"
        host h1 cpu=4
        host h2 cpu=4
        job j pool=/ n=2 cpu=3
        cycle
        usage h1 t=1000 j/0=0:100 j/1=0:100 ghost/0=0:999
        usage h2 t=1000 j/0=0:100 j/1=0:100
        used @h1
        used @h2
        exit j/0 0
        used j/0                      # ended: gone at once
        used @h1
        usage h1 t=2000 j/0=1000:100  # its agent still lists it: ignored
        used j/0
        used @h1
        ",
        expect![[r#"
            > host h1 cpu=4
            > host h2 cpu=4
            > job j pool=/ n=2 cpu=3
            j/0#1 pending
            j/1#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/1#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
            j/1#1 placed @h2
            j/1#1 launching @h2
              launch j/0#1 @h1 config 1
              launch j/1#1 @h2 config 1
            j/0#1 running @h1
            job j running
            j/1#1 running @h2
            > usage h1 t=1000 j/0=0:100 j/1=0:100 ghost/0=0:999
            > usage h2 t=1000 j/0=0:100 j/1=0:100
            > used @h1
              used @h1: cpu=0m mem=100MiB peak=100MiB
            > used @h2
              used @h2: cpu=0m mem=100MiB peak=100MiB
            > exit j/0 0
            j/0#1 succeeded @h1
            > used j/0
              used j/0: none
            > used @h1
              used @h1: cpu=0m mem=0MiB peak=100MiB
            > usage h1 t=2000 j/0=1000:100
            > used j/0
              used j/0: none
            > used @h1
              used @h1: cpu=0m mem=0MiB peak=97MiB
        "#]],
    );
}

#[test]
fn a_first_reading_gives_the_average_since_the_run_started() {
    check(
        r"
        host h1 cpu=4
        tick 1000
        job j pool=/ n=1 cpu=2
        cycle                           # j/0 starts at 1000
        task j/0
        usage h1 t=11000 j/0=5000:100   # 5 s of CPU in the 10 s since
        used j/0
        ",
        expect![[r#"
            > host h1 cpu=4
            > tick 1000
            > job j pool=/ n=1 cpu=2
            j/0#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
              launch j/0#1 @h1 config 1
            j/0#1 running @h1
            job j running
            > task j/0
              j/0#1 running started 1000 finished 0
            > usage h1 t=11000 j/0=5000:100
            > used j/0
              used j/0: cpu=500m mem=100MiB peak=100MiB
        "#]],
    );
}

#[test]
fn revocable_work_runs_on_what_services_do_not_use_and_gives_it_back_when_they_do() {
    // A service reserves 6 of 8 cores and 6 GiB of 8 but uses 1 core and
    // 1 GiB: the host lends the rest less the margins (10 % of its CPU
    // allocation, 20 % of its memory). Two revocable 2-core tasks run: one
    // on the free cores, one on borrowed ones. The service's use rises to
    // 5 cores: one revocable task is preempted (the youngest, then by
    // instance), the service is untouched, and the preempted one waits
    // again. Its end repays the loan.
    check(
        r"
        host h1 cpu=8 mem=8192
        job svc pool=/ n=1 cpu=6 mem=6144 service
        cycle
        usage h1 t=1000 svc/0=0:1024
        usage h1 t=11000 svc/0=10000:1024
        lends h1
        job batch pool=/ n=2 cpu=2 mem=1024 revocable
        cycle
        lends h1
        usage h1 t=21000 svc/0=60000:1024 batch/0=10000:512 batch/1=10000:512
        lends h1
        confirm
        lends h1
        cycle
        ",
        expect![[r#"
            > host h1 cpu=8 mem=8192
            > job svc pool=/ n=1 cpu=6 mem=6144 service
            svc/0#1 pending
            job svc pending
            > cycle
            svc/0#1 ready
            svc/0#1 placed @h1
            svc/0#1 launching @h1
              launch svc/0#1 @h1 config 1
            svc/0#1 running @h1
            job svc running
            > usage h1 t=1000 svc/0=0:1024
            > usage h1 t=11000 svc/0=10000:1024
            > lends h1
              h1 lends cpu=4400 mem=3892, borrowed cpu=0 mem=0, free cpu=2000 mem=2048
            > job batch pool=/ n=2 cpu=2 mem=1024 revocable
            batch/0#1 pending
            batch/1#1 pending
            job batch pending
            > cycle
            batch/0#1 ready
            batch/1#1 ready
            batch/0#1 placed @h1
            batch/0#1 launching @h1
            batch/1#1 placed @h1
            batch/1#1 launching @h1
              launch batch/0#1 @h1 config 1
              launch batch/1#1 @h1 config 1
            batch/0#1 running @h1
            batch/1#1 running @h1
            job batch running
            > lends h1
              h1 lends cpu=4400 mem=3892, borrowed cpu=2000 mem=0, free cpu=0 mem=0
            > usage h1 t=21000 svc/0=60000:1024 batch/0=10000:512 batch/1=10000:512
            batch/0#1 preempted @h1 (preempted: revocable, and host h1's non-revocable tasks need the CPU it ran on; lost work: 0 ms since its start)
              kill batch/0#1 @h1
              rows: 2, events: 1
            > lends h1
              h1 lends cpu=400 mem=3892, borrowed cpu=2000 mem=0, free cpu=0 mem=0
            > confirm
            batch/0#2 initialized
            batch/0#2 pending
            > lends h1
              h1 lends cpu=400 mem=3892, borrowed cpu=0 mem=0, free cpu=0 mem=1024
            > cycle
        "#]],
    );
}

#[test]
fn a_non_revocable_task_takes_back_the_room_revocable_work_borrowed() {
    // The service uses little: a revocable task borrows its room. A new
    // non-revocable job of another pool and any priority that fits nowhere
    // else preempts the borrower, and runs once its end is confirmed; the
    // borrower comes back on what the service still lends.
    check(
        r"
        host h1 cpu=8 mem=8192
        pool /svc cpu=8
        pool /batch
        job svc pool=/svc n=1 cpu=6 mem=4096 service preemptible
        cycle
        usage h1 t=1000 svc/0=0:512
        usage h1 t=11000 svc/0=10000:512
        job batch pool=/batch n=1 cpu=4 mem=1024 revocable
        cycle
        lends h1
        job web pool=/svc n=1 cpu=2 mem=1024 preemptible
        cycle
        confirm
        cycle
        lends h1
        ",
        expect![[r#"
            > host h1 cpu=8 mem=8192
            > pool /svc cpu=8
            > pool /batch
            > job svc pool=/svc n=1 cpu=6 mem=4096 service preemptible
            svc/0#1 pending
            job svc pending
            > cycle
            svc/0#1 ready
            svc/0#1 placed @h1
            svc/0#1 launching @h1
              launch svc/0#1 @h1 config 1
            svc/0#1 running @h1
            job svc running
            > usage h1 t=1000 svc/0=0:512
            > usage h1 t=11000 svc/0=10000:512
            > job batch pool=/batch n=1 cpu=4 mem=1024 revocable
            batch/0#1 pending
            job batch pending
            > cycle
            batch/0#1 ready
            batch/0#1 placed @h1
            batch/0#1 launching @h1
              launch batch/0#1 @h1 config 1
            batch/0#1 running @h1
            job batch running
            > lends h1
              h1 lends cpu=4400 mem=2765, borrowed cpu=2000 mem=0, free cpu=0 mem=3072
            > job web pool=/svc n=1 cpu=2 mem=1024 preemptible
            web/0#1 pending
            job web pending
            > cycle
            web/0#1 ready
            web/0#1 placing
            batch/0#1 preempted @h1 (preempted: revocable, and web/0 (not revocable) needs the room revocable work holds on host h1; lost work: 0 ms since its start)
            job batch pending
              kill batch/0#1 @h1
            > confirm
            batch/0#2 initialized
            batch/0#2 pending
            > cycle
            batch/0#2 ready
            web/0#1 placed @h1
            web/0#1 launching @h1
            batch/0#2 placed @h1
            batch/0#2 launching @h1
              launch web/0#1 @h1 config 1
              launch batch/0#2 @h1 config 1
            web/0#1 running @h1
            batch/0#2 running @h1
            job batch running
            job web running
            > lends h1
              h1 lends cpu=4400 mem=2765, borrowed cpu=4000 mem=0, free cpu=0 mem=2048
        "#]],
    );
}

#[test]
fn the_qos_controller_preempts_a_revocable_run_not_started_yet_before_a_running_one() {
    // Two revocable 2-core tasks borrow from a service that uses 1 of its 6
    // cores: `old` runs, `new` was launched later and has not started (its
    // agent is slow). The service's use rises to 5 cores: one must go, and
    // the youngest is `new`, which has done no work yet; `old` keeps
    // running.
    check(
        r"
        host h1 cpu=8 mem=8192
        job svc pool=/ n=1 cpu=6 mem=6144 service
        cycle
        usage h1 t=1000 svc/0=0:1024
        usage h1 t=11000 svc/0=10000:1024
        job old pool=/ n=1 cpu=2 mem=1024 revocable
        cycle
        stall h1
        job new pool=/ n=1 cpu=2 mem=1024 revocable
        cycle
        lends h1
        usage h1 t=21000 svc/0=60000:1024 old/0=10000:512
        lends h1
        ",
        expect![[r#"
            > host h1 cpu=8 mem=8192
            > job svc pool=/ n=1 cpu=6 mem=6144 service
            svc/0#1 pending
            job svc pending
            > cycle
            svc/0#1 ready
            svc/0#1 placed @h1
            svc/0#1 launching @h1
              launch svc/0#1 @h1 config 1
            svc/0#1 running @h1
            job svc running
            > usage h1 t=1000 svc/0=0:1024
            > usage h1 t=11000 svc/0=10000:1024
            > job old pool=/ n=1 cpu=2 mem=1024 revocable
            old/0#1 pending
            job old pending
            > cycle
            old/0#1 ready
            old/0#1 placed @h1
            old/0#1 launching @h1
              launch old/0#1 @h1 config 1
            old/0#1 running @h1
            job old running
            > stall h1
            > job new pool=/ n=1 cpu=2 mem=1024 revocable
            new/0#1 pending
            job new pending
            > cycle
            new/0#1 ready
            new/0#1 placed @h1
            new/0#1 launching @h1
              launch new/0#1 @h1 config 1
            > lends h1
              h1 lends cpu=4400 mem=3892, borrowed cpu=2000 mem=0, free cpu=0 mem=0
            > usage h1 t=21000 svc/0=60000:1024 old/0=10000:512
            new/0#1 preempted @h1 (preempted: revocable, and host h1's non-revocable tasks need the CPU it ran on)
              kill new/0#1 @h1
              rows: 2, events: 1
            > lends h1
              h1 lends cpu=400 mem=3892, borrowed cpu=2000 mem=0, free cpu=0 mem=0
        "#]],
    );
}

#[test]
fn a_stopping_service_repays_what_revocable_work_borrowed_without_an_eviction() {
    // Two services of 3 cores each on 8: `svc` uses nothing, `svc2` one
    // core; the host lends 5 - 0.6 and two revocable 2-core tasks run, one
    // on borrowed cores. `svc` is killed: what it did not use is no longer
    // lent (1.4 cores left), but until its agent confirms the end it still
    // holds its 3 cores, whose release repays the loan first. A report in
    // between evicts nothing: no non-revocable use rose, and once `svc` is
    // gone both revocable tasks fit.
    check(
        r"
        host h1 cpu=8 mem=8192
        job svc pool=/ n=1 cpu=3 mem=3072 service
        job svc2 pool=/ n=1 cpu=3 mem=3072 service
        cycle
        usage h1 t=1000 svc/0=0:512 svc2/0=0:512
        usage h1 t=11000 svc/0=1000:512 svc2/0=10000:512
        job batch pool=/ n=2 cpu=2 mem=1024 revocable
        cycle
        lends h1
        kill svc
        lends h1
        usage h1 t=21000 svc2/0=20000:512 batch/0=10000:512 batch/1=10000:512
        lends h1
        confirm
        lends h1
        ",
        expect![[r#"
            > host h1 cpu=8 mem=8192
            > job svc pool=/ n=1 cpu=3 mem=3072 service
            svc/0#1 pending
            job svc pending
            > job svc2 pool=/ n=1 cpu=3 mem=3072 service
            svc2/0#1 pending
            job svc2 pending
            > cycle
            svc/0#1 ready
            svc2/0#1 ready
            svc/0#1 placed @h1
            svc/0#1 launching @h1
            svc2/0#1 placed @h1
            svc2/0#1 launching @h1
              launch svc/0#1 @h1 config 1
              launch svc2/0#1 @h1 config 1
            svc/0#1 running @h1
            svc2/0#1 running @h1
            job svc running
            job svc2 running
            > usage h1 t=1000 svc/0=0:512 svc2/0=0:512
            > usage h1 t=11000 svc/0=1000:512 svc2/0=10000:512
            > job batch pool=/ n=2 cpu=2 mem=1024 revocable
            batch/0#1 pending
            batch/1#1 pending
            job batch pending
            > cycle
            batch/0#1 ready
            batch/1#1 ready
            batch/0#1 placed @h1
            batch/0#1 launching @h1
            batch/1#1 placed @h1
            batch/1#1 launching @h1
              launch batch/0#1 @h1 config 1
              launch batch/1#1 @h1 config 1
            batch/0#1 running @h1
            batch/1#1 running @h1
            job batch running
            > lends h1
              h1 lends cpu=4300 mem=3892, borrowed cpu=2000 mem=0, free cpu=0 mem=0
            > kill svc
            svc/0#1 killed @h1 (job killed)
            job svc killing
              kill svc/0#1 @h1
            > lends h1
              h1 lends cpu=1400 mem=1332, borrowed cpu=2000 mem=0, free cpu=0 mem=0
            > usage h1 t=21000 svc2/0=20000:512 batch/0=10000:512 batch/1=10000:512
            > lends h1
              h1 lends cpu=1400 mem=1332, borrowed cpu=2000 mem=0, free cpu=0 mem=0
            > confirm
            job svc killed
            > lends h1
              h1 lends cpu=1400 mem=1332, borrowed cpu=0 mem=0, free cpu=1000 mem=3072
        "#]],
    );
}

#[test]
fn a_preemption_plan_counts_what_freeing_a_borrowing_host_repays_first() {
    // A service uses 1 of its 6 cores on an 8-core host: two revocable
    // 2-core tasks run, one on the free cores, one on borrowed ones. A
    // higher-priority 2-core task finds no host and evicts the revocable
    // tasks on the borrowing host to make room: freeing one repays
    // the loan and frees nothing, so both must go at once. (Counting the
    // freed cores as free, the plan evicted one; it was placed again on
    // the lent cores and evicted again, every cycle, and `hi` never ran.)
    // Once `hi` runs, both revocable tasks borrow again.
    check(
        r"
        host h1 cpu=8 mem=8192
        job svc pool=/ n=1 cpu=6 mem=6144 service
        cycle
        usage h1 t=1000 svc/0=0:1024
        usage h1 t=11000 svc/0=10000:1024
        job batch pool=/ n=2 cpu=2 mem=1024 revocable
        cycle
        lends h1
        job hi pool=/ n=1 cpu=2 mem=1024 priority=1
        cycle
        confirm
        cycle
        lends h1
        ",
        expect![[r#"
            > host h1 cpu=8 mem=8192
            > job svc pool=/ n=1 cpu=6 mem=6144 service
            svc/0#1 pending
            job svc pending
            > cycle
            svc/0#1 ready
            svc/0#1 placed @h1
            svc/0#1 launching @h1
              launch svc/0#1 @h1 config 1
            svc/0#1 running @h1
            job svc running
            > usage h1 t=1000 svc/0=0:1024
            > usage h1 t=11000 svc/0=10000:1024
            > job batch pool=/ n=2 cpu=2 mem=1024 revocable
            batch/0#1 pending
            batch/1#1 pending
            job batch pending
            > cycle
            batch/0#1 ready
            batch/1#1 ready
            batch/0#1 placed @h1
            batch/0#1 launching @h1
            batch/1#1 placed @h1
            batch/1#1 launching @h1
              launch batch/0#1 @h1 config 1
              launch batch/1#1 @h1 config 1
            batch/0#1 running @h1
            batch/1#1 running @h1
            job batch running
            > lends h1
              h1 lends cpu=4400 mem=3892, borrowed cpu=2000 mem=0, free cpu=0 mem=0
            > job hi pool=/ n=1 cpu=2 mem=1024 priority=1
            hi/0#1 pending
            job hi pending
            > cycle
            hi/0#1 ready
            hi/0#1 placing
            batch/1#1 preempted @h1 (preempted: revocable, and hi/0 (not revocable) needs the room revocable work holds on host h1; lost work: 0 ms since its start)
            batch/0#1 preempted @h1 (preempted: revocable, and hi/0 (not revocable) needs the room revocable work holds on host h1; lost work: 0 ms since its start)
            job batch pending
              kill batch/1#1 @h1
              kill batch/0#1 @h1
            > confirm
            batch/0#2 initialized
            batch/1#2 initialized
            batch/0#2 pending
            batch/1#2 pending
            > cycle
            batch/0#2 ready
            batch/1#2 ready
            hi/0#1 placed @h1
            hi/0#1 launching @h1
            batch/0#2 placed @h1
            batch/0#2 launching @h1
            batch/1#2 placed @h1
            batch/1#2 launching @h1
              launch hi/0#1 @h1 config 1
              launch batch/0#2 @h1 config 1
              launch batch/1#2 @h1 config 1
            hi/0#1 running @h1
            batch/0#2 running @h1
            batch/1#2 running @h1
            job batch running
            job hi running
            > lends h1
              h1 lends cpu=4400 mem=3892, borrowed cpu=4000 mem=1024, free cpu=0 mem=0
        "#]],
    );
}

#[test]
fn every_run_that_leaves_its_host_is_accounted_with_what_it_asked_for_and_used() {
    check(
        r"
        host h1 cpu=6 mem=4096
        job j pool=/ n=3 cpu=2 mem=1024 owner=ana
        cycle
        job q pool=/ n=1 cpu=4
        cycle                       # no room: it waits
        kill q                      # never on a host: no record
        usage h1 t=0 j/0=0:100 j/1=0:300
        usage h1 t=10000 j/0=5000:200 j/1=20000:100   # j/0: half a core; j/1: two
        tick 10000
        exit j/0 0                  # 10 s of 2 cores asked, 5 core-s used
        exit j/1 3                  # a failure keeps its code
        kill j/2                    # never reported: nothing used
        confirm
        ledger
        ",
        expect![[r#"
            > host h1 cpu=6 mem=4096
            > job j pool=/ n=3 cpu=2 mem=1024 owner=ana
            j/0#1 pending
            j/1#1 pending
            j/2#1 pending
            job j pending
            > cycle
            j/0#1 ready
            j/1#1 ready
            j/2#1 ready
            j/0#1 placed @h1
            j/0#1 launching @h1
            j/1#1 placed @h1
            j/1#1 launching @h1
            j/2#1 placed @h1
            j/2#1 launching @h1
              launch j/0#1 @h1 config 1
              launch j/1#1 @h1 config 1
              launch j/2#1 @h1 config 1
            j/0#1 running @h1
            j/1#1 running @h1
            j/2#1 running @h1
            job j running
            > job q pool=/ n=1 cpu=4
            q/0#1 pending
            job q pending
            > cycle
            > kill q
            q/0#1 killed (job killed)
            job q killed
            > usage h1 t=0 j/0=0:100 j/1=0:300
            > usage h1 t=10000 j/0=5000:200 j/1=20000:100
            > tick 10000
            > exit j/0 0
            j/0#1 succeeded @h1
            > exit j/1 3
            j/1#1 failed @h1 (exited with code 3)
            > kill j/2
            j/2#1 killed @h1 (killed by request)
              kill j/2#1 @h1
            > confirm
            job j failed
            > ledger
              #1 j/0#1 Succeeded exit=0 @h1 pool=/ owner=ana name=j start=0 end=10000 wall=10000ms cpu_req=20s cpu_used=5s mem_req=10240MiBs peak=200MiB measured=10000
              #2 j/1#1 Failed exit=3 @h1 pool=/ owner=ana name=j start=0 end=10000 wall=10000ms cpu_req=20s cpu_used=20s mem_req=10240MiBs peak=258MiB measured=10000
              #3 j/2#1 Killed exit=0 @h1 pool=/ owner=ana name=j start=0 end=10000 wall=10000ms cpu_req=20s cpu_used=0s mem_req=10240MiBs peak=0MiB measured=0
              stored: [1, 2, 3]
        "#]],
    );
}

#[test]
fn the_ledger_keeps_its_newest_records_and_survives_a_restart() {
    check(
        r"
        ledger-bound max=2 ms=60000
        host h1 cpu=4
        job a pool=/ n=1 cpu=1
        job b pool=/ n=1 cpu=1
        job c pool=/ n=1 cpu=1
        cycle
        exit a/0 0
        exit b/0 0
        exit c/0 0                  # the first record goes
        ledger
        crash
        register h1
        ledger                      # as stored
        job d pool=/ n=1 cpu=1
        cycle
        exit d/0 0                  # numbers go on after a restart
        ledger
        tick 61000                  # past their age: all go
        ledger
        ",
        expect![[r#"
            > ledger-bound max=2 ms=60000
            > host h1 cpu=4
            > job a pool=/ n=1 cpu=1
            a/0#1 pending
            job a pending
            > job b pool=/ n=1 cpu=1
            b/0#1 pending
            job b pending
            > job c pool=/ n=1 cpu=1
            c/0#1 pending
            job c pending
            > cycle
            a/0#1 ready
            b/0#1 ready
            c/0#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
            b/0#1 placed @h1
            b/0#1 launching @h1
            c/0#1 placed @h1
            c/0#1 launching @h1
              launch a/0#1 @h1 config 1
              launch b/0#1 @h1 config 1
              launch c/0#1 @h1 config 1
            a/0#1 running @h1
            b/0#1 running @h1
            c/0#1 running @h1
            job a running
            job b running
            job c running
            > exit a/0 0
            a/0#1 succeeded @h1
            job a succeeded
            > exit b/0 0
            b/0#1 succeeded @h1
            job b succeeded
            > exit c/0 0
            c/0#1 succeeded @h1
            job c succeeded
            > ledger
              #2 b/0#1 Succeeded exit=0 @h1 pool=/ owner=- name=b start=0 end=0 wall=0ms cpu_req=0s cpu_used=0s mem_req=0MiBs peak=0MiB measured=0
              #3 c/0#1 Succeeded exit=0 @h1 pool=/ owner=- name=c start=0 end=0 wall=0ms cpu_req=0s cpu_used=0s mem_req=0MiBs peak=0MiB measured=0
              stored: [2, 3]
            > crash
            > register h1
            > ledger
              #2 b/0#1 Succeeded exit=0 @h1 pool=/ owner=- name=b start=0 end=0 wall=0ms cpu_req=0s cpu_used=0s mem_req=0MiBs peak=0MiB measured=0
              #3 c/0#1 Succeeded exit=0 @h1 pool=/ owner=- name=c start=0 end=0 wall=0ms cpu_req=0s cpu_used=0s mem_req=0MiBs peak=0MiB measured=0
              stored: [2, 3]
            > job d pool=/ n=1 cpu=1
            d/0#1 pending
            job d pending
            > cycle
            d/0#1 ready
            d/0#1 placed @h1
            d/0#1 launching @h1
              launch d/0#1 @h1 config 1
            d/0#1 running @h1
            job d running
            > exit d/0 0
            d/0#1 succeeded @h1
            job d succeeded
            > ledger
              #3 c/0#1 Succeeded exit=0 @h1 pool=/ owner=- name=c start=0 end=0 wall=0ms cpu_req=0s cpu_used=0s mem_req=0MiBs peak=0MiB measured=0
              #4 d/0#1 Succeeded exit=0 @h1 pool=/ owner=- name=d start=0 end=0 wall=0ms cpu_req=0s cpu_used=0s mem_req=0MiBs peak=0MiB measured=0
              stored: [3, 4]
            > tick 61000
            > ledger
              stored: []
        "#]],
    );
}

/// Found by the model-based driver: an instance that had ended (killed)
/// while its run was still stopping when the server restarted. The
/// recovered run holds the instance's whole place until its host reports;
/// scaled away, the instance ends without a transition, and must then hold
/// only its volume's disk (its reservation was not looked at again).
#[test]
fn an_ended_instance_scaled_away_after_a_restart_holds_only_its_volume() {
    check(
        r"
        host h1 cpu=4 disk=4000
        job s pool=/ n=2 cpu=1 volume=1000 service
        cycle
        kill s/1             # its run stops; the agent has not confirmed
        crash
        reserved h1          # the recovered stopping run holds its place
        scale s 1
        reserved h1
        ",
        expect![[r#"
            > host h1 cpu=4 disk=4000
            > job s pool=/ n=2 cpu=1 volume=1000 service
            s/0#1 pending
            s/1#1 pending
            job s pending
            > cycle
            s/0#1 ready
            s/1#1 ready
            s/0#1 placed @h1
            s/0#1 launching @h1
            s/1#1 placed @h1
            s/1#1 launching @h1
              launch s/0#1 @h1 config 1 volume s-0-6 1000MiB
              launch s/1#1 @h1 config 1 volume s-1-8 1000MiB
            s/0#1 running @h1
            s/1#1 running @h1
            job s running
            > kill s/1
            s/1#1 killed @h1 (killed by request)
              kill s/1#1 @h1
            > crash
            > reserved h1
              reserved @h1: cpu=2000 memory=128 disk=2000 gpu=0; free: cpu=2000 memory=3968 disk=2000 gpu=0
            > scale s 1
            > reserved h1
              reserved @h1: cpu=1000 memory=64 disk=2000 gpu=0; free: cpu=3000 memory=4032 disk=2000 gpu=0
        "#]],
    );
}

/// A forecast says when and where waiting instances start, from the
/// running ones' estimated ends (here their jobs' running-time limits):
/// the gang after both running tasks end, the small job after the gang
/// (admission keeps pool order). It is soft state: a started instance has
/// none, and the next forecast is due only after the interval.
#[test]
fn a_forecast_says_when_and_where_waiting_instances_start() {
    check(
        r"
        host h1 cpu=4
        host h2 cpu=4
        job a pool=/ n=2 cpu=4 max_time=60000
        cycle
        tick 10000
        job g pool=/ n=2 cpu=4 gang=2 max_time=30000
        job s pool=/ n=1 cpu=1
        cycle
        forecast
        forecast
        ",
        expect![[r#"
            > host h1 cpu=4
            > host h2 cpu=4
            > job a pool=/ n=2 cpu=4 max_time=60000
            a/0#1 pending
            a/1#1 pending
            job a pending
            > cycle
            a/0#1 ready
            a/1#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
            a/1#1 placed @h2
            a/1#1 launching @h2
              launch a/0#1 @h1 config 1
              launch a/1#1 @h2 config 1
            a/0#1 running @h1
            job a running
            a/1#1 running @h2
            > tick 10000
            > job g pool=/ n=2 cpu=4 gang=2 max_time=30000
            g/0#1 pending
            g/1#1 pending
            job g pending
            > job s pool=/ n=1 cpu=1
            s/0#1 pending
            job s pending
            > cycle
            > forecast
              forecast (due true): AllStarted after 5 steps
              job g starts +60000 (earliest +60000) position 1
              g/0 starts +60000 (earliest +60000) on h1 position 1
              g/1 starts +60000 (earliest +60000) on h2 position 2
              job s starts +90000 (earliest +90000) position 3
              s/0 starts +90000 (earliest +90000) on h1 position 3
            > forecast
              forecast (due false): AllStarted after 5 steps
              job g starts +60000 (earliest +60000) position 1
              g/0 starts +60000 (earliest +60000) on h1 position 1
              g/1 starts +60000 (earliest +60000) on h2 position 2
              job s starts +90000 (earliest +90000) position 3
              s/0 starts +90000 (earliest +90000) on h1 position 3
        "#]],
    );
}

#[test]
fn runtime_estimates_are_declared_else_learned_else_the_max_running_time() {
    check(
        r"
        host h1 cpu=8
        job a pool=/ n=2 cpu=1 expect=60000 expect_override=1:5000
        estimate a/0                # declared
        estimate a/1                # its override's
        job c pool=/ n=1 cpu=1 expect=120000 max_time=90000
        estimate c/0                # declared, cut to the limit
        job m pool=/ n=1 cpu=1 max_time=90000 cmd=train
        estimate m/0                # nothing learned yet: the limit
        job u pool=/ n=1 cpu=1 cmd=train
        estimate u/0                # unknown
        job s pool=/ n=1 cpu=1 service expect=60000
        estimate s/0                # services run until stopped
        ",
        expect![[r#"
            > host h1 cpu=8
            > job a pool=/ n=2 cpu=1 expect=60000 expect_override=1:5000
            a/0#1 pending
            a/1#1 pending
            job a pending
            > estimate a/0
              estimate a/0: 60000ms declared
            > estimate a/1
              estimate a/1: 5000ms declared
            > job c pool=/ n=1 cpu=1 expect=120000 max_time=90000
            c/0#1 pending
            job c pending
            > estimate c/0
              estimate c/0: 90000ms declared
            > job m pool=/ n=1 cpu=1 max_time=90000 cmd=train
            m/0#1 pending
            job m pending
            > estimate m/0
              estimate m/0: 90000ms max running time
            > job u pool=/ n=1 cpu=1 cmd=train
            u/0#1 pending
            job u pending
            > estimate u/0
              estimate u/0: none
            > job s pool=/ n=1 cpu=1 service expect=60000
            s/0#1 pending
            job s pending
            > estimate s/0
              estimate s/0: none
        "#]],
    );
}

#[test]
fn runtimes_are_learned_from_succeeded_runs_of_an_owners_command_and_rebuilt_at_recovery() {
    check(
        r"
        host h1 cpu=8
        job m pool=/ n=1 cpu=1 max_time=90000 cmd=train
        job u pool=/ n=1 cpu=1 cmd=train
        job r pool=/ n=4 cpu=1 cmd=train
        job o pool=/ n=1 cpu=1 cmd=train owner=bo
        cycle
        tick 10000
        exit r/0 0                  # 10 s
        tick 10000
        exit r/1 0                  # 20 s
        exit r/2 1                  # failed: not counted
        estimate u/0                # two runs are too few
        tick 10000
        exit r/3 0                  # 30 s
        estimate u/0                # the 90th percentile of three
        estimate m/0                # learned comes before the limit
        estimate o/0                # another owner's command
        crash
        register h1
        estimate u/0                # learned again from the ledger
        ",
        expect![[r#"
            > host h1 cpu=8
            > job m pool=/ n=1 cpu=1 max_time=90000 cmd=train
            m/0#1 pending
            job m pending
            > job u pool=/ n=1 cpu=1 cmd=train
            u/0#1 pending
            job u pending
            > job r pool=/ n=4 cpu=1 cmd=train
            r/0#1 pending
            r/1#1 pending
            r/2#1 pending
            r/3#1 pending
            job r pending
            > job o pool=/ n=1 cpu=1 cmd=train owner=bo
            o/0#1 pending
            job o pending
            > cycle
            m/0#1 ready
            u/0#1 ready
            r/0#1 ready
            r/1#1 ready
            r/2#1 ready
            r/3#1 ready
            o/0#1 ready
            m/0#1 placed @h1
            m/0#1 launching @h1
            u/0#1 placed @h1
            u/0#1 launching @h1
            r/0#1 placed @h1
            r/0#1 launching @h1
            r/1#1 placed @h1
            r/1#1 launching @h1
            r/2#1 placed @h1
            r/2#1 launching @h1
            r/3#1 placed @h1
            r/3#1 launching @h1
            o/0#1 placed @h1
            o/0#1 launching @h1
              launch m/0#1 @h1 config 1
              launch u/0#1 @h1 config 1
              launch r/0#1 @h1 config 1
              launch r/1#1 @h1 config 1
              launch r/2#1 @h1 config 1
              launch r/3#1 @h1 config 1
              launch o/0#1 @h1 config 1
            m/0#1 running @h1
            u/0#1 running @h1
            r/0#1 running @h1
            r/1#1 running @h1
            r/2#1 running @h1
            r/3#1 running @h1
            o/0#1 running @h1
            job m running
            job u running
            job r running
            job o running
            > tick 10000
            > exit r/0 0
            r/0#1 succeeded @h1
            > tick 10000
            > exit r/1 0
            r/1#1 succeeded @h1
            > exit r/2 1
            r/2#1 failed @h1 (exited with code 1)
            > estimate u/0
              estimate u/0: none
            > tick 10000
            > exit r/3 0
            r/3#1 succeeded @h1
            job r failed
            > estimate u/0
              estimate u/0: 30000ms learned from 3 runs
            > estimate m/0
              estimate m/0: 30000ms learned from 3 runs
            > estimate o/0
              estimate o/0: none
            > crash
            > register h1
            > estimate u/0
              estimate u/0: 30000ms learned from 3 runs
        "#]],
    );
}

/// A plan says where and when a job would start, changing nothing; the
/// same job submitted on the unchanged cluster then starts there and then.
/// A plan is refused as creating the job would be, and a job's running
/// limit holds instances back.
#[test]
fn a_plan_says_where_and_when_and_the_job_then_starts_so() {
    check(
        r"
        host h1 cpu=4
        host h2 cpu=4
        job a pool=/ n=2 cpu=4 max_time=60000
        job b pool=/ n=1 cpu=2 max_time=30000
        cycle
        plan g pool=/ n=2 cpu=4 gang=2 expect=5000
        plan s pool=/ n=3 cpu=1 max_running=2 expect=1000
        plan p pool=/ n=3 cpu=2 gang=2 expect=1000
        plan x pool=/ n=1 cpu=64
        plan y pool=/nowhere n=1 cpu=1
        job g pool=/ n=2 cpu=4 gang=2 expect=5000
        cycle
        tick 60000           # a ends (its limit): b starts
        confirm
        cycle
        tick 30000           # b ends: the gang starts, as planned
        confirm
        cycle
        ",
        expect![[r#"
            > host h1 cpu=4
            > host h2 cpu=4
            > job a pool=/ n=2 cpu=4 max_time=60000
            a/0#1 pending
            a/1#1 pending
            job a pending
            > job b pool=/ n=1 cpu=2 max_time=30000
            b/0#1 pending
            job b pending
            > cycle
            a/0#1 ready
            a/1#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
            a/1#1 placed @h2
            a/1#1 launching @h2
              launch a/0#1 @h1 config 1
              launch a/1#1 @h2 config 1
            a/0#1 running @h1
            job a running
            a/1#1 running @h2
            > plan g pool=/ n=2 cpu=4 gang=2 expect=5000
              plan g (AllStarted): 0@h1+90000 pos 2; 1@h2+90000 pos 3; preempts none
            > plan s pool=/ n=3 cpu=1 max_running=2 expect=1000
              plan s (AllStarted): 0@h1+60000 pos 2; 1@h1+60000 pos 3; 2 none (held back by the job's running limit (sla.max_running_instances)); preempts none
            > plan p pool=/ n=3 cpu=2 gang=2 expect=1000
              plan p (AllStarted): 0@h1+60000 pos 2; 1@h1+60000 pos 3; 2@h2+60000 pos 4; preempts none
            > plan x pool=/ n=1 cpu=64
              plan x refused: spec.default_task.resources.cpu: no host of the cluster could ever hold a task of cpu 64 cores, memory 64 MiB (the largest capacities are cpu 4 cores, memory 4096 MiB)
            > plan y pool=/nowhere n=1 cpu=1
              plan y refused: spec.pool: pool /nowhere not found
            > job g pool=/ n=2 cpu=4 gang=2 expect=5000
            g/0#1 pending
            g/1#1 pending
            job g pending
            > cycle
            > tick 60000
            a/0#1 failed @h1 (ran longer than max_running_time_ms 60000)
            a/1#1 failed @h2 (ran longer than max_running_time_ms 60000)
              kill a/0#1 @h1
              kill a/1#1 @h2
            > confirm
            job a failed
            > cycle
            b/0#1 ready
            b/0#1 placed @h1
            b/0#1 launching @h1
              launch b/0#1 @h1 config 1
            b/0#1 running @h1
            job b running
            > tick 30000
            b/0#1 failed @h1 (ran longer than max_running_time_ms 30000)
              kill b/0#1 @h1
            > confirm
            job b failed
            > cycle
            g/0#1 ready
            g/1#1 ready
            g/0#1 placed @h1
            g/0#1 launching @h1
            g/1#1 placed @h2
            g/1#1 launching @h2
              launch g/0#1 @h1 config 1 rank 0/2 gen 1 [0@h1, 1@h2]
              launch g/1#1 @h2 config 1 rank 1/2 gen 1
            g/0#1 running @h1
            job g running
            g/1#1 running @h2
        "#]],
    );
}

/// After a restart, a running task adopted from its host's report keeps
/// the time it was placed: forecasts date its end from then, not from the
/// restart (found in review: every forecast after a failover was late by
/// the time the running work had already run).
#[test]
fn a_forecast_after_a_restart_dates_running_work_from_its_placement() {
    check(
        r"
        host h1 cpu=4
        job a pool=/ n=1 cpu=4 max_time=60000
        cycle
        tick 20000
        job w pool=/ n=1 cpu=4
        crash
        register h1
        cycle
        forecast
        ",
        expect![[r#"
            > host h1 cpu=4
            > job a pool=/ n=1 cpu=4 max_time=60000
            a/0#1 pending
            job a pending
            > cycle
            a/0#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
              launch a/0#1 @h1 config 1
            a/0#1 running @h1
            job a running
            > tick 20000
            > job w pool=/ n=1 cpu=4
            w/0#1 pending
            job w pending
            > crash
            > register h1
            > cycle
            > forecast
              forecast (due true): AllStarted after 3 steps
              job w starts +60000 (earliest +60000) position 1
              w/0 starts +60000 (earliest +60000) on h1 position 1
        "#]],
    );
}

/// A plan for a job that would wait for others says so instead of a
/// start (the forecast does not foresee when a job ends as asked); one
/// whose dependency can never be met says it would be killed at once; one
/// naming no job is refused as creating it would be; all change nothing.
#[test]
fn a_plan_of_a_job_with_dependencies_says_what_it_would_wait_for() {
    check(
        r"
        host h1 cpu=4
        job a pool=/ n=1 cpu=1 expect=60000
        cycle
        plan b pool=/ n=2 cpu=1 after=succeeded:a
        plan c pool=/ n=1 cpu=1 after=failed:a,finished:a
        plan d pool=/ n=1 cpu=1 after=succeeded:nope
        kill a
        confirm
        plan e pool=/ n=1 cpu=1 after=succeeded:a
        plan f pool=/ n=1 cpu=1 after=finished:a
        ",
        expect![[r#"
            > host h1 cpu=4
            > job a pool=/ n=1 cpu=1 expect=60000
            a/0#1 pending
            job a pending
            > cycle
            a/0#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
              launch a/0#1 @h1 config 1
            a/0#1 running @h1
            job a running
            > plan b pool=/ n=2 cpu=1 after=succeeded:a
              plan b (NoMoreEnds): 0 none (waits for jobs to end as asked: a (afterok)); 1 none (waits for jobs to end as asked: a (afterok)); preempts none
            > plan c pool=/ n=1 cpu=1 after=failed:a,finished:a
              plan c (NoMoreEnds): 0 none (waits for jobs to end as asked: a (afternotok), a (afterany)); preempts none
            > plan d pool=/ n=1 cpu=1 after=succeeded:nope
              plan d refused: spec.after.succeeded[0]: job nope not found
            > kill a
            a/0#1 killed @h1 (job killed)
            job a killing
              kill a/0#1 @h1
            > confirm
            job a killed
            > plan e pool=/ n=1 cpu=1 after=succeeded:a
              plan e (NoMoreEnds): 0 none (it would be killed at once: dependency a killed: afterok cannot be met); preempts none
            > plan f pool=/ n=1 cpu=1 after=finished:a
              plan f (AllStarted): 0@h1+0 pos 1; preempts none
        "#]],
    );
}

/// A plan lists the running members of a victim's gang with it: the
/// live loop preempts them with it (each with its notice, its lost work
/// counted) so that the gang starts again as one. The job submitted then
/// stops the same tasks.
#[test]
fn a_plan_lists_a_victims_gang_mates() {
    check(
        r"
        host h1 cpu=4
        host h2 cpu=4
        pool /owner cpu=4 mem=1024
        pool /borrower
        job g pool=/borrower n=2 cpu=2 gang=2 priority=1 preemptible expect=600000 notice=20000
        job hi pool=/borrower n=4 cpu=1 priority=5 preemptible expect=600000
        cycle
        plan big pool=/owner n=1 cpu=2 expect=5000
        job big pool=/owner n=1 cpu=2 expect=5000
        cycle
        ",
        expect![[r#"
            > host h1 cpu=4
            > host h2 cpu=4
            > pool /owner cpu=4 mem=1024
            > pool /borrower
            > job g pool=/borrower n=2 cpu=2 gang=2 priority=1 preemptible expect=600000 notice=20000
            g/0#1 pending
            g/1#1 pending
            job g pending
            > job hi pool=/borrower n=4 cpu=1 priority=5 preemptible expect=600000
            hi/0#1 pending
            hi/1#1 pending
            hi/2#1 pending
            hi/3#1 pending
            job hi pending
            > cycle
            hi/0#1 ready
            hi/1#1 ready
            hi/2#1 ready
            hi/3#1 ready
            g/0#1 ready
            g/1#1 ready
            g/0#1 placed @h1
            g/0#1 launching @h1
            g/1#1 placed @h1
            g/1#1 launching @h1
            hi/0#1 placed @h2
            hi/0#1 launching @h2
            hi/1#1 placed @h2
            hi/1#1 launching @h2
            hi/2#1 placed @h2
            hi/2#1 launching @h2
            hi/3#1 placed @h2
            hi/3#1 launching @h2
              launch g/0#1 @h1 config 1 rank 0/2 gen 1 [0@h1, 1@h1]
              launch g/1#1 @h1 config 1 rank 1/2 gen 1
              launch hi/0#1 @h2 config 1
              launch hi/1#1 @h2 config 1
              launch hi/2#1 @h2 config 1
              launch hi/3#1 @h2 config 1
            g/0#1 running @h1
            g/1#1 running @h1
            job g running
            hi/0#1 running @h2
            hi/1#1 running @h2
            hi/2#1 running @h2
            hi/3#1 running @h2
            job hi running
            > plan big pool=/owner n=1 cpu=2 expect=5000
              plan big (AllStarted): 0@h1+0 pos 1;
                preempts g/1 @h1 /borrower priority 1 +0 (preempted: pool over its entitlement in cpu: 8000 held, 6000 entitled)
                stops g/0 @h1 /borrower priority 1 +0 (gang member 1 preempted: the gang starts again as one)
            > job big pool=/owner n=1 cpu=2 expect=5000
            big/0#1 pending
            job big pending
            > cycle
            big/0#1 ready
            big/0#1 placing
            g/1#1 preempted @h1 (preempted: pool over its entitlement in cpu: 8000 held, 6000 entitled; lost work: 0 ms since its start)
            g/0#1 preempted @h1 (gang member 1 preempted: the gang starts again as one; lost work: 0 ms since its start)
            job g pending
              kill g/1#1 @h1 with notice 20000 ms
              kill g/0#1 @h1 with notice 20000 ms
        "#]],
    );
}

/// A plan for an owner's job on a cluster full of a borrower's
/// preemptible work lists what it would preempt — by then priority, most
/// recently started first — changing nothing; the same job submitted on
/// the unchanged cluster then preempts those tasks and starts where and
/// when planned. A plan that fits the free room preempts none.
#[test]
fn a_plan_says_whom_the_job_would_preempt_and_the_job_then_does() {
    check(
        r"
        host h1 cpu=4
        host h2 cpu=4
        pool /owner cpu=4 mem=1024
        pool /borrower
        job lo pool=/borrower n=3 cpu=1 priority=1 preemptible expect=600000
        job hi pool=/borrower n=3 cpu=1 priority=5 preemptible expect=600000
        cycle
        plan small pool=/owner n=2 cpu=1 expect=5000
        plan big pool=/owner n=2 cpu=2 expect=5000
        job big pool=/owner n=2 cpu=2 expect=5000
        cycle                # preempts as planned
        plan small pool=/owner n=1 cpu=1 expect=5000   # the runs stopping are not preempted again
        confirm
        cycle                # starts as planned
        ",
        expect![[r#"
            > host h1 cpu=4
            > host h2 cpu=4
            > pool /owner cpu=4 mem=1024
            > pool /borrower
            > job lo pool=/borrower n=3 cpu=1 priority=1 preemptible expect=600000
            lo/0#1 pending
            lo/1#1 pending
            lo/2#1 pending
            job lo pending
            > job hi pool=/borrower n=3 cpu=1 priority=5 preemptible expect=600000
            hi/0#1 pending
            hi/1#1 pending
            hi/2#1 pending
            job hi pending
            > cycle
            hi/0#1 ready
            hi/1#1 ready
            hi/2#1 ready
            lo/0#1 ready
            lo/1#1 ready
            lo/2#1 ready
            hi/0#1 placed @h1
            hi/0#1 launching @h1
            hi/1#1 placed @h1
            hi/1#1 launching @h1
            hi/2#1 placed @h1
            hi/2#1 launching @h1
            lo/0#1 placed @h1
            lo/0#1 launching @h1
            lo/1#1 placed @h2
            lo/1#1 launching @h2
            lo/2#1 placed @h2
            lo/2#1 launching @h2
              launch hi/0#1 @h1 config 1
              launch hi/1#1 @h1 config 1
              launch hi/2#1 @h1 config 1
              launch lo/0#1 @h1 config 1
              launch lo/1#1 @h2 config 1
              launch lo/2#1 @h2 config 1
            hi/0#1 running @h1
            hi/1#1 running @h1
            hi/2#1 running @h1
            lo/0#1 running @h1
            job lo running
            job hi running
            lo/1#1 running @h2
            lo/2#1 running @h2
            > plan small pool=/owner n=2 cpu=1 expect=5000
              plan small (AllStarted): 0@h2+0 pos 1; 1@h2+0 pos 2; preempts none
            > plan big pool=/owner n=2 cpu=2 expect=5000
              plan big (AllStarted): 0@h2+0 pos 1; 1@h2+0 pos 2;
                preempts lo/2 @h2 /borrower priority 1 +0 (preempted: pool over its entitlement in cpu: 6000 held, 4000 entitled)
                preempts lo/1 @h2 /borrower priority 1 +0 (preempted: pool over its entitlement in cpu: 6000 held, 4000 entitled)
            > job big pool=/owner n=2 cpu=2 expect=5000
            big/0#1 pending
            big/1#1 pending
            job big pending
            > cycle
            big/0#1 ready
            big/1#1 ready
            big/0#1 placed @h2
            big/0#1 launching @h2
            big/1#1 placing
            lo/2#1 preempted @h2 (preempted: pool over its entitlement in cpu: 6000 held, 4000 entitled; lost work: 0 ms since its start)
            lo/1#1 preempted @h2 (preempted: pool over its entitlement in cpu: 6000 held, 4000 entitled; lost work: 0 ms since its start)
              launch big/0#1 @h2 config 1
              kill lo/2#1 @h2
              kill lo/1#1 @h2
            big/0#1 running @h2
            job big running
            > plan small pool=/owner n=1 cpu=1 expect=5000
              plan small (AllStarted): 0@h1+5000 pos 2;
                preempts lo/0 @h1 /borrower priority 1 +0 (preempted: pool over its entitlement in cpu: 4000 held, 3000 entitled)
            > confirm
            lo/1#2 initialized
            lo/2#2 initialized
            lo/1#2 pending
            lo/2#2 pending
            > cycle
            big/1#1 placed @h2
            big/1#1 launching @h2
              launch big/1#1 @h2 config 1
            big/1#1 running @h2
        "#]],
    );
}

/// A plan for a high-priority job of a pool whose lower-priority work
/// fragments the hosts names the task it would evict (as the live loop
/// does: the host needing the fewest victims), and the job then does.
#[test]
fn a_plan_names_the_lower_priority_task_its_job_would_evict() {
    check(
        r"
        host h1 cpu=2
        host h2 cpu=2
        job low pool=/ n=2 cpu=1 preemptible priority=1 per_host=1 expect=600000
        cycle
        plan high pool=/ n=1 cpu=2 preemptible priority=5 expect=1000
        job high pool=/ n=1 cpu=2 preemptible priority=5 expect=1000
        cycle
        confirm
        cycle
        ",
        expect![[r#"
            > host h1 cpu=2
            > host h2 cpu=2
            > job low pool=/ n=2 cpu=1 preemptible priority=1 per_host=1 expect=600000
            low/0#1 pending
            low/1#1 pending
            job low pending
            > cycle
            low/0#1 ready
            low/1#1 ready
            low/0#1 placed @h1
            low/0#1 launching @h1
            low/1#1 placed @h2
            low/1#1 launching @h2
              launch low/0#1 @h1 config 1
              launch low/1#1 @h2 config 1
            low/0#1 running @h1
            job low running
            low/1#1 running @h2
            > plan high pool=/ n=1 cpu=2 preemptible priority=5 expect=1000
              plan high (AllStarted): 0@h1+0 pos 1;
                preempts low/0 @h1 / priority 1 +0 (preempted: a higher-priority task of its pool needs room on host h1)
            > job high pool=/ n=1 cpu=2 preemptible priority=5 expect=1000
            high/0#1 pending
            job high pending
            > cycle
            high/0#1 ready
            high/0#1 placing
            low/0#1 preempted @h1 (preempted: a higher-priority task of its pool (high/0) needs room on host h1; lost work: 0 ms since its start)
              kill low/0#1 @h1
            > confirm
            low/0#2 initialized
            low/0#2 pending
            > cycle
            low/0#2 ready
            high/0#1 placed @h1
            high/0#1 launching @h1
            low/0#2 placing
              launch high/0#1 @h1 config 1
            high/0#1 running @h1
            job high running
        "#]],
    );
}

/// Forecast bounds for fixtures: every end its own step, so starts are
/// exact to the millisecond.
fn exact_forecast() -> peloton_engine::ForecastConfig {
    peloton_engine::ForecastConfig {
        min_step_ms: 0,
        resolution: u32::MAX,
        ..Default::default()
    }
}

#[test]
fn a_job_waits_for_the_jobs_it_depends_on() {
    // b waits for a to succeed and c to end; d is refused: e is no job, and
    // a job cannot wait for itself.
    check(
        r"
        host h1 cpu=4
        job a pool=/ n=1 cpu=1
        job c pool=/ n=1 cpu=1
        job b pool=/ n=2 cpu=1 after=succeeded:a,finished:c
        waits b
        job d pool=/ n=1 cpu=1 after=succeeded:a,failed:e
        job d pool=/ n=1 cpu=1 after=finished:d
        cycle
        exit a/0 0
        waits b
        exit c/0 3
        waits b
        cycle
        ",
        expect![[r#"
            > host h1 cpu=4
            > job a pool=/ n=1 cpu=1
            a/0#1 pending
            job a pending
            > job c pool=/ n=1 cpu=1
            c/0#1 pending
            job c pending
            > job b pool=/ n=2 cpu=1 after=succeeded:a,finished:c
            job b pending
            > waits b
              b pending waits for [succeeded:a finished:c]
            > job d pool=/ n=1 cpu=1 after=succeeded:a,failed:e
            error: spec.after.failed[0]: job e not found
            > job d pool=/ n=1 cpu=1 after=finished:d
            error: spec.after.finished[0]: a job cannot wait for itself
            > cycle
            a/0#1 ready
            c/0#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
            c/0#1 placed @h1
            c/0#1 launching @h1
              launch a/0#1 @h1 config 1
              launch c/0#1 @h1 config 1
            a/0#1 running @h1
            c/0#1 running @h1
            job a running
            job c running
            > exit a/0 0
            a/0#1 succeeded @h1
            job a succeeded
            > waits b
              b pending waits for [finished:c]
            > exit c/0 3
            c/0#1 failed @h1 (exited with code 3)
            job c failed
            b/0#1 pending
            b/1#1 pending
            > waits b
              b pending waits for []
            > cycle
            b/0#1 ready
            b/1#1 ready
            b/0#1 placed @h1
            b/0#1 launching @h1
            b/1#1 placed @h1
            b/1#1 launching @h1
              launch b/0#1 @h1 config 1
              launch b/1#1 @h1 config 1
            b/0#1 running @h1
            b/1#1 running @h1
            job b running
        "#]],
    );
}

#[test]
fn a_dependency_that_can_never_be_met_kills_the_waiting_job() {
    // b needs a to succeed, c needs it to fail: a fails, so c goes and b
    // is killed, and so is d, which needed b to succeed; e, which needed b
    // to fail (or be killed), goes. A restart of b kills it again, also
    // once a is deleted.
    check(
        r"
        host h1 cpu=4
        job a pool=/ n=1 cpu=1
        job b pool=/ n=1 cpu=1 after=succeeded:a
        job c pool=/ n=1 cpu=1 after=failed:a
        job d pool=/ n=1 cpu=1 after=succeeded:b
        job e pool=/ n=1 cpu=1 after=failed:b
        cycle
        exit a/0 1
        task b/0
        restart b
        cycle
        jobs
        delete a
        restart b
        ",
        expect![[r#"
            > host h1 cpu=4
            > job a pool=/ n=1 cpu=1
            a/0#1 pending
            job a pending
            > job b pool=/ n=1 cpu=1 after=succeeded:a
            job b pending
            > job c pool=/ n=1 cpu=1 after=failed:a
            job c pending
            > job d pool=/ n=1 cpu=1 after=succeeded:b
            job d pending
            > job e pool=/ n=1 cpu=1 after=failed:b
            job e pending
            > cycle
            a/0#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
              launch a/0#1 @h1 config 1
            a/0#1 running @h1
            job a running
            > exit a/0 1
            a/0#1 failed @h1 (exited with code 1)
            job a failed
            b/0#1 killed (dependency a failed: afterok cannot be met)
            c/0#1 pending
            job b killed
            d/0#1 killed (dependency b killed: afterok cannot be met)
            e/0#1 pending
            job d killed
            > task b/0
              b/0#1 killed started 0 finished 0
            > restart b
            b/0#2 initialized
            job b pending
            b/0#2 killed (dependency a failed: afterok cannot be met)
            job b killed
            > cycle
            c/0#1 ready
            e/0#1 ready
            c/0#1 placed @h1
            c/0#1 launching @h1
            e/0#1 placed @h1
            e/0#1 launching @h1
              launch c/0#1 @h1 config 1
              launch e/0#1 @h1 config 1
            c/0#1 running @h1
            e/0#1 running @h1
            job c running
            job e running
            > jobs
            jobs: a=failed b=killed c=running d=killed e=running | stored: a(tasks=1 configs=1) b(tasks=1 configs=1) c(tasks=1 configs=1) d(tasks=1 configs=1) e(tasks=1 configs=1) | rows of removed jobs: 0 | finished 3
            > delete a
            job a failed deleted
            > restart b
            b/0#3 initialized
            job b pending
            b/0#3 killed (dependency a no longer exists: afterok cannot be met)
            job b killed
        "#]],
    );
}

#[test]
fn a_waiting_job_can_be_killed_restarted_and_deleted() {
    check(
        r"
        host h1 cpu=4
        job a pool=/ n=1 cpu=1
        job b pool=/ n=1 cpu=1 after=finished:a
        kill b
        waits b
        restart b
        waits b
        kill b
        delete b
        cycle
        exit a/0 0
        jobs
        ",
        expect![[r#"
            > host h1 cpu=4
            > job a pool=/ n=1 cpu=1
            a/0#1 pending
            job a pending
            > job b pool=/ n=1 cpu=1 after=finished:a
            job b pending
            > kill b
            b/0#1 killed (job killed)
            job b killed
            > waits b
              b killed waits for [finished:a]
            > restart b
            b/0#2 initialized
            job b pending
            > waits b
              b pending waits for [finished:a]
            > kill b
            b/0#2 killed (job killed)
            job b killed
            > delete b
            job b killed deleted
            > cycle
            a/0#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
              launch a/0#1 @h1 config 1
            a/0#1 running @h1
            job a running
            > exit a/0 0
            a/0#1 succeeded @h1
            job a succeeded
            > jobs
            jobs: a=succeeded | stored: a(tasks=1 configs=1) | rows of removed jobs: 0 | finished 1
        "#]],
    );
}

#[test]
fn a_waiting_job_survives_a_restart_and_is_released_by_what_ended_meanwhile() {
    // The server restarts while b waits; a's run ended meanwhile, which its
    // agent reports when it registers again. c was released before the
    // restart: its dependency a2 finishing again does not hold it back.
    check(
        r"
        host h1 cpu=4
        job a pool=/ n=1 cpu=1
        job a2 pool=/ n=1 cpu=1
        job b pool=/ n=1 cpu=1 after=succeeded:a
        job c pool=/ n=1 cpu=1 after=finished:a2
        cycle
        exit a2/0 0
        restart a2
        crash
        waits b
        waits c
        exit a/0 0
        register h1
        waits b
        cycle
        ",
        expect![[r#"
            > host h1 cpu=4
            > job a pool=/ n=1 cpu=1
            a/0#1 pending
            job a pending
            > job a2 pool=/ n=1 cpu=1
            a2/0#1 pending
            job a2 pending
            > job b pool=/ n=1 cpu=1 after=succeeded:a
            job b pending
            > job c pool=/ n=1 cpu=1 after=finished:a2
            job c pending
            > cycle
            a/0#1 ready
            a2/0#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
            a2/0#1 placed @h1
            a2/0#1 launching @h1
              launch a/0#1 @h1 config 1
              launch a2/0#1 @h1 config 1
            a/0#1 running @h1
            a2/0#1 running @h1
            job a running
            job a2 running
            > exit a2/0 0
            a2/0#1 succeeded @h1
            job a2 succeeded
            c/0#1 pending
            > restart a2
            a2/0#2 initialized
            a2/0#2 pending
            job a2 pending
            > crash
            > waits b
              b pending waits for [succeeded:a]
            > waits c
              c pending waits for []
            > exit a/0 0
            > register h1
            a/0#1 succeeded @h1
            job a succeeded
            b/0#1 pending
            > waits b
              b pending waits for []
            > cycle
            b/0#1 ready
            a2/0#2 placed @h1
            a2/0#2 launching @h1
            c/0#1 placed @h1
            c/0#1 launching @h1
            b/0#1 placed @h1
            b/0#1 launching @h1
              launch a2/0#2 @h1 config 1
              launch c/0#1 @h1 config 1
              launch b/0#1 @h1 config 1
            a2/0#2 running @h1
            c/0#1 running @h1
            b/0#1 running @h1
            job a2 running
            job b running
            job c running
        "#]],
    );
}

/// Editing a batch job: its queued instances are queued again with the new
/// priority (ahead of another job's now) and the running one keeps its
/// config; the edit survives a restart.
#[test]
fn an_edited_batch_job_queues_its_pending_instances_with_the_new_priority() {
    check(
        r"
        host h1 cpu=1
        job a pool=/ n=2 cpu=1
        job b pool=/ n=2 cpu=1
        cycle
        queue /
        edit b priority=5 max_time=60000 max_failures=2
        sla b
        queue /
        exit a/0 0
        cycle
        queue /
        sla b
        crash
        sla b
        queue /
        ",
        expect![[r#"
            > host h1 cpu=1
            > job a pool=/ n=2 cpu=1
            a/0#1 pending
            a/1#1 pending
            job a pending
            > job b pool=/ n=2 cpu=1
            b/0#1 pending
            b/1#1 pending
            job b pending
            > cycle
            a/0#1 ready
            a/0#1 placed @h1
            a/0#1 launching @h1
              launch a/0#1 @h1 config 1
            a/0#1 running @h1
            job a running
            > queue /
              queue /: a/1 non_preemptible, b/0 non_preemptible, b/1 non_preemptible
            > edit b priority=5 max_time=60000 max_failures=2
            b/0#1 initialized
            b/1#1 initialized
            b/0#1 pending
            b/1#1 pending
            > sla b
              b version 2 config 2 priority 5 max_running 0 max_time 60000 max_failures 2 | instances' configs 0:2 1:2 | kept []
            > queue /
              queue /: b/0 non_preemptible, b/1 non_preemptible, a/1 non_preemptible
            > exit a/0 0
            a/0#1 succeeded @h1
            job a pending
            > cycle
            b/0#1 ready
            b/0#1 placed @h1
            b/0#1 launching @h1
              launch b/0#1 @h1 config 2
            b/0#1 running @h1
            job b running
            > queue /
              queue /: b/1 non_preemptible, a/1 non_preemptible
            > sla b
              b version 2 config 2 priority 5 max_running 0 max_time 60000 max_failures 2 | instances' configs 0:2 1:2 | kept []
            > crash
            > sla b
              b version 2 config 2 priority 5 max_running 0 max_time 60000 max_failures 2 | instances' configs 0:2 1:2 | kept []
            > queue /
              queue /: b/1 non_preemptible, a/1 non_preemptible
        "#]],
    );
}

/// A raised running-instance cap queues more instances at once; a lowered
/// one takes queued instances back; a run keeps the config it started on
/// (its limit) while the instances after it take the new one.
#[test]
fn an_edited_cap_and_limit_apply_to_instances_not_started() {
    check(
        r"
        host h1 cpu=4
        job c pool=/ n=4 cpu=1 max_running=1 max_time=100000
        cycle
        edit c max_running=3 max_time=1000   # c/1 and c/2 are queued
        edit c max_running=2                 # c/2 goes back to waiting
        sla c
        cycle
        tick 1500
        task c/0
        task c/1
        ",
        expect![[r#"
            > host h1 cpu=4
            > job c pool=/ n=4 cpu=1 max_running=1 max_time=100000
            c/0#1 pending
            job c pending
            > cycle
            c/0#1 ready
            c/0#1 placed @h1
            c/0#1 launching @h1
              launch c/0#1 @h1 config 1
            c/0#1 running @h1
            job c running
            > edit c max_running=3 max_time=1000
            c/1#1 pending
            c/2#1 pending
            > edit c max_running=2
            c/1#1 initialized
            c/2#1 initialized
            c/1#1 pending
            > sla c
              c version 3 config 3 priority 0 max_running 2 max_time 1000 max_failures 0 | instances' configs 0:1 1:3 2:3 3:3 | kept [1]
            > cycle
            c/1#1 ready
            c/1#1 placed @h1
            c/1#1 launching @h1
              launch c/1#1 @h1 config 3
            c/1#1 running @h1
            > tick 1500
            c/1#1 failed @h1 (ran longer than max_running_time_ms 1000)
              kill c/1#1 @h1
            > task c/0
              c/0#1 running started 0 finished 0
            > task c/1
              c/1#1 failed started 0 finished 1500 stopping
        "#]],
    );
}

/// An edit's tolerated failures count for every failure after it, also
/// of a run that was on its host at the edit (which keeps its config):
/// raised from 0 to 1, the running instance's first failure is retried
/// (backoff, a second run), its second ends it; lowered back to 0 on
/// another job, the next failure ends its instance at once.
#[test]
fn an_edited_max_failures_counts_for_runs_on_hosts_too() {
    check(
        r"
        host h1 cpu=4
        job f pool=/ n=1 cpu=1 max_failures=0
        job g pool=/ n=1 cpu=1 max_failures=3
        cycle
        edit f max_failures=1
        edit g max_failures=0
        exit f/0 1
        exit g/0 1
        sla f
        tick 60000
        cycle
        exit f/0 1
        ",
        expect![[r#"
            > host h1 cpu=4
            > job f pool=/ n=1 cpu=1 max_failures=0
            f/0#1 pending
            job f pending
            > job g pool=/ n=1 cpu=1 max_failures=3
            g/0#1 pending
            job g pending
            > cycle
            f/0#1 ready
            g/0#1 ready
            f/0#1 placed @h1
            f/0#1 launching @h1
            g/0#1 placed @h1
            g/0#1 launching @h1
              launch f/0#1 @h1 config 1
              launch g/0#1 @h1 config 1
            f/0#1 running @h1
            g/0#1 running @h1
            job f running
            job g running
            > edit f max_failures=1
            > edit g max_failures=0
            > exit f/0 1
            f/0#1 failed @h1 (exited with code 1)
            f/0#1 backoff @h1 (exited with code 1)
            job f pending
            > exit g/0 1
            g/0#1 failed @h1 (exited with code 1)
            job g failed
            > sla f
              f version 2 config 2 priority 0 max_running 0 max_time 0 max_failures 1 | instances' configs 0:1 | kept [1]
            > tick 60000
            f/0#2 initialized
            f/0#2 pending
            > cycle
            f/0#2 ready
            f/0#2 placed @h1
            f/0#2 launching @h1
              launch f/0#2 @h1 config 1
            f/0#2 running @h1
            job f running
            > exit f/0 1
            f/0#2 failed @h1 (exited with code 1)
            job f failed
        "#]],
    );
}

/// Refused edits name the problem and change nothing: a stale version, a
/// service, nothing to change, a cap below the gang size, a finished job.
#[test]
fn refused_edits_change_nothing() {
    check(
        r"
        host h1 cpu=4
        job b pool=/ n=2 cpu=1
        job s pool=/ n=1 cpu=1 service
        job g pool=/ n=4 cpu=1 gang=2
        edit b version=7 priority=3
        edit s priority=3
        edit b
        edit g max_running=1
        sla b
        cycle
        exit b/0 0
        exit b/1 0
        edit b priority=3
        sla b
        ",
        expect![[r#"
            > host h1 cpu=4
            > job b pool=/ n=2 cpu=1
            b/0#1 pending
            b/1#1 pending
            job b pending
            > job s pool=/ n=1 cpu=1 service
            s/0#1 pending
            job s pending
            > job g pool=/ n=4 cpu=1 gang=2
            g/0#1 pending
            g/1#1 pending
            g/2#1 pending
            g/3#1 pending
            job g pending
            > edit b version=7 priority=3
            error: job b: version 7 is stale; the current version is 1
            > edit s priority=3
            error: job s is a service: only batch jobs are edited in place; services change by a rolling update (job update)
            > edit b
            error: edit: nothing to change
            > edit g max_running=1
            error: sla.max_running_instances: 1 is less than the gang size 2
            > sla b
              b version 1 config 1 priority 0 max_running 0 max_time 0 max_failures 0 | instances' configs 0:1 1:1 | kept []
            > cycle
            b/0#1 ready
            b/1#1 ready
            s/0#1 ready
            b/0#1 placed @h1
            b/0#1 launching @h1
            b/1#1 placed @h1
            b/1#1 launching @h1
            s/0#1 placed @h1
            s/0#1 launching @h1
              launch b/0#1 @h1 config 1
              launch b/1#1 @h1 config 1
              launch s/0#1 @h1 config 1
            b/0#1 running @h1
            b/1#1 running @h1
            s/0#1 running @h1
            job b running
            job s running
            > exit b/0 0
            b/0#1 succeeded @h1
            > exit b/1 0
            b/1#1 succeeded @h1
            job b succeeded
            > edit b priority=3
            error: job b has ended (succeeded): no instance is left to edit (restart it first)
            > sla b
              b version 1 config 1 priority 0 max_running 0 max_time 0 max_failures 0 | instances' configs 0:1 1:1 | kept []
        "#]],
    );
}

// ------------------------------------------------------------ cron jobs
// The script starts at 00:16:40 UTC (START_MS): `* * * * *` ticks at
// +20000, +80000, …; a tick's job is `<cron job>-<minutes since the epoch>`.

/// Each tick creates a job of the cron job's plan; ended ones beyond the
/// history bound are deleted at the next tick, the running one stays.
#[test]
fn a_cron_job_creates_a_job_each_tick_and_keeps_a_bounded_history() {
    check(
        r"
        host h1 cpu=4
        job c pool=/ cron=*_*_*_*_* keep=1:1
        cron c
        tick 20000
        cycle
        cron c
        exit c-17/0 0
        tick 60000
        cycle
        exit c-18/0 1
        tick 60000
        cycle
        cron c
        exit c-19/0 0
        tick 60000
        cron c
        ",
        expect![[r#"
            > host h1 cpu=4
            > job c pool=/ cron=*_*_*_*_* keep=1:1
            job c running
            > cron c
              cron c running: last 0 next 20000 ticks []
            > tick 20000
            c-17/0#1 pending
            job c-17 pending
            > cycle
            c-17/0#1 ready
            c-17/0#1 placed @h1
            c-17/0#1 launching @h1
              launch c-17/0#1 @h1 config 1
            c-17/0#1 running @h1
            job c-17 running
            > cron c
              cron c running: last 20000 next 80000 ticks [c-17@20000 running]
            > exit c-17/0 0
            c-17/0#1 succeeded @h1
            job c-17 succeeded
            > tick 60000
            c-18/0#1 pending
            job c-18 pending
            > cycle
            c-18/0#1 ready
            c-18/0#1 placed @h1
            c-18/0#1 launching @h1
              launch c-18/0#1 @h1 config 1
            c-18/0#1 running @h1
            job c-18 running
            > exit c-18/0 1
            c-18/0#1 failed @h1 (exited with code 1)
            job c-18 failed
            > tick 60000
            c-19/0#1 pending
            job c-19 pending
            > cycle
            c-19/0#1 ready
            c-19/0#1 placed @h1
            c-19/0#1 launching @h1
              launch c-19/0#1 @h1 config 1
            c-19/0#1 running @h1
            job c-19 running
            > cron c
              cron c running: last 140000 next 200000 ticks [c-17@20000 succeeded, c-18@80000 failed, c-19@140000 running]
            > exit c-19/0 0
            c-19/0#1 succeeded @h1
            job c-19 succeeded
            > tick 60000
            c-20/0#1 pending
            job c-17 succeeded deleted (cron history)
            job c-20 pending
            > cron c
              cron c running: last 200000 next 260000 ticks [c-18@80000 failed, c-19@140000 succeeded, c-20@200000 pending]
        "#]],
    );
}

/// `cron-run` starts a tick at once (its job named by this minute) and
/// leaves the schedule as it was; a second in the same minute is refused,
/// as is one that `forbid` would skip. `cron-suspend` takes the cron job off
/// the calendar (no tick fires, also after a crash: it is stored), a tick
/// now still runs; `cron-resume` ticks from then on. Both need a cron job that was
/// not killed.
#[test]
fn a_cron_job_runs_now_and_is_suspended_and_resumed() {
    check(
        r"
        host h1 cpu=4
        job c pool=/ cron=*_*_*_*_* overlap=forbid
        job plain pool=/ n=1 cpu=1
        tick 5000
        cron-run c         # 00:16:45: c-16
        cron c
        cron-run c         # refused: this minute's job exists
        cycle
        exit c-16/0 0
        cron-suspend c
        cron c
        tick 120000        # no tick at 00:17 or 00:18
        cron c
        crash
        cron c             # still suspended
        cron-run c         # 00:18:45: c-18, suspended or not
        cron c
        cron-resume c
        cron c
        tick 60000         # 00:19 skipped: c-18 has not ended (forbid)
        cron c
        cron-suspend plain # refused: no schedule
        kill c
        cron-run c         # refused: killed
        cron-resume c      # refused: killed
        ",
        expect![[r#"
            > host h1 cpu=4
            > job c pool=/ cron=*_*_*_*_* overlap=forbid
            job c running
            > job plain pool=/ n=1 cpu=1
            plain/0#1 pending
            job plain pending
            > tick 5000
            > cron-run c
            c-16/0#1 pending
            job c-16 pending
            > cron c
              cron c running: last 0 next 20000 ticks [c-16@5000 pending]
            > cron-run c
            error: tick 1970-01-01T00:16:45Z: job c-16 exists already
            > cycle
            plain/0#1 ready
            c-16/0#1 ready
            plain/0#1 placed @h1
            plain/0#1 launching @h1
            c-16/0#1 placed @h1
            c-16/0#1 launching @h1
              launch plain/0#1 @h1 config 1
              launch c-16/0#1 @h1 config 1
            plain/0#1 running @h1
            c-16/0#1 running @h1
            job plain running
            job c-16 running
            > exit c-16/0 0
            c-16/0#1 succeeded @h1
            job c-16 succeeded
            > cron-suspend c
            > cron c
              cron c running suspended: last 0 next none ticks [c-16@5000 succeeded]
            > tick 120000
            > cron c
              cron c running suspended: last 0 next none ticks [c-16@5000 succeeded]
            > crash
            > cron c
              cron c running suspended: last 0 next none ticks [c-16@5000 succeeded]
            > cron-run c
            c-18/0#1 pending
            job c-18 pending
            > cron c
              cron c running suspended: last 0 next none ticks [c-16@5000 succeeded, c-18@125000 pending]
            > cron-resume c
            > cron c
              cron c running: last 125000 next 140000 ticks [c-16@5000 succeeded, c-18@125000 pending]
            > tick 60000
            > cron c
              cron c running: last 140000 next 200000 ticks [c-16@5000 succeeded, c-18@125000 pending]
                skip: tick 1970-01-01T00:19:00Z skipped: job c-18 of an earlier tick has not ended (overlap: forbid)
            > cron-suspend plain
            error: job plain is not a cron job (it has no schedule)
            > kill c
            c-18/0#1 killed (its cron job was killed)
            job c killed
            job c-18 killed
            > cron-run c
            error: cron job c was killed: its schedule runs again once it is restarted
            > cron-resume c
            error: cron job c was killed: its schedule runs again once it is restarted
        "#]],
    );
}

/// `forbid` skips a tick while an earlier tick's job runs; `replace` kills
/// it and starts the new one.
#[test]
fn overlap_forbid_skips_a_tick_and_replace_kills_the_running_job() {
    check(
        r"
        host h1 cpu=4
        job f pool=/ cron=*_*_*_*_* overlap=forbid
        job r pool=/ cron=*_*_*_*_* overlap=replace
        tick 20000
        cycle
        tick 60000
        cron f
        cron r
        ",
        expect![[r#"
            > host h1 cpu=4
            > job f pool=/ cron=*_*_*_*_* overlap=forbid
            job f running
            > job r pool=/ cron=*_*_*_*_* overlap=replace
            job r running
            > tick 20000
            f-17/0#1 pending
            r-17/0#1 pending
            job f-17 pending
            job r-17 pending
            > cycle
            f-17/0#1 ready
            r-17/0#1 ready
            f-17/0#1 placed @h1
            f-17/0#1 launching @h1
            r-17/0#1 placed @h1
            r-17/0#1 launching @h1
              launch f-17/0#1 @h1 config 1
              launch r-17/0#1 @h1 config 1
            f-17/0#1 running @h1
            r-17/0#1 running @h1
            job f-17 running
            job r-17 running
            > tick 60000
            r-18/0#1 pending
            r-17/0#1 killed @h1 (replaced by the tick at 1970-01-01T00:18:00Z (overlap: replace))
            job r-17 killing
            job r-18 pending
              kill r-17/0#1 @h1
            > cron f
              cron f running: last 80000 next 140000 ticks [f-17@20000 running]
                skip: tick 1970-01-01T00:18:00Z skipped: job f-17 of an earlier tick has not ended (overlap: forbid)
            > cron r
              cron r running: last 80000 next 140000 ticks [r-17@20000 killing, r-18@80000 pending]
        "#]],
    );
}

/// The last tick is stored: after a restart a tick missed while the server
/// was down fires once, if it is at most five minutes late; several missed
/// never fire as a burst; older ones are only counted as missed.
#[test]
fn after_a_restart_one_missed_tick_fires_within_the_starting_deadline_never_a_burst() {
    check(
        r"
        host h1 cpu=4
        job h pool=/ cron=0_*_*_*_*
        job m pool=/ cron=*/10_*_*_*_*
        cron h
        crash
        tick 2780000   # 01:03:00: h's 01:00 is 3 min late; m's 00:20…01:00 were due
        cron h
        cron m
        crash
        tick 4020000   # 02:10:00: h's 02:00 is 10 min late
        cron h
        ",
        expect![[r#"
            > host h1 cpu=4
            > job h pool=/ cron=0_*_*_*_*
            job h running
            > job m pool=/ cron=*/10_*_*_*_*
            job m running
            > cron h
              cron h running: last 0 next 2600000 ticks []
            > crash
            > tick 2780000
            m-60/0#1 pending
            h-60/0#1 pending
            job m-60 pending
            job h-60 pending
            > cron h
              cron h running: last 2600000 next 6200000 ticks [h-60@2600000 pending]
            > cron m
              cron m running: last 2600000 next 3200000 ticks [m-60@2600000 pending]
                skip: ticks from 1970-01-01T00:20:00Z missed (the server was down)
            > crash
            > tick 4020000
            m-130/0#1 pending
            job m-130 pending
            > cron h
              cron h running: last 6800000 next 9800000 ticks [h-60@2600000 pending]
                skip: the ticks due since 1970-01-01T02:00:00Z were more than 300 s late: none fired
        "#]],
    );
}

/// Killing a cron job stops its schedule and kills its ticks' running
/// jobs; a restart resumes the schedule from then; it cannot be scaled.
#[test]
fn killing_a_cron_job_stops_it_and_its_running_ticks_and_a_restart_resumes_it() {
    check(
        r"
        host h1 cpu=4
        job c pool=/ cron=*_*_*_*_*
        tick 20000
        cycle
        kill c
        cron c
        tick 60000
        cron c
        scale c 2
        restart c
        cron c
        tick 60000
        cron c
        ",
        expect![[r#"
            > host h1 cpu=4
            > job c pool=/ cron=*_*_*_*_*
            job c running
            > tick 20000
            c-17/0#1 pending
            job c-17 pending
            > cycle
            c-17/0#1 ready
            c-17/0#1 placed @h1
            c-17/0#1 launching @h1
              launch c-17/0#1 @h1 config 1
            c-17/0#1 running @h1
            job c-17 running
            > kill c
            c-17/0#1 killed @h1 (its cron job was killed)
            job c killed
            job c-17 killing
              kill c-17/0#1 @h1
            > cron c
              cron c killed: last 20000 next none ticks [c-17@20000 killing]
            > tick 60000
            > cron c
              cron c killed: last 20000 next none ticks [c-17@20000 killing]
            > scale c 2
            error: job c is a cron job: it runs no instances itself (its ticks' jobs do)
            > restart c
            job c running
            > cron c
              cron c running: last 80000 next 140000 ticks [c-17@20000 killing]
            > tick 60000
            c-19/0#1 pending
            job c-19 pending
            > cron c
              cron c running: last 140000 next 200000 ticks [c-17@20000 killing, c-19@140000 pending]
        "#]],
    );
}

/// Only batch jobs have schedules, a cron job waits for no job, and the
/// expression and time zone are checked.
#[test]
fn bad_schedules_are_refused_naming_the_field() {
    check(
        r"
        job a pool=/ cron=*_*_*_* 
        job b pool=/ cron=61_*_*_*_*
        job c pool=/ cron=@hourly tz=Mars/Olympus
        job d pool=/ cron=@daily keep=101:1
        job e pool=/ cron=*_*_30_2_*
        job s pool=/ cron=@hourly service
        job x pool=/ n=1
        job w pool=/ cron=@hourly after=succeeded:x
        jobs
        ",
        expect![[r#"
            > job a pool=/ cron=*_*_*_*
              refused: schedule.cron: "* * * *" has 4 fields; a cron expression has 5 (minute hour day-of-month month day-of-week), e.g. "*/5 * * * *"
            > job b pool=/ cron=61_*_*_*_*
              refused: schedule.cron: "61 * * * *" is not a cron expression: Component error: Number out of bounds.
            > job c pool=/ cron=@hourly tz=Mars/Olympus
              refused: schedule.time_zone: "Mars/Olympus" is not an IANA time zone, e.g. "UTC" or "Europe/Berlin"
            > job d pool=/ cron=@daily keep=101:1
              refused: schedule.keep_succeeded: 101 is more than 100
            > job e pool=/ cron=*_*_30_2_*
              refused: schedule.cron: "* * 30 2 *" never fires
            > job s pool=/ cron=@hourly service
            error: spec.schedule: only batch jobs have a schedule
            > job x pool=/ n=1
            x/0#1 pending
            job x pending
            > job w pool=/ cron=@hourly after=succeeded:x
            error: spec.schedule: a cron job cannot wait for other jobs (its ticks' jobs would)
            > jobs
            jobs: x=pending | stored: x(tasks=0 configs=1) | rows of removed jobs: 0 | finished 0
        "#]],
    );
}
