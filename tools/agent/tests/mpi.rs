//! `peloton-agent mpirun`: an MPICH job of 4 ranks, each rank a process
//! started on its own (as the agent starts a gang's members) with only the
//! rendezvous environment a gang member gets, set here by hand; rank 0
//! runs `mpiexec`, the others hydra's proxy, with no ssh. Once as plain
//! processes, once as runs of the agent's supervisor (its launcher, its
//! cleared environment and limits, `$PELOTON_AGENT_BIN`). Needs MPICH
//! (Debian: `apt-get install mpich libmpich-dev`); without `mpicc`,
//! `mpiexec.hydra` or `hydra_pmi_proxy` on the PATH the MPI tests say so and
//! pass without running, unless `PELOTON_REQUIRE_MPI` is set (as
//! `scripts/test.sh` does after installing them). Last, the same job
//! through the scheduler: a server and three agents, a gang of 4 whose
//! rendezvous (`framework: mpi`) is all the ranks are given.

mod common;
mod supervised;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use peloton_agent::SupervisorConfig;
use peloton_proto::v1;
use supervised::ProtoSupervisor;

const AGENT: &str = env!("CARGO_BIN_EXE_peloton-agent");
const TIMEOUT: Duration = Duration::from_secs(90);

/// Sums rank + 1 over the job with `MPI_Allreduce` (4 ranks: 10) and says
/// which member's environment and sandbox each rank had. `fail-rank N`
/// makes rank N exit with status 3 after the sum.
const ALLREDUCE_C: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
  int rank, size, mine, sum = 0, fail_rank = -1;
  char cwd[4096];
  MPI_Init(&argc, &argv);
  if (argc == 3 && strcmp(argv[1], "fail-rank") == 0) fail_rank = atoi(argv[2]);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  mine = rank + 1;
  MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (!getcwd(cwd, sizeof cwd)) strcpy(cwd, "?");
  printf("rank %d of %d: sum %d, gang rank %s, in %s\n", rank, size, sum,
         getenv("PELOTON_GANG_RANK"), cwd);
  fflush(stdout);
  MPI_Finalize();
  return rank == fail_rank ? 3 : 0;
}
"#;

/// The program on the PATH, if any.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// Whether MPICH is installed; if not, says why the test does not run
/// (or fails, where MPICH is required).
fn mpich_installed(test: &str) -> bool {
    let missing: Vec<&str> = ["mpicc", "mpiexec.hydra", "hydra_pmi_proxy"]
        .into_iter()
        .filter(|p| on_path(p).is_none())
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("PELOTON_REQUIRE_MPI").is_none(),
        "{} not on the PATH (PELOTON_REQUIRE_MPI is set)",
        missing.join(", ")
    );
    eprintln!(
        "SKIPPED {test}: {} not on the PATH (Debian: apt-get install mpich libmpich-dev)",
        missing.join(", ")
    );
    false
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// The test program, compiled with `mpicc` into `dir`.
fn compile(dir: &Path) -> PathBuf {
    let source = dir.join("allreduce.c");
    std::fs::write(&source, ALLREDUCE_C).expect("write source");
    let binary = dir.join("allreduce");
    let compiled = Command::new("mpicc")
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("run mpicc");
    assert!(compiled.status.success(), "mpicc: {compiled:?}");
    binary
}

/// The rendezvous environment of member `rank` of a gang of `size` on this
/// machine whose rank 0 listens on `port`.
fn gang_env(size: usize, rank: usize, port: u16) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("PELOTON_GANG_SIZE", size.to_string()),
        ("PELOTON_GANG_RANK", rank.to_string()),
        ("PELOTON_GANG_LOCAL_RANK", rank.to_string()),
        ("PELOTON_GANG_LOCAL_SIZE", size.to_string()),
        ("PELOTON_GANG_GENERATION", "1".to_owned()),
        ("PELOTON_GANG_LEADER_ADDR", "127.0.0.1".to_owned()),
        ("PELOTON_GANG_LEADER_PORT_MPI", port.to_string()),
        ("PELOTON_GANG_PEERS", vec!["127.0.0.1"; size].join(",")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if rank == 0 {
        env.push(("PELOTON_PORT_MPI".to_owned(), port.to_string()));
    }
    env
}

/// A gang's members on this machine: one sandbox each, with the program.
struct Gang {
    _dir: tempfile::TempDir,
    sandboxes: Vec<PathBuf>,
    port: u16,
}

impl Gang {
    /// `size` sandboxes, each with its own copy of the compiled program
    /// (`./allreduce`), as each member would have it.
    fn new(size: usize) -> Gang {
        let dir = tempfile::tempdir().expect("tempdir");
        let binary = compile(dir.path());
        let sandboxes = (0..size)
            .map(|rank| {
                let sandbox = dir.path().join(format!("sandbox-{rank}"));
                std::fs::create_dir(&sandbox).expect("sandbox");
                std::fs::copy(&binary, sandbox.join("allreduce")).expect("copy");
                sandbox
            })
            .collect();
        Gang {
            _dir: dir,
            sandboxes,
            port: free_port(),
        }
    }

    /// Member `rank` running `peloton-agent mpirun ARGS`, with only the
    /// rendezvous environment (and a PATH), in its sandbox.
    fn start(&self, rank: usize, args: &[&str]) -> Child {
        Command::new(AGENT)
            .arg("mpirun")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(gang_env(self.sandboxes.len(), rank, self.port))
            .env("PELOTON_SANDBOX", &self.sandboxes[rank])
            .current_dir(&self.sandboxes[rank])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start peloton-agent mpirun")
    }

    /// Starts every member, the others before rank 0 (so their proxies
    /// must wait for its `mpiexec`), and waits for them all.
    fn run(&self, args: &[&str]) -> Vec<Output> {
        let mut members: Vec<(usize, Child)> = (1..self.sandboxes.len())
            .rev()
            .map(|rank| (rank, self.start(rank, args)))
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        members.push((0, self.start(0, args)));
        let mut outputs: Vec<Option<Output>> = (0..members.len()).map(|_| None).collect();
        for (rank, child) in members {
            outputs[rank] = Some(wait(child, &format!("rank {rank}")));
        }
        outputs.into_iter().map(|o| o.expect("waited")).collect()
    }
}

/// Waits for `child` within `TIMEOUT` (killed and failed after it).
fn wait(mut child: Child, what: &str) -> Output {
    let deadline = Instant::now() + TIMEOUT;
    // Read as it comes: a full pipe would stop the process.
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not end within {TIMEOUT:?}; stderr: {}",
                String::from_utf8_lossy(&err.join().expect("stderr"))
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out.join().expect("stdout"),
        stderr: err.join().expect("stderr"),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn describe(outputs: &[Output]) -> String {
    outputs
        .iter()
        .enumerate()
        .map(|(rank, o)| {
            format!(
                "rank {rank}: {}\nstdout:\n{}stderr:\n{}",
                o.status,
                text(&o.stdout),
                text(&o.stderr)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn sandbox_line(gang: &Gang, rank: usize) -> String {
    format!(
        "rank {rank} of 4: sum 10, gang rank {rank}, in {}",
        gang.sandboxes[rank].display()
    )
}

#[test]
fn four_independently_started_ranks_allreduce_through_mpiexec_in_rank_zero() {
    if !mpich_installed("four_independently_started_ranks_allreduce_through_mpiexec_in_rank_zero") {
        return;
    }
    let gang = Gang::new(4);
    let outputs = gang.run(&["--", "./allreduce"]);
    for o in &outputs {
        assert!(o.status.success(), "{}", describe(&outputs));
    }
    // Every rank's output comes out of mpiexec, in rank 0; each rank had
    // its own member's environment and sandbox.
    let mut lines: Vec<String> = text(&outputs[0].stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    let expected: Vec<String> = (0..4).map(|rank| sandbox_line(&gang, rank)).collect();
    assert_eq!(lines, expected, "{}", describe(&outputs));
    for o in &outputs[1..] {
        assert_eq!(text(&o.stdout), "", "{}", describe(&outputs));
    }
}

#[test]
fn four_supervised_runs_allreduce_through_the_agent_binary() {
    if !mpich_installed("four_supervised_runs_allreduce_through_the_agent_binary") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = compile(dir.path());
    let mut supervisor =
        ProtoSupervisor::open(SupervisorConfig::new(dir.path().join("agent"), AGENT))
            .expect("supervisor opens");
    let port = free_port();
    let key = |instance: u32| v1::RunKey {
        job_id: "mpi-gang".to_owned(),
        instance,
        run_id: 1,
        launch_id: 100 + u64::from(instance),
    };
    // Each member fetches the program into its sandbox and runs it
    // through its agent; ranks 1-3 are launched before rank 0.
    let launches: Vec<v1::LaunchRun> = (0..4u32)
        .rev()
        .map(|rank| {
            let mut spec = v1::TaskSpec {
                shell: "cp \"$PROGRAM\" ./allreduce && \
                        exec \"$PELOTON_AGENT_BIN\" mpirun -- ./allreduce"
                    .to_owned(),
                ..v1::TaskSpec::default()
            };
            spec.env.extend(gang_env(4, rank as usize, port));
            spec.env
                .insert("PROGRAM".to_owned(), binary.display().to_string());
            v1::LaunchRun {
                key: Some(key(rank)),
                spec: Some(spec),
                ..Default::default()
            }
        })
        .collect();
    supervisor.launch(&launches);
    let mut ends: Vec<Option<v1::RunReport>> = vec![None; 4];
    let deadline = Instant::now() + TIMEOUT;
    while ends.iter().any(Option::is_none) {
        supervisor.poll();
        for report in supervisor.take_reports(usize::MAX) {
            let instance = report.key.as_ref().expect("key").instance as usize;
            if matches!(
                report.phase(),
                v1::RunPhase::Succeeded | v1::RunPhase::Failed | v1::RunPhase::Killed
            ) {
                ends[instance] = Some(report);
            }
        }
        assert!(Instant::now() < deadline, "the runs did not end: {ends:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let logs = |rank: u32, name: &str| {
        std::fs::read_to_string(supervisor.sandbox_dir(&key(rank)).join(name)).unwrap_or_default()
    };
    for (rank, end) in (0..4u32).zip(&ends) {
        assert_eq!(
            end.as_ref().map(v1::RunReport::phase),
            Some(v1::RunPhase::Succeeded),
            "rank {rank}: {end:?}\nstderr: {}",
            logs(rank, "stderr")
        );
    }
    let mut lines: Vec<String> = logs(0, "stdout").lines().map(str::to_owned).collect();
    lines.sort();
    let expected: Vec<String> = (0..4u32)
        .map(|rank| {
            format!(
                "rank {rank} of 4: sum 10, gang rank {rank}, in {}",
                supervisor.sandbox_dir(&key(rank)).display()
            )
        })
        .collect();
    assert_eq!(lines, expected);
}

#[test]
fn a_failing_rank_fails_rank_zero_with_its_status() {
    if !mpich_installed("a_failing_rank_fails_rank_zero_with_its_status") {
        return;
    }
    let gang = Gang::new(4);
    let outputs = gang.run(&["--", "./allreduce", "fail-rank", "2"]);
    assert_eq!(outputs[0].status.code(), Some(3), "{}", describe(&outputs));
}

#[test]
fn rank_zero_gives_up_on_members_that_never_come() {
    if !mpich_installed("rank_zero_gives_up_on_members_that_never_come") {
        return;
    }
    let gang = Gang::new(2);
    let child = gang.start(0, &["--connect-timeout-secs", "5", "--", "./allreduce"]);
    let output = wait(child, "rank 0 alone");
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "1 of the gang's 2 proxies reached mpiexec on port {} within 5s",
            gang.port
        )),
        "{stderr}"
    );
}

#[test]
fn other_ranks_give_up_on_a_rank_zero_that_never_comes() {
    if !mpich_installed("other_ranks_give_up_on_a_rank_zero_that_never_comes") {
        return;
    }
    let gang = Gang::new(2);
    let child = gang.start(1, &["--connect-timeout-secs", "1", "--", "./allreduce"]);
    let output = wait(child, "rank 1 alone");
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "rank 0's mpiexec at 127.0.0.1:{} could not be reached within 1s",
            gang.port
        )),
        "{stderr}"
    );
}

#[test]
fn a_task_outside_a_gang_is_told_which_variable_is_missing() {
    // No MPICH needed: the environment is read first.
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Command::new(AGENT)
        .args(["mpirun", "--", "./allreduce"])
        .env_clear()
        .env("PELOTON_GANG_RANK", "0")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.starts_with("peloton-agent mpirun: PELOTON_GANG_SIZE: is not set"),
        "{stderr}"
    );
}

#[test]
fn a_missing_mpich_binary_is_named() {
    // No MPICH needed: the binaries are given as paths that do not exist.
    let dir = tempfile::tempdir().expect("tempdir");
    for (rank, flag, what) in [
        (0, "--mpiexec", "MPICH's hydra mpiexec"),
        (1, "--proxy", "hydra's proxy"),
    ] {
        let missing = dir.path().join("no-such-binary");
        let output = Command::new(AGENT)
            .arg("mpirun")
            .arg(flag)
            .arg(&missing)
            .args(["--", "./allreduce"])
            .env_clear()
            .envs(gang_env(2, rank, free_port()))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("run");
        assert_eq!(output.status.code(), Some(1), "rank {rank}");
        let stderr = text(&output.stderr);
        assert!(
            stderr.starts_with(&format!(
                "peloton-agent mpirun: cannot run {what} {}: ",
                missing.display()
            )) && stderr.contains("apt-get install mpich"),
            "rank {rank}: {stderr}"
        );
    }
}

/// The whole path: a real server and three agents; a gang job of 4
/// (`rendezvous: {framework: mpi, port: mpi}`) whose every member runs
/// `"$PELOTON_AGENT_BIN" mpirun -- allreduce`: the server chooses rank 0's
/// `mpi` port at placement, each agent gives its member the rendezvous,
/// rank 0 runs `mpiexec`, the others its proxies; MPI_Allreduce sums to 10
/// in every rank (their output comes out of rank 0's `mpiexec`) and the
/// job succeeds. No ssh, no hand-set environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mpi_gang_through_the_scheduler_allreduces_with_mpiexec_in_rank_zero() {
    if !mpich_installed("an_mpi_gang_through_the_scheduler_allreduces_with_mpiexec_in_rank_zero") {
        return;
    }
    let cluster = common::Cluster::start(3).await;
    let program = compile(cluster.dir.path());
    let mut task = common::task_spec(&format!(
        "exec \"$PELOTON_AGENT_BIN\" mpirun -- {}",
        program.display()
    ));
    task.ports = vec![v1::PortSpec { name: "mpi".into() }];
    task.max_instances_per_host = 2;
    let mut spec = common::job("mpi", 4, task);
    spec.sla.as_mut().expect("sla").min_running_instances = 4;
    spec.rendezvous = Some(v1::RendezvousSpec {
        framework: "mpi".into(),
        port: "mpi".into(),
    });
    let id = cluster.create(spec).await;
    let state = common::eventually("the job to end", async || {
        let state = cluster.job(&id).await?.status?.state();
        matches!(
            state,
            v1::JobState::Succeeded | v1::JobState::Failed | v1::JobState::Killed
        )
        .then_some(state)
    })
    .await;
    if state != v1::JobState::Succeeded {
        let mut said = String::new();
        for i in 0..4 {
            let tasks = cluster.tasks(&id).await;
            said.push_str(&format!(
                "instance {i}: {:?}\nstdout: {}\nstderr: {}\n",
                tasks[i as usize].current.as_ref().map(|r| &r.reason),
                cluster.logs(&id, i, false).await,
                cluster.logs(&id, i, true).await
            ));
        }
        panic!("job ended {state:?}:\n{said}");
    }
    // mpiexec forwards every rank's output to rank 0's; each rank ran with
    // its own member's environment.
    let out = cluster.logs(&id, 0, false).await;
    for i in 0..4 {
        assert!(
            out.contains(&format!("rank {i} of 4: sum 10, gang rank {i},")),
            "rank {i}: {out:?}"
        );
    }
}
