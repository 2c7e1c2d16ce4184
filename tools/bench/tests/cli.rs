//! Runs the real `peloton-bench` binary on small workloads.

use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_peloton-bench"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = bench(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn entitlement_reports_time_per_recompute() {
    let report = json(&[
        "entitlement",
        "--pools",
        "300",
        "--iterations",
        "5",
        "--json",
    ]);
    assert_eq!(report["benchmark"], "entitlement");
    assert_eq!(report["pools"], 300);
    assert_eq!(report["invariants"], "ok");
    assert!(report["ms_per_recompute"].as_f64().unwrap() > 0.0);
}

#[test]
fn admission_reports_admissions_per_second_and_accounts_for_every_task() {
    let args = [
        "admission",
        "--pools",
        "50",
        "--tasks",
        "5000",
        "--json",
        "--threads",
        "2",
    ];
    let report = json(&args);
    assert_eq!(report["benchmark"], "admission");
    let admitted = report["admitted"].as_u64().unwrap();
    let waiting = report["waiting"].as_u64().unwrap();
    assert_eq!(admitted + waiting, 5000);
    assert!(
        admitted > 0 && waiting > 0,
        "capacity 70% of demand admits some, not all"
    );
    assert!(report["admissions_per_s"].as_f64().unwrap() > 0.0);
    // Same seed, other thread count: the same decisions.
    let one = json(&[
        "admission",
        "--pools",
        "50",
        "--tasks",
        "5000",
        "--json",
        "--threads",
        "1",
    ]);
    assert_eq!(one["admitted"], report["admitted"]);
    assert_eq!(one["blocked_queues"], report["blocked_queues"]);
    assert_eq!(one["example_reason"], report["example_reason"]);
}

#[test]
fn bad_arguments_fail_with_a_message() {
    let out = bench(&["entitlement", "--pools", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--pools must be between 2 and"));
    // Many tasks in few pools are fine (queue bounds follow the workload).
    let report = json(&["admission", "--pools", "2", "--tasks", "3000", "--json"]);
    assert_eq!(report["tasks"], 3000);
    let out = bench(&["admission", "--tasks", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tasks must be between 1 and"));
}

#[test]
fn demo_prints_both_tables() {
    let out = bench(&["demo", "--threads", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ms_per_recompute") && text.contains("admissions_per_s"),
        "{text}"
    );
}

#[test]
fn placement_places_and_explains_the_rest() {
    let report = json(&["placement", "--hosts", "200", "--tasks", "30000", "--json"]);
    assert_eq!(report["benchmark"], "placement");
    let placed = report["placed"].as_u64().unwrap();
    let unplaced = report["unplaced"].as_u64().unwrap();
    assert_eq!(placed + unplaced, 30000);
    assert!(
        placed > 0 && unplaced > 0,
        "an over-full cluster places some, not all"
    );
    assert!(
        report["example_reason"]
            .as_str()
            .unwrap()
            .starts_with("0/200 hosts:")
    );
    let out = bench(&["placement", "--strategy", "best"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--strategy must be pack, spread, first_fit or gpu_frag")
    );
}

#[test]
fn trace_gpu_reads_the_csvs_and_reports_fragmentation() {
    let dir = std::env::temp_dir().join(format!("peloton-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let nodes = dir.join("nodes.csv");
    let pods = dir.join("pods.csv");
    std::fs::write(
        &nodes,
        "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,2,T4\nn1,32000,262144,0,\nn2,64000,524288,8,V100M16\n",
    )
    .unwrap();
    std::fs::write(
        &pods,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
         p0,4000,8192,1,500,,LS,Running,0,10,0\n\
         p1,8000,16384,2,1000,,LS,Running,0,10,0\n\
         p2,2000,4096,0,0,,BE,Running,0,10,0\n\
         p3,1000,2048,1,250,,LS,Running,0,10,0\n",
    )
    .unwrap();
    // `trace-gpu --nodes … --pods …` and then `extra`.
    let (nodes_arg, pods_arg) = (nodes.to_str().unwrap(), pods.to_str().unwrap());
    let trace_args = |extra: &[&'static str]| {
        let mut args = vec!["trace-gpu", "--nodes", nodes_arg, "--pods", pods_arg];
        args.extend_from_slice(extra);
        args
    };
    let report = json(&trace_args(&[
        "--inflate",
        "1.3",
        "--seeds",
        "42..43",
        "--json",
    ]));
    assert_eq!(report["nodes"], 3);
    assert_eq!(report["pods_in_trace"], 4);
    let strategies = report["strategies"].as_array().unwrap();
    assert_eq!(strategies.len(), 6, "every strategy by default");
    for strategy in strategies {
        let name = strategy["strategy"].as_str().unwrap();
        let runs = strategy["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 2, "{name}: one run per seed");
        let mut sum = 0.0;
        for run in runs {
            let rate = run["gpu_alloc_rate_end"].as_f64().unwrap();
            assert!(rate > 0.0 && rate <= 1.0, "{name}: {rate}");
            let unallocated = run["unallocated_gpus"].as_f64().unwrap();
            assert!(
                (unallocated - 10.0 * (1.0 - rate)).abs() < 1e-6,
                "{name}: consistent with 10 GPUs"
            );
            let at_100 = run["unallocated_pct_at_100"].as_f64().unwrap();
            assert!((0.0..=100.0).contains(&at_100), "{name}: {at_100}");
            sum += at_100;
        }
        let mean = strategy["mean_unallocated_pct_at_100"].as_f64().unwrap();
        assert!(
            (mean - sum / 2.0).abs() < 1e-9,
            "{name}: the mean of the runs"
        );
    }
    // The five-column multi-GPU lists load, and gpu_spec confines a pod to
    // nodes of its models: no V100M32 node here, so nothing is allocated.
    std::fs::write(
        &pods,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,8192,2,1000\np1,1000,1024,1,300\n",
    )
    .unwrap();
    let report = json(&trace_args(&[
        "--seeds",
        "1",
        "--strategies",
        "gpu_frag,pack",
        "--json",
    ]));
    assert_eq!(report["pods_in_trace"], 2);
    assert_eq!(report["strategies"].as_array().unwrap().len(), 2);
    std::fs::write(
        &pods,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,1024,1,1000,V100M32\n",
    )
    .unwrap();
    let report = json(&trace_args(&[
        "--seeds",
        "1",
        "--strategies",
        "gpu_frag",
        "--json",
    ]));
    let run = &report["strategies"][0]["runs"][0];
    assert_eq!(run["pods_placed"], 0, "{run}");
    assert_eq!(run["gpu_alloc_rate_end"].as_f64(), Some(0.0));
    // An unknown strategy or seed range is refused.
    for bad in [["--strategies", "fgd"], ["--seeds", "9..3"]] {
        let out = bench(&trace_args(&bad));
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains(bad[0].trim_start_matches("--")));
    }
    // A malformed file is a clear error.
    std::fs::write(&pods, "name,cpu_milli\np0,abc\n").unwrap();
    let out = bench(&trace_args(&[]));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pods.csv"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn trace_gpu_all_tables_every_workload_beside_the_published_figures() {
    let dir = std::env::temp_dir().join(format!("peloton-trace-all-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir_arg = dir.to_str().unwrap().to_owned();
    std::fs::write(
        dir.join("openb_node_list_gpu_node.csv"),
        "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,2,T4\nn1,64000,524288,8,V100M16\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("openb_pod_list_default.csv"),
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
         p0,4000,8192,1,500,\np1,8000,16384,2,1000,\np2,2000,4096,0,0,\np3,1000,2048,1,250,\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("openb_pod_list_gpuspec10.csv"),
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
         p0,4000,8192,1,1000,T4\np1,8000,16384,1,1000,\np2,1000,2048,1,300,V100M16|T4\n",
    )
    .unwrap();
    // Allocation % per arrived %: the figure is 100 − the mean of column
    // `100` over the file's seeds; other policies and columns are ignored.
    let published = |fgd_43: &str| {
        format!(
            "workload,sc_policy,tune,seed,total_gpus,0,99,100,101\n\
             openb_pod_list_default,06-FGD,1.3,42,10,0,90,95.5,97\n\
             openb_pod_list_default,06-FGD,1.3,43,10,0,90,{fgd_43},97\n\
             openb_pod_list_default,05-BestFit,1.3,42,10,0,80,90,97\n\
             openb_pod_list_default,01-Random,1.3,42,10,0,10,20,97\n\
             openb_pod_list_gpuspec10,06-FGD,1.3,42,10,0,70,80,97\n"
        )
    };
    std::fs::write(dir.join("analysis_allo_discrete.csv"), published("94.5")).unwrap();
    let all = |extra: &[&str]| {
        let mut args = vec!["trace-gpu", "--all", dir_arg.as_str(), "--seeds", "42..43"];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run_json = |extra: &[&str]| {
        let args = all(extra);
        json(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let report = run_json(&["--json"]);
    assert_eq!(
        report["strategies"],
        serde_json::json!(["gpu_frag", "gpu_frag_learned"])
    );
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{report}");
    assert_eq!(rows[0]["workload"], "default");
    assert_eq!(rows[1]["workload"], "gpuspec10");
    assert_eq!(report["skipped"].as_array().unwrap().len(), 15);
    assert!(
        (rows[0]["fgd"].as_f64().unwrap() - 5.0).abs() < 1e-9,
        "{report}"
    );
    assert!((rows[0]["best_fit"].as_f64().unwrap() - 10.0).abs() < 1e-9);
    assert!((rows[1]["fgd"].as_f64().unwrap() - 20.0).abs() < 1e-9);
    assert!(
        rows[1]["best_fit"].is_null(),
        "no BestFit row for gpuspec10"
    );
    // Each of ours is the mean of the single-workload replay of those seeds.
    for (row, file) in rows.iter().zip(["default", "gpuspec10"]) {
        let nodes = dir.join("openb_node_list_gpu_node.csv");
        let pods = dir.join(format!("openb_pod_list_{file}.csv"));
        let single = json(&[
            "trace-gpu",
            "--nodes",
            nodes.to_str().unwrap(),
            "--pods",
            pods.to_str().unwrap(),
            "--seeds",
            "42..43",
            "--strategies",
            "gpu_frag,gpu_frag_learned",
            "--json",
        ]);
        for (i, ours) in row["ours"].as_array().unwrap().iter().enumerate() {
            assert_eq!(ours[0], single["strategies"][i]["strategy"]);
            assert_eq!(
                ours[1],
                single["strategies"][i]["mean_unallocated_pct_at_100"]
            );
        }
    }
    // The table shows them, and ours − FGD.
    let text_of = |extra: &[&str]| {
        let args = all(extra);
        let out = bench(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let text = text_of(&[]);
    let given = rows[0]["ours"][0][1].as_f64().unwrap();
    let learned = rows[0]["ours"][1][1].as_f64().unwrap();
    let line = format!(
        "| default | {given:.2} | {learned:.2} | 5.00 | 10.00 | {:+.2} | {:+.2} |",
        given - 5.0,
        learned - 5.0
    );
    assert!(text.contains(&line), "{line}\n{text}");
    assert!(
        text.contains("| gpuspec10 |") && text.contains("| 20.00 | — |"),
        "{text}"
    );
    assert!(text.contains("skipped"), "{text}");
    // The figures come from the file: change it and the table follows.
    std::fs::write(dir.join("analysis_allo_discrete.csv"), published("92.5")).unwrap();
    let report = run_json(&["--json", "--strategies", "gpu_frag"]);
    assert!(
        (report["rows"][0]["fgd"].as_f64().unwrap() - 6.0).abs() < 1e-9,
        "{report}"
    );
    // Without the file the published columns are empty, not made up.
    std::fs::remove_file(dir.join("analysis_allo_discrete.csv")).unwrap();
    let text = text_of(&["--strategies", "gpu_frag"]);
    assert!(text.contains("| — | — | — |"), "{text}");
    // A malformed results file, or a folder without pod lists, is refused.
    std::fs::write(
        dir.join("analysis_allo_discrete.csv"),
        "workload,seed\nx,1\n",
    )
    .unwrap();
    let out = bench(&all(&[]).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no column sc_policy"));
    std::fs::remove_file(dir.join("analysis_allo_discrete.csv")).unwrap();
    for w in ["default", "gpuspec10"] {
        std::fs::remove_file(dir.join(format!("openb_pod_list_{w}.csv"))).unwrap();
    }
    let out = bench(&all(&[]).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--all"));
    // --all excludes --pods.
    let out = bench(
        &all(&["--pods", "x.csv"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(!out.status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A binary the service benchmarks start, next to this one (built by
/// `cargo test --workspace`): the test fails, never skips, without it.
fn require_sibling(name: &str) {
    let path = std::path::Path::new(env!("CARGO_BIN_EXE_peloton-bench")).with_file_name(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo test --workspace` (or build it first)",
        path.display()
    );
}

/// A small end-to-end run: 4 jobs of 10 tasks on 20 simulated hosts.
const SMALL_E2E: [&str; 10] = [
    "e2e",
    "--hosts",
    "20",
    "--jobs",
    "4",
    "--tasks-per-job",
    "10",
    "--clients",
    "2",
    "--json",
];

#[test]
fn e2e_measures_a_secure_server_by_default_and_a_plaintext_one_with_insecure() {
    require_sibling("pelotond");
    let args = SMALL_E2E;
    let report = json(&args);
    assert_eq!(report["benchmark"], "e2e");
    assert_eq!(report["tasks"], 40);
    let server = report["server"].as_str().unwrap();
    assert!(server.starts_with("https://127.0.0.1:"), "{report}");
    let mut insecure = args.to_vec();
    insecure.push("--insecure");
    let report = json(&insecure);
    assert_eq!(report["tasks"], 40);
    let server = report["server"].as_str().unwrap();
    assert!(server.starts_with("http://127.0.0.1:"), "{report}");
    // A server of one's own over https needs its CA.
    let out = bench(&["e2e", "--server", "https://127.0.0.1:1", "--jobs", "1"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs --ca-file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// On PostgreSQL, the run also measures the database alone taking rows of
/// the run's shape (its bound); on the embedded store there is none.
#[test]
fn e2e_on_postgres_reports_the_databases_own_rate_beside_the_runs() {
    require_sibling("pelotond");
    let mut args = SMALL_E2E.to_vec();
    args.push("--insecure");
    let report = json(&args);
    assert!(report["pg_rows_alone_per_s"].is_null(), "{report}");
    let mut pg = args.clone();
    pg.push("--postgres");
    let report = json(&pg);
    assert_eq!(report["store"], "postgres", "{report}");
    assert_eq!(report["tasks"], 40);
    // The rows and events the run wrote were read back for their sizes,
    // and as many rows as the run made were written (and counted) alone.
    assert!(report["pg_row_bytes"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["pg_rows_alone"], 40, "{report}");
    assert!(
        report["pg_event_bytes_per_task"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let alone = report["pg_rows_alone_per_s"].as_f64().unwrap();
    let run = report["tasks_per_s"].as_f64().unwrap();
    assert!(alone > 0.0, "{report}");
    let ratio = report["of_pg_rows_alone"].as_f64().unwrap();
    assert!(
        (ratio - run / alone).abs() < 1e-9 * ratio.max(1.0),
        "{report}"
    );
}

#[test]
fn launch_runs_real_tasks_on_agents_with_certificates() {
    require_sibling("pelotond");
    require_sibling("peloton-agent");
    let report = json(&["launch", "--agents", "2", "--tasks", "6", "--json"]);
    assert_eq!(report["tasks"], 6);
    assert!(report["tasks_per_s"].as_f64().unwrap() > 0.0, "{report}");
}

#[test]
fn forecast_measures_its_cost_and_its_accuracy_on_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("server_event.csv"),
        "0,1,add,,64,0.69,1\n0,2,add,,64,0.69,1\n5,2,softerror,agent_check,0,0,0\n",
    )
    .unwrap();
    // Ten jobs of one instance of 32 cores, all created at once: four run
    // and six wait for them, on two hosts. One row is not replayed.
    let mut tasks = String::from(
        "task_create_time, task_end_time, job_id, task_id,number_of_instances, status, plan_cpu,plan_mem\r\n",
    );
    for (i, duration) in [100, 230, 170, 60, 410, 90, 300, 140, 50, 260]
        .iter()
        .enumerate()
    {
        tasks.push_str(&format!("0,{duration},{i},{i},1,Terminated,3200,0.01\r\n"));
    }
    tasks.push_str("0,10,99,99,4,Failed,50,0.01\r\n");
    std::fs::write(dir.path().join("batch_task.csv"), tasks).unwrap();
    let report = json(&[
        "forecast",
        "--hosts",
        "20",
        "--running",
        "300",
        "--waiting",
        "200",
        "--runs",
        "2",
        "--no-window-steps",
        "100000",
        "--trace",
        dir.path().to_str().unwrap(),
        "--scale",
        "1",
        "--machine-scale",
        "1",
        "--every",
        "20",
        "--json",
    ]);
    assert_eq!(report["benchmark"], "forecast");
    let cost = &report["cost"];
    assert_eq!(cost["waiting"], 200);
    assert_eq!(cost["started"], 200, "every waiting task starts");
    assert_eq!(cost["stopped"], "all started");
    assert_eq!(cost["no_window_stopped"], "all started");
    assert_eq!(cost["window_error"]["tasks_compared"], 200);
    assert!(cost["forecast_ms_median"].as_f64().unwrap() > 0.0);
    let accuracy = &report["accuracy"];
    assert_eq!(accuracy["hosts"], 2);
    assert_eq!(accuracy["selection"]["jobs"], 10);
    assert_eq!(accuracy["selection"]["skipped_not_terminated"], 1);
    assert_eq!(accuracy["jobs_that_waited"], 6);
    assert_eq!(accuracy["jobs_never_started"], 0);
    let variants = accuracy["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 3);
    for v in variants {
        assert!(v["observations"].as_u64().unwrap() > 6, "{v}");
    }
    // Nothing arrives after the first forecast: with true durations and no
    // step window it is what then happens, to the millisecond.
    let exact = &variants[1];
    assert_eq!(exact["variant"], "true_durations_no_window");
    assert_eq!(exact["exact"], exact["observations"], "{exact}");
    assert_eq!(exact["error_of_wait_p90"], 0.0);
    assert_eq!(variants[0]["exact"], variants[0]["observations"]);
    // Text output names every variant.
    let text = bench(&[
        "forecast",
        "--no-cost",
        "--trace",
        dir.path().to_str().unwrap(),
        "--scale",
        "1",
        "--machine-scale",
        "1",
    ]);
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    for name in [
        "true_durations ",
        "true_durations_no_window",
        "learned_p90_by_class",
    ] {
        assert!(text.contains(name), "{name} in {text}");
    }
    // Bad input is named.
    let out = bench(&[
        "forecast",
        "--no-cost",
        "--trace",
        "/nonexistent",
        "--scale",
        "2",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--scale must be in (0, 1]"));
}
