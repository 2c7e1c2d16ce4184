#!/usr/bin/env python3
"""Replay a bigsmall workload CSV through a private Slurm cluster (one policy).

Run by slurm.sh, which puts this process inside its own network, pid and
mount namespaces and under libfaketime (`faketime -m -f "+0 xSCALE"`): every
clock this process and the Slurm daemons read runs SCALE times faster than
the real one, so one second of their time is one second of trace time, and
all of Slurm's own intervals (bf_interval, time limits, timeouts) keep their
trace-time meaning. Job bodies sleep on the real clock for duration/SCALE.

What it does, in order:
1. writes slurm.conf for 16 nodes x 8 cpus (n01..n16 on 127.0.0.1, one port
   each) into --dir, starts slurmctld and 16 `slurmd -N nXX` there;
2. submits each CSV row with sbatch at its submit_s (relative to the start),
   declaring its true duration as the time limit (rounded up to whole
   minutes: Slurm's limits are in minutes);
3. samples `squeue --start` every --sample-s while jobs wait (first estimate
   each waiting job gets);
4. waits for the queue to drain, reads the jobcomp/filetxt log and writes the
   per-job records and the summary (--dir/result.json);
5. stops the daemons (the pid namespace reaps anything left).
"""

import argparse
import csv
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

HOSTS = 16
CPUS = 8
NODES = [f"n{i:02d}" for i in range(1, HOSTS + 1)]
FIELDS = ["id", "submit_s", "kind", "hosts", "cpus_per_host", "duration_s"]
# A job's limits: a wait or run beyond these means a broken replay, not data.
MAX_DURATION_S = 24 * 3600
MAX_SUBMIT_S = 7 * 24 * 3600

SCHEDULERS = {"builtin": "sched/builtin", "backfill": "sched/backfill"}


def log(msg):
    print(f"[slurm_run {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- workload


def read_trace(path):
    """Rows of the CSV as dicts of ints (kind stays a string), validated."""
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        if r.fieldnames != FIELDS:
            raise SystemExit(f"{path}: header must be {','.join(FIELDS)}, got {r.fieldnames}")
        jobs = []
        for line, row in enumerate(r, start=2):
            job = {"kind": row["kind"]}
            for k in FIELDS:
                if k == "kind":
                    continue
                try:
                    job[k] = int(row[k])
                except (TypeError, ValueError):
                    raise SystemExit(f"{path}:{line}: {k} must be an integer, got {row[k]!r}")
            if job["kind"] not in ("small", "gang"):
                raise SystemExit(f"{path}:{line}: kind must be small or gang, got {job['kind']!r}")
            if not 1 <= job["hosts"] <= HOSTS:
                raise SystemExit(f"{path}:{line}: hosts must be in 1..{HOSTS}, got {job['hosts']}")
            if not 1 <= job["cpus_per_host"] <= CPUS:
                raise SystemExit(f"{path}:{line}: cpus_per_host must be in 1..{CPUS}, got {job['cpus_per_host']}")
            if not 1 <= job["duration_s"] <= MAX_DURATION_S:
                raise SystemExit(f"{path}:{line}: duration_s must be in 1..{MAX_DURATION_S}")
            if not 0 <= job["submit_s"] <= MAX_SUBMIT_S:
                raise SystemExit(f"{path}:{line}: submit_s must be in 0..{MAX_SUBMIT_S}")
            jobs.append(job)
    if not jobs:
        raise SystemExit(f"{path}: no jobs")
    if len({j["id"] for j in jobs}) != len(jobs):
        raise SystemExit(f"{path}: ids must be unique")
    jobs.sort(key=lambda j: (j["submit_s"], j["id"]))
    return jobs


# ---------------------------------------------------------------- cluster


def slurm_conf(d, policy):
    """slurm.conf text: everything under d, nothing shared with the host."""
    sched_params = ",".join(
        [
            # Backfill every trace second, to the second, up to 4 h ahead.
            "bf_interval=1",
            "bf_resolution=1",
            "bf_window=240",
            "bf_max_job_test=2000",
            # The main scheduler looks at the whole queue on every event and
            # runs at least every 5 s; no rate limit.
            "default_queue_depth=2000",
            "sched_interval=5",
            "sched_min_interval=0",
            # Schedule a batch job as soon as it is submitted (default: up to 3 s later).
            "batch_sched_delay=0",
        ]
    )
    return f"""# Written by scripts/bigsmall/slurm_run.py: a private 16 x 8 cpu cluster.
ClusterName=bigsmall
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=error
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.txt
MpiDefault=none
SwitchType=switch/none
PriorityType=priority/basic
SchedulerType={SCHEDULERS[policy]}
SchedulerParameters={sched_params}
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
# Generous timeouts: they are in trace seconds, and the machine is shared.
MessageTimeout=100
TCPTimeout=60
SlurmdTimeout=3000
SlurmctldTimeout=3000
BatchStartTimeout=600
# A job is never killed for running past its limit by launch overhead.
OverTimeLimit=1
KillWait=5
MinJobAge=3600
NodeName=n[01-{HOSTS:02d}] NodeAddr=127.0.0.1 Port=[17001-{17000 + HOSTS}] CPUs={CPUS} Sockets=1 CoresPerSocket={CPUS} ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


def run(cmd, check=True, timeout=60):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p


class Cluster:
    def __init__(self, d, policy):
        self.d = d
        self.policy = policy
        self.procs = []
        self.conf = os.path.join(d, "slurm.conf")

    def start(self):
        for sub in ("state", "spool", "log"):
            os.makedirs(os.path.join(self.d, sub), exist_ok=True)
        for n in NODES:
            os.makedirs(os.path.join(self.d, "spool", n), exist_ok=True)
        with open(self.conf, "w") as f:
            f.write(slurm_conf(self.d, self.policy))
        os.environ["SLURM_CONF"] = self.conf
        out = open(os.path.join(self.d, "log", "daemons.out"), "w")
        self.procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", self.conf], stdout=out, stderr=out))
        self._wait("slurmctld answers", lambda: run(["scontrol", "ping"], check=False).stdout.count("UP") > 0)
        for n in NODES:
            self.procs.append(subprocess.Popen(["slurmd", "-D", "-f", self.conf, "-N", n], stdout=out, stderr=out))
        self._wait(f"{HOSTS} nodes idle", self._all_idle)

    def _all_idle(self):
        p = run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
        return len(states) == HOSTS and all(s == "idle" for s in states.values())

    def _wait(self, what, ok, limit_s=600):
        # limit in trace seconds (faketime): 60 real s at scale 10.
        t0 = time.time()
        while time.time() - t0 < limit_s:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode} while waiting for {what}; see {self.d}/log")
            if ok():
                log(f"{what} after {time.time() - t0:.0f} s")
                return
            time.sleep(2)
        raise RuntimeError(f"timed out waiting for {what}; see {self.d}/log")

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 100
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# ---------------------------------------------------------------- replay


def time_limit(duration_s):
    """sbatch --time for a true duration: Slurm keeps limits in whole minutes."""
    return str(max(1, math.ceil(duration_s / 60)))


def sbatch_cmd(job, scale):
    body = f"exec env -u LD_PRELOAD -u FAKETIME sleep {job['duration_s'] / scale:.3f}"
    cmd = [
        "sbatch", "--parsable", "-J", f"b{job['id']}", "-o", "/dev/null",
        "-N", str(job["hosts"]), "--ntasks-per-node=1", "-c", str(job["cpus_per_host"]),
        "-t", time_limit(job["duration_s"]),
    ]
    if job["kind"] == "gang":
        cmd.append("--exclusive")
    return cmd + ["--wrap", body]


class Sampler(threading.Thread):
    """Polls `squeue --start` and keeps each pending job's first estimate."""

    def __init__(self, every_s):
        super().__init__(daemon=True)
        self.every_s = every_s
        self.first = {}  # slurm job id -> (sample time, estimated start)
        self.seen_pending = set()
        self.samples = 0
        self.stopping = threading.Event()

    def run(self):
        # time.sleep, not Event.wait: libfaketime scales sleeps, but a
        # timed lock wait would wait on the real clock for a fake deadline.
        while True:
            time.sleep(self.every_s)
            if self.stopping.is_set():
                return
            now = time.time()
            p = run(["squeue", "-h", "--start", "-t", "PD", "-o", "%i %S"], check=False)
            if p.returncode != 0:
                continue
            self.samples += 1
            for line in p.stdout.splitlines():
                parts = line.split()
                if len(parts) != 2:
                    continue
                jid, start = parts
                self.seen_pending.add(jid)
                if jid in self.first or start in ("N/A", "Unknown"):
                    continue
                try:
                    est = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
                except ValueError:
                    continue
                self.first[jid] = (now, est)


def replay(jobs, scale, sample_s):
    """Submits jobs at their times; returns slurm id -> trace job, submit lags, sampler."""
    sampler = Sampler(sample_s)
    sampler.start()
    by_slurm_id = {}
    lags = []
    t0 = time.time() + 2
    for i, job in enumerate(jobs):
        due = t0 + job["submit_s"]
        now = time.time()
        if due > now:
            time.sleep(due - now)
        lags.append(time.time() - due)
        p = run(sbatch_cmd(job, scale))
        by_slurm_id[p.stdout.strip().split(";")[0]] = job
        if i % 100 == 0:
            log(f"submitted {i + 1}/{len(jobs)} (trace {job['submit_s']} s, lag {lags[-1]:.1f} s)")
    log(f"all {len(jobs)} submitted; max submit lag {max(lags):.1f} trace s")
    while True:
        p = run(["squeue", "-h", "-o", "%i"], check=False)
        if p.returncode == 0 and not p.stdout.strip():
            break
        time.sleep(10)
    sampler.stopping.set()
    sampler.join()
    return by_slurm_id, lags, sampler


def read_jobcomp(path):
    """jobcomp/filetxt lines as dicts keyed by slurm job id."""
    out = {}
    with open(path) as f:
        for line in f:
            rec = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            out[rec["JobId"]] = rec
    return out


def ts(s):
    return time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%S"))


# ---------------------------------------------------------------- metrics


def pct(xs, q):
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(q / 100 * len(xs)) - 1)]


def summarize(policy, records, sampler_first, seen_pending, min_wait_s):
    gangs = [r for r in records if r["kind"] == "gang"]
    small = [r for r in records if r["kind"] == "small"]
    first_submit = min(r["submit"] for r in records)
    last_end = max(r["end"] for r in records)
    makespan = last_end - first_submit
    busy = sum(r["cpus"] * (r["end"] - r["start"]) for r in records)
    res = {
        "policy": policy,
        "jobs": len(records),
        "gangs": len(gangs),
        "gang_wait_max_s": max(r["wait"] for r in gangs) if gangs else None,
        "gang_wait_median_s": statistics.median(r["wait"] for r in gangs) if gangs else None,
        "small_wait_median_s": statistics.median(r["wait"] for r in small) if small else None,
        "small_wait_p90_s": pct([r["wait"] for r in small], 90) if small else None,
        "utilization": round(busy / (HOSTS * CPUS * makespan), 4),
        "makespan_s": makespan,
        "run_overrun_median_s": statistics.median(r["end"] - r["start"] - r["duration_s"] for r in records),
        "run_overrun_max_s": max(r["end"] - r["start"] - r["duration_s"] for r in records),
    }
    # Start estimates: the first `squeue --start` estimate each job that waited
    # at least min_wait_s got, against when it really started; error as a
    # fraction of its wait ("late" > 0: it started after the estimate).
    for kind, rs in (("gang", gangs), ("small", small)):
        waited = [r for r in rs if r["wait"] >= min_wait_s]
        errs = []
        signed = []
        for r in waited:
            got = sampler_first.get(r["slurm_id"])
            if got is None:
                continue
            _, est = got
            errs.append(abs(r["start"] - est) / r["wait"])
            signed.append((r["start"] - est) / r["wait"])
        res[f"estimate_waited_{kind}"] = len(waited)
        res[f"estimate_waited_seen_pending_{kind}"] = sum(1 for r in waited if r["slurm_id"] in seen_pending)
        res[f"estimate_covered_{kind}"] = len(errs)
        res[f"estimate_error_median_{kind}"] = round(statistics.median(errs), 3) if errs else None
        res[f"estimate_late_median_{kind}"] = round(statistics.median(signed), 3) if signed else None
    return res


def main():
    ap = argparse.ArgumentParser(description="Replay one policy; run through slurm.sh.")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--policy", choices=sorted(SCHEDULERS), required=True)
    ap.add_argument("--dir", required=True, help="private working directory (exists, empty)")
    ap.add_argument("--scale", type=float, required=True, help="the faketime speed-up this runs under")
    ap.add_argument("--sample-s", type=float, default=5.0, help="squeue --start period (trace s)")
    ap.add_argument("--estimate-min-wait-s", type=float, default=10.0,
                    help="estimate errors count jobs that waited at least this long (trace s)")
    args = ap.parse_args()

    jobs = read_trace(args.trace)
    cluster = Cluster(args.dir, args.policy)
    wall0 = time.monotonic()
    try:
        cluster.start()
        by_slurm_id, lags, sampler = replay(jobs, args.scale, args.sample_s)
    finally:
        cluster.stop()

    comp = read_jobcomp(os.path.join(args.dir, "jobcomp.txt"))
    records = []
    for sid, job in by_slurm_id.items():
        rec = comp.get(sid)
        if rec is None:
            raise SystemExit(f"job {sid} (trace id {job['id']}) missing from the jobcomp log")
        if rec.get("JobState") != "COMPLETED":
            raise SystemExit(f"job {sid} (trace id {job['id']}) ended {rec.get('JobState')}, not COMPLETED")
        submit, start, end = ts(rec["SubmitTime"]), ts(rec["StartTime"]), ts(rec["EndTime"])
        records.append(
            {
                "id": job["id"], "slurm_id": sid, "kind": job["kind"], "duration_s": job["duration_s"],
                "cpus": int(rec["ProcCnt"]), "nodes": rec["NodeList"],
                "submit": submit, "start": start, "end": end, "wait": start - submit,
            }
        )
    want_cpus = {j["id"]: j["hosts"] * j["cpus_per_host"] for j in jobs}
    bad = [r["id"] for r in records if r["cpus"] != want_cpus[r["id"]]]
    if bad:
        raise SystemExit(f"jobs got a different cpu count than asked: trace ids {bad[:10]}")

    res = summarize(args.policy, records, sampler.first, sampler.seen_pending, args.estimate_min_wait_s)
    res["estimate_min_wait_s"] = args.estimate_min_wait_s
    res["submit_lag_max_s"] = round(max(lags), 2)
    res["squeue_samples"] = sampler.samples
    res["scale"] = args.scale
    res["wall_s"] = round((time.monotonic() - wall0) / args.scale, 1)
    t_first = min(r["submit"] for r in records)
    per_job = [
        {k: (r[k] - t_first if k in ("submit", "start", "end") else r[k])
         for k in ("id", "kind", "cpus", "duration_s", "submit", "start", "end", "wait")}
        for r in sorted(records, key=lambda r: r["id"])
    ]
    for pj, r in zip(per_job, sorted(records, key=lambda r: r["id"])):
        got = sampler.first.get(r["slurm_id"])
        pj["first_estimate_at"], pj["first_estimate"] = (got[0] - t_first, got[1] - t_first) if got else (None, None)
    with open(os.path.join(args.dir, "result.json"), "w") as f:
        json.dump({"summary": res, "jobs": per_job}, f, indent=1)
    log(json.dumps(res))


if __name__ == "__main__":
    main()
