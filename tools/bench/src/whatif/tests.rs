//! Replays of small snapshots written as Arrow files, as `peloton cluster
//! snapshot` writes them, from fixtures of a few lines:
//!
//! ```text
//! host h1 cpu=4 [state=down]
//! pool /a [reservation.cpu=2] [limit.cpu=8] [share=2]
//! job j1 /a n=16 cpu=1 [runtime=10s] [gang=2] [on=h1 started=-5s] [priority=3]
//! ```
//!
//! A job's tasks wait unless `on=HOST` places them there, started
//! `started` before the snapshot's time (T0).

use std::path::Path;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, Float64Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use serde_json::Value;

use super::*;

/// The snapshot's time.
const T0: u64 = 1_000_000_000;

fn kv<'a>(words: &[&'a str], key: &str) -> Option<&'a str> {
    words
        .iter()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

fn num(words: &[&str], key: &str, default: f64) -> f64 {
    kv(words, key).map_or(default, |v| v.parse().unwrap())
}

/// Seconds (`-5s`, `10s`) in ms.
fn ms(text: &str) -> i64 {
    let s: i64 = text.strip_suffix('s').unwrap().parse().unwrap();
    s * 1000
}

fn write(dir: &Path, name: &str, columns: Vec<(&str, ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let schema = batch.schema().as_ref().clone().with_metadata(
        [(TAKEN_AT_KEY.to_string(), T0.to_string())]
            .into_iter()
            .collect::<HashMap<_, _>>(),
    );
    let batch = batch.with_schema(Arc::new(schema)).unwrap();
    let file = std::fs::File::create(dir.join(name)).unwrap();
    let mut w = arrow_ipc::writer::FileWriter::try_new(file, &batch.schema()).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
}

fn f64s(v: impl IntoIterator<Item = f64>) -> ArrayRef {
    Arc::new(Float64Array::from_iter_values(v))
}

fn strs<'a>(v: impl IntoIterator<Item = &'a str>) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(v))
}

/// Resource columns `{prefix}cpu` … from the rows' cpu figures (and 4 GiB a
/// core, nothing else).
fn resource_columns(prefix: &str, cpus: &[f64], columns: &mut Vec<(String, ArrayRef)>) {
    columns.push((format!("{prefix}cpu"), f64s(cpus.iter().copied())));
    columns.push((
        format!("{prefix}memory_mb"),
        f64s(cpus.iter().map(|c| c * 4096.0)),
    ));
    columns.push((format!("{prefix}disk_mb"), f64s(cpus.iter().map(|_| 0.0))));
    columns.push((format!("{prefix}gpu"), f64s(cpus.iter().map(|_| 0.0))));
}

/// Writes the fixture's snapshot into a new directory.
fn snapshot(fixture: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (mut hosts, mut host_states, mut host_cpus) = (Vec::new(), Vec::new(), Vec::new());
    let (mut pools, mut shares, mut reservations, mut limits) =
        (vec!["/".to_string()], vec![1.0], vec![0.0], vec![0.0]);
    // job_id, pool, instance, state, host, started, priority, gang, runtime, cpu,
    // running limit
    type Row = (
        String,
        String,
        u32,
        &'static str,
        Option<String>,
        Option<u64>,
        u32,
        u32,
        Option<u64>,
        f64,
        u32,
    );
    let mut tasks: Vec<Row> = Vec::new();
    for line in fixture.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w[0] {
            "host" => {
                hosts.push(w[1].to_string());
                host_states.push(kv(&w, "state").unwrap_or("up").to_string());
                host_cpus.push(num(&w, "cpu", 0.0));
            }
            "pool" => {
                pools.push(w[1].to_string());
                shares.push(num(&w, "share", 1.0));
                reservations.push(num(&w, "reservation.cpu", 0.0));
                limits.push(num(&w, "limit.cpu", 0.0));
            }
            "job" => {
                let host = kv(&w, "on").map(str::to_string);
                let started = kv(&w, "started").map(|s| (T0 as i64 + ms(s)) as u64);
                for i in 0..num(&w, "n", 1.0) as u32 {
                    tasks.push((
                        w[1].to_string(),
                        w[2].to_string(),
                        i,
                        if host.is_some() { "running" } else { "pending" },
                        host.clone(),
                        started,
                        num(&w, "priority", 0.0) as u32,
                        num(&w, "gang", 1.0) as u32,
                        kv(&w, "runtime").map(|r| ms(r) as u64),
                        num(&w, "cpu", 1.0),
                        num(&w, "max_running", 0.0) as u32,
                    ));
                }
            }
            other => panic!("unknown fixture line {other}"),
        }
    }
    let mut columns: Vec<(String, ArrayRef)> = vec![
        ("name".into(), strs(hosts.iter().map(String::as_str))),
        ("state".into(), strs(host_states.iter().map(String::as_str))),
    ];
    resource_columns("capacity_", &host_cpus, &mut columns);
    write(
        dir.path(),
        "hosts.arrow",
        columns
            .iter()
            .map(|(n, a)| (n.as_str(), a.clone()))
            .collect(),
    );

    let n = pools.len();
    let mut columns: Vec<(String, ArrayRef)> = vec![
        ("path".into(), strs(pools.iter().map(String::as_str))),
        ("kind".into(), strs((0..n).map(|_| "elastic"))),
        ("share".into(), f64s(shares.iter().copied())),
        ("controller_limit_pct".into(), f64s((0..n).map(|_| 100.0))),
        ("slack_limit_pct".into(), f64s((0..n).map(|_| 100.0))),
    ];
    resource_columns("shares_", &vec![0.0; n], &mut columns);
    // The root's reservation reads as everything (0 here: it is skipped).
    resource_columns("reservation_", &reservations, &mut columns);
    resource_columns("limit_", &limits, &mut columns);
    // Memory follows cpu at 4 GiB a core; an unset cpu limit is no limit.
    write(
        dir.path(),
        "pools.arrow",
        columns
            .iter()
            .map(|(n, a)| (n.as_str(), a.clone()))
            .collect(),
    );

    let u64s = |f: &dyn Fn(&Row) -> Option<u64>| -> ArrayRef {
        Arc::new(UInt64Array::from_iter(tasks.iter().map(f)))
    };
    let u32s = |f: &dyn Fn(&Row) -> u32| -> ArrayRef {
        Arc::new(UInt32Array::from_iter_values(tasks.iter().map(f)))
    };
    let bools = |v: bool| -> ArrayRef { Arc::new(BooleanArray::from(vec![v; tasks.len()])) };
    let mut columns: Vec<(String, ArrayRef)> = vec![
        ("job_id".into(), strs(tasks.iter().map(|t| t.0.as_str()))),
        ("pool".into(), strs(tasks.iter().map(|t| t.1.as_str()))),
        ("instance".into(), u32s(&|t| t.2)),
        ("state".into(), strs(tasks.iter().map(|t| t.3))),
        (
            "host".into(),
            Arc::new(StringArray::from_iter(tasks.iter().map(|t| t.4.clone()))),
        ),
        ("placed_at_ms".into(), u64s(&|t| t.5)),
        ("started_at_ms".into(), u64s(&|t| t.5)),
        // Queued in fixture order.
        ("created_at_ms".into(), {
            let v: Vec<Option<u64>> = (0..tasks.len() as u64)
                .map(|i| Some(T0 - 1_000 + i))
                .collect();
            Arc::new(UInt64Array::from(v))
        }),
        ("job_created_at_ms".into(), u64s(&|_| Some(T0 - 1_000))),
        ("priority".into(), u32s(&|t| t.6)),
        // Preemptible: admitted beyond the pool's reservation (a
        // non-preemptible task only within it).
        ("preemptible".into(), bools(true)),
        ("revocable".into(), bools(false)),
        ("controller".into(), bools(false)),
        ("gang_size".into(), u32s(&|t| t.7)),
        ("max_running_instances".into(), u32s(&|t| t.10)),
        ("expected_runtime_ms".into(), u64s(&|t| t.8)),
    ];
    let cpus: Vec<f64> = tasks.iter().map(|t| t.9).collect();
    resource_columns("request_", &cpus, &mut columns);
    write(
        dir.path(),
        "tasks.arrow",
        columns
            .iter()
            .map(|(n, a)| (n.as_str(), a.clone()))
            .collect(),
    );
    dir
}

const WEEK: Bounds = Bounds {
    horizon_ms: 7 * 24 * 3_600_000,
    max_steps: 1_000_000,
};

/// Runs the fixture's snapshot with the changes parsed from `flags` (as on
/// the command line: `--add-hosts 2`).
fn whatif(fixture: &str, flags: &[&str]) -> Result<Value> {
    let dir = snapshot(fixture);
    let mut changes = Vec::new();
    for f in flags {
        let (flag, value) = f.split_once(' ').unwrap();
        changes.push(match flag {
            "--add-hosts" => parse_add_hosts(value)?,
            "--remove-hosts" => parse_remove_hosts(value)?,
            "--pool" => parse_pool(value)?,
            "--backfill" => parse_backfill(value)?,
            other => panic!("unknown flag {other}"),
        });
    }
    run(dir.path(), &changes, WEEK)
}

fn variant<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["variant"] == name)
        .unwrap_or_else(|| panic!("no variant {name} in {report:#}"))
}

fn pool<'a>(v: &'a Value, path: &str) -> &'a Value {
    v["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == path)
        .unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn adding_hosts_shortens_waits() {
    let report = whatif(
        "host h1 cpu=4
         host h2 cpu=4
         host h3 cpu=4 state=down
         pool /a
         job j1 /a n=16 cpu=1 runtime=10s",
        &["--add-hosts 2", "--add-hosts 1:h3"],
    )
    .unwrap();
    let base = variant(&report, "baseline");
    assert_eq!(base["hosts"], 2, "a down host takes no part");
    assert_eq!(base["total"]["waiting"], 16);
    assert_eq!(base["total"]["started"], 16);
    assert_eq!(f(&base["total"]["wait_max_s"]), 10.0);
    assert_eq!(f(&base["total"]["makespan_s"]), 20.0);
    assert_eq!(f(&base["total"]["utilization"]["cpu"]), 1.0);
    assert_eq!(base["stopped"], "all started and ended");

    let more = variant(&report, "--add-hosts 2");
    assert_eq!(more["hosts"], 4);
    assert_eq!(f(&more["total"]["wait_max_s"]), 0.0);
    assert_eq!(f(&more["total"]["makespan_s"]), 10.0);
    // Three hosts: 12 start at once, 4 wait one run.
    let like = variant(&report, "--add-hosts 1:h3");
    assert_eq!(f(&like["total"]["wait_max_s"]), 10.0);
    assert_eq!(f(&like["total"]["wait_median_s"]), 0.0);
    assert_eq!(
        variant(&report, "--add-hosts 2 --add-hosts 1:h3")["hosts"],
        5
    );
}

#[test]
fn raising_a_pools_reservation_shortens_its_wait_and_lengthens_the_others() {
    let fixture = "host h1 cpu=4
                   host h2 cpu=4
                   pool /a
                   pool /b
                   job ja /a n=16 cpu=1 runtime=10s
                   job jb /b n=16 cpu=1 runtime=10s";
    let report = whatif(
        fixture,
        &["--pool /b:reservation.cpu=6,reservation.memory_mb=24576"],
    )
    .unwrap();
    let base = variant(&report, "baseline");
    let more = variant(
        &report,
        "--pool /b:reservation.cpu=6,reservation.memory_mb=24576",
    );
    // Shared equally: each pool runs 4 at a time.
    assert_eq!(f(&pool(base, "/b")["wait_max_s"]), 30.0);
    assert_eq!(f(&pool(base, "/a")["wait_max_s"]), 30.0);
    // /b runs 6 at a time, /a 2 until /b's queue thins: /b's tasks wait
    // less, /a's more (the work is the same, so the longest wait is too).
    let median = |v: &Value, p: &str| f(&pool(v, p)["wait_median_s"]);
    assert!(median(more, "/b") < median(base, "/b"), "{more:#}");
    assert!(median(more, "/a") > median(base, "/a"), "{more:#}");
    assert_eq!(f(&pool(more, "/b")["wait_max_s"]), 20.0);
    assert_eq!(f(&pool(more, "/a")["wait_max_s"]), 30.0);
    // Equal pools with equal demand: fair throughout.
    assert_eq!(f(&base["total"]["fairness_jain"]), 1.0);
}

#[test]
fn running_tasks_end_at_their_estimates_and_gangs_start_whole() {
    // h1 is busy for 5 s more; the gang of two whole hosts waits for it.
    let report = whatif(
        "host h1 cpu=4
         host h2 cpu=4
         pool /a
         job run /a n=1 cpu=4 runtime=10s on=h1 started=-5s
         job gang /a n=2 cpu=4 gang=2 runtime=10s",
        &[],
    )
    .unwrap();
    let base = variant(&report, "baseline");
    assert_eq!(base["total"]["started"], 2);
    assert_eq!(f(&base["total"]["wait_median_s"]), 5.0);
    assert_eq!(f(&base["total"]["wait_max_s"]), 5.0);
    assert_eq!(f(&base["total"]["makespan_s"]), 15.0);

    // Without an estimate the running task never ends: the gang never
    // starts, and the replay says why it stopped.
    let report = whatif(
        "host h1 cpu=4
         host h2 cpu=4
         pool /a
         job svc /a n=1 cpu=4 on=h1 started=-5s
         job gang /a n=2 cpu=4 gang=2 runtime=10s",
        &[],
    )
    .unwrap();
    let base = variant(&report, "baseline");
    assert_eq!(base["total"]["started"], 0);
    assert_eq!(base["stopped"], "nothing more ends");
    assert!(base["total"]["makespan_s"].is_null());

    // Removing the busy host's neighbour leaves nowhere for the gang; the
    // busy host is kept (the least loaded go first).
    let report = whatif(
        "host h1 cpu=4
         host h2 cpu=4
         pool /a
         job run /a n=1 cpu=4 runtime=10s on=h1 started=-5s
         job gang /a n=2 cpu=4 gang=2 runtime=10s",
        &["--remove-hosts 1"],
    )
    .unwrap();
    let fewer = variant(&report, "--remove-hosts 1");
    assert_eq!(fewer["hosts"], 1);
    assert_eq!(fewer["requeued"], 0);
    assert_eq!(fewer["total"]["started"], 0);
}

#[test]
fn bad_changes_are_refused_naming_the_flag() {
    let fixture = "host h1 cpu=4
                   pool /a
                   job j /a n=1 cpu=1 runtime=1s";
    for (flag, problem) in [
        (
            "--add-hosts 0",
            "--add-hosts 0: the count must be 1 to 100000",
        ),
        ("--add-hosts x", "--add-hosts x: \"x\" is not a host count"),
        (
            "--add-hosts 2:",
            "--add-hosts 2:: the host to copy is empty",
        ),
        (
            "--add-hosts 1:ghost",
            "--add-hosts 1:ghost: no host ghost in the snapshot",
        ),
        (
            "--remove-hosts 2",
            "--remove-hosts 2: there are only 1 up hosts",
        ),
        (
            "--remove-hosts 0",
            "--remove-hosts 0: the count must be at least 1",
        ),
        ("--pool /a", "--pool /a: expected PATH:KEY=VALUE"),
        (
            "--pool a:share=2",
            "the pool path \"a\" does not start with /",
        ),
        (
            "--pool /a:share",
            "--pool /a:share: \"share\" is not KEY=VALUE",
        ),
        (
            "--pool /a:reservation.cores=1",
            "unknown dimension \"cores\"",
        ),
        ("--pool /a:weight=1", "unknown setting \"weight\""),
        ("--pool /a:share=-1", "share: must be a finite number ≥ 0"),
        (
            "--pool /a:kind=bouncy",
            "kind: \"bouncy\" is neither elastic nor static",
        ),
        (
            "--pool /nope:share=2",
            "--pool /nope:share=2: no pool /nope in the snapshot",
        ),
        // The server's own rule for a share.
        (
            "--pool /a:share=0.0000001",
            "pool /a: spec.share: must be between",
        ),
        (
            "--backfill maybe",
            "--backfill maybe: expected on, off or a reservation count",
        ),
        (
            "--backfill 65",
            "--backfill 65: the reservation count must be 1 to 64",
        ),
    ] {
        let err = format!("{:#}", whatif(fixture, &[flag]).unwrap_err());
        assert!(err.contains(problem), "{flag}: {err}");
    }
    for (text, problem) in [
        ("7", "--horizon 7: give a unit"),
        ("0d", "--horizon 0d: must be more than 0"),
        ("400d", "at most 365d"),
        ("1.5h", "\"1.5\" is not a whole number"),
    ] {
        let err = parse_duration_ms(text).unwrap_err().to_string();
        assert!(err.contains(problem), "{text}: {err}");
    }
    assert_eq!(parse_duration_ms("90m").unwrap(), 5_400_000);

    // A snapshot without pools.arrow (an older peloton's).
    let dir = snapshot(fixture);
    std::fs::remove_file(dir.path().join("pools.arrow")).unwrap();
    let err = format!("{:#}", run(dir.path(), &[], WEEK).unwrap_err());
    assert!(err.contains("pools.arrow"), "{err}");
}

#[test]
fn backfill_off_holds_small_work_behind_a_blocked_gang() {
    // h1 is busy 100 s; a gang of two whole hosts heads the queue; 10 s
    // tasks behind it fit h2 and end long before the gang can start.
    let fixture = "host h1 cpu=4
                   host h2 cpu=4
                   pool /a
                   job run /a n=1 cpu=4 runtime=100s on=h1 started=0s
                   job gang /a n=2 cpu=4 gang=2 runtime=10s
                   job small /a n=4 cpu=4 runtime=10s";
    let report = whatif(fixture, &["--backfill off"]).unwrap();
    let on = variant(&report, "baseline");
    let off = variant(&report, "--backfill off");
    assert_eq!(on["backfill"], 8);
    assert!(off["backfill"].is_null());
    assert!(
        f(&on["total"]["wait_median_s"]) < f(&off["total"]["wait_median_s"]),
        "on {:#}\noff {:#}",
        on["total"],
        off["total"]
    );
}

#[test]
fn tasks_whose_pool_is_gone_are_left_out_and_counted() {
    let report = whatif(
        "host h1 cpu=4
         pool /a
         job j /a n=2 cpu=1 runtime=1s
         job old /gone n=3 cpu=1 runtime=1s",
        &[],
    )
    .unwrap();
    let base = variant(&report, "baseline");
    assert_eq!(base["total"]["waiting"], 2);
    assert_eq!(base["skipped"], 3);
    assert_eq!(base["skipped_why"], "no pool /gone in pools.arrow");
}

/// Removing hosts beside adding some removes the snapshot's hosts, never
/// the ones just added (they carry no load, so "least loaded" would pick
/// them).
#[test]
fn removing_hosts_beside_adding_removes_the_snapshots() {
    let report = whatif(
        "host big cpu=8
         host h1 cpu=2
         host h2 cpu=2
         pool /a
         job j1 /a n=16 cpu=1 runtime=10s",
        &["--add-hosts 2:big", "--remove-hosts 2"],
    )
    .unwrap();
    let both = variant(&report, "--add-hosts 2:big --remove-hosts 2");
    assert_eq!(both["hosts"], 3);
    // big and its two copies: 24 cores, every task at once (had the
    // copies gone, 12 cores: two rounds).
    assert_eq!(f(&both["total"]["makespan_s"]), 10.0);
    let err = whatif(
        "host h1 cpu=4
         pool /a",
        &["--add-hosts 2", "--remove-hosts 2"],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("only 1 up hosts"), "{err}");
}

/// A job's running limit holds its instances back as the server does:
/// at most that many queued or running, the next as those end.
#[test]
fn a_jobs_running_limit_releases_its_instances_as_others_end() {
    let report = whatif(
        "host h1 cpu=8
         pool /a
         job limited /a n=8 cpu=1 runtime=10s max_running=2
         job free /a n=4 cpu=1 runtime=10s",
        &[],
    )
    .unwrap();
    let base = variant(&report, "baseline");
    assert_eq!(base["total"]["waiting"], 12);
    assert_eq!(base["total"]["started"], 12);
    // Two at a time: four rounds of 10 s; the free job's four at once.
    assert_eq!(f(&base["total"]["wait_max_s"]), 30.0);
    assert_eq!(f(&base["total"]["makespan_s"]), 40.0);
    assert_eq!(base["stopped"], "all started and ended");
}
