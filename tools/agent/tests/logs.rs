//! Logs through the CLI on a real cluster (pelotond and agents running
//! real processes): the last lines, the output written since a time, each
//! line's time, and every instance's output at once, each line after its
//! instance.

mod common;

use common::*;
use pb::JobState as J;
use peloton_proto::v1 as pb;

async fn cli_out(cluster: &Cluster, args: &[&str]) -> String {
    let out = cluster
        .cli()
        .args(args)
        .output()
        .await
        .expect("peloton runs");
    assert!(
        out.status.success(),
        "peloton {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `(time, text)` of each line of `--timestamps` output.
fn stamped(out: &str) -> Vec<(String, String)> {
    out.lines()
        .map(|l| {
            let (time, text) = l.split_once(' ').expect("time, then the line");
            assert!(time.ends_with('Z') && time.contains('T'), "{l}");
            (time.to_owned(), text.to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_tail_since_timestamps_and_every_instance() {
    let cluster = Cluster::start(1).await;
    // Three lines, a pause longer than the agent's output sampling (1 s),
    // then two more.
    let id = cluster
        .create(job(
            "logs",
            2,
            task_spec(
                "i=$PELOTON_INSTANCE_ID; echo $i a1; echo $i a2; echo $i a3; sleep 2.5; \
                 echo $i b1; printf '%s b2' $i",
            ),
        ))
        .await;
    cluster.wait_job(&id, J::Succeeded).await;

    // The whole output, as written (the last line has no newline).
    assert_eq!(
        cli_out(&cluster, &["task", "logs", &id, "0"]).await,
        "0 a1\n0 a2\n0 a3\n0 b1\n0 b2"
    );
    // The last two lines.
    assert_eq!(
        cli_out(&cluster, &["task", "logs", &id, "0", "--tail", "2"]).await,
        "0 b1\n0 b2"
    );
    // Each line after when it was written: the pause shows.
    let lines = stamped(&cli_out(&cluster, &["task", "logs", &id, "0", "--timestamps"]).await);
    let texts: Vec<&str> = lines.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(texts, ["0 a1", "0 a2", "0 a3", "0 b1", "0 b2"]);
    assert!(lines[2].0 < lines[3].0, "{lines:?}");
    assert_eq!(lines[3].0, lines[4].0, "{lines:?}");
    // Since the time of the later lines: only they.
    let since = lines[3].0.clone();
    assert_eq!(
        cli_out(&cluster, &["task", "logs", &id, "0", "--since", &since]).await,
        "0 b1\n0 b2"
    );
    // Every instance, each line after its instance; the same with
    // `job logs`, and with --follow of a job that has ended.
    let all = cli_out(&cluster, &["task", "logs", &id, "--tail", "1"]).await;
    assert_eq!(all, "[0] 0 b2\n[1] 1 b2\n");
    let all = cli_out(&cluster, &["job", "logs", &id]).await;
    for i in 0..2 {
        for l in ["a1", "a2", "a3", "b1", "b2"] {
            assert!(all.contains(&format!("[{i}] {i} {l}\n")), "{all}");
        }
    }
    assert_eq!(all.lines().count(), 10, "{all}");
    let followed = cli_out(&cluster, &["job", "logs", &id, "-f", "-t"]).await;
    let mut texts: Vec<String> = stamped(&followed).into_iter().map(|(_, t)| t).collect();
    texts.sort();
    assert_eq!(texts.len(), 10, "{followed}");
    assert_eq!(texts[0], "[0] 0 a1");
    assert_eq!(texts[9], "[1] 1 b2");
    // A tail past the bound is refused by the CLI, naming it.
    let out = cluster
        .cli()
        .args(["task", "logs", &id, "0", "--tail", "100001"])
        .output()
        .await
        .expect("peloton runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tail"));
}
