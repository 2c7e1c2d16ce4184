#!/usr/bin/env python3
"""Generate the "big gangs among small jobs" workload (issue 37) as CSV.

Cluster assumed: 16 hosts x 8 cpus (128 cpus). Two kinds of job arrive over
`--duration-s` seconds of trace time:

- small: a Poisson stream (mean inter-arrival --small-every-s), 1 host,
  1-4 cpus, running uniformly 60-120 s;
- gang: about one every --gang-every-s (gaps uniform in 0.5-1.5 times
  that, so an hour always holds about ten gangs rather than Poisson's 5-15),
  8-12 whole hosts (8 cpus on each), running uniformly 120-300 s.

Output columns: id,submit_s,kind,hosts,cpus_per_host,duration_s (integers),
sorted by submit time then id. Deterministic for a given --seed (stdlib
random.Random). The offered load (cpu-seconds asked / (128 x duration)) is
printed to stderr.
"""

import argparse
import csv
import random
import sys

HOSTS = 16
CPUS_PER_HOST = 8
HEADER = ["id", "submit_s", "kind", "hosts", "cpus_per_host", "duration_s"]


def poisson_times(rng, mean_gap, horizon):
    """Arrival times (integer seconds, < horizon) of a Poisson stream."""
    t = 0.0
    times = []
    while True:
        t += rng.expovariate(1.0 / mean_gap)
        if t >= horizon:
            return times
        times.append(int(t))


def jittered_times(rng, mean_gap, horizon):
    """Arrival times (integer seconds, < horizon) with gaps uniform in 0.5-1.5 x mean_gap."""
    t = 0.0
    times = []
    while True:
        t += rng.uniform(0.5 * mean_gap, 1.5 * mean_gap)
        if t >= horizon:
            return times
        times.append(int(t))


def generate(seed, duration_s, small_every_s, gang_every_s):
    """The workload's rows as dicts, in submission order."""
    # One generator per stream so changing one stream's parameters leaves
    # the other stream identical.
    small_rng = random.Random(f"{seed}-small")
    gang_rng = random.Random(f"{seed}-gang")
    jobs = []
    for t in poisson_times(small_rng, small_every_s, duration_s):
        jobs.append(
            {
                "submit_s": t,
                "kind": "small",
                "hosts": 1,
                "cpus_per_host": small_rng.randint(1, 4),
                "duration_s": small_rng.randint(60, 120),
            }
        )
    for t in jittered_times(gang_rng, gang_every_s, duration_s):
        jobs.append(
            {
                "submit_s": t,
                "kind": "gang",
                "hosts": gang_rng.randint(8, 12),
                "cpus_per_host": CPUS_PER_HOST,
                "duration_s": gang_rng.randint(120, 300),
            }
        )
    # Stable sort: at equal seconds small jobs keep their order before gangs.
    jobs.sort(key=lambda j: j["submit_s"])
    for i, job in enumerate(jobs, start=1):
        job["id"] = i
    return jobs


def offered_load(jobs, duration_s):
    asked = sum(j["hosts"] * j["cpus_per_host"] * j["duration_s"] for j in jobs)
    return asked / (HOSTS * CPUS_PER_HOST * duration_s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration-s", type=int, default=3600, help="submission window (trace s)")
    ap.add_argument("--small-every-s", type=float, default=3.5, help="mean gap between small jobs")
    ap.add_argument("--gang-every-s", type=float, default=360.0, help="mean gap between gangs")
    ap.add_argument("--out", default="-", help="CSV path, - for stdout")
    args = ap.parse_args()
    if args.duration_s <= 0 or args.duration_s > 7 * 24 * 3600:
        ap.error("--duration-s must be in 1..604800")
    if args.small_every_s <= 0 or args.gang_every_s <= 0:
        ap.error("--small-every-s and --gang-every-s must be positive")

    jobs = generate(args.seed, args.duration_s, args.small_every_s, args.gang_every_s)
    out = sys.stdout if args.out == "-" else open(args.out, "w", newline="")
    try:
        w = csv.DictWriter(out, fieldnames=HEADER, lineterminator="\n")
        w.writeheader()
        w.writerows(jobs)
    finally:
        if out is not sys.stdout:
            out.close()
    gangs = sum(1 for j in jobs if j["kind"] == "gang")
    print(
        f"{len(jobs)} jobs ({len(jobs) - gangs} small, {gangs} gangs) over {args.duration_s} s; "
        f"offered load {offered_load(jobs, args.duration_s):.3f} of {HOSTS * CPUS_PER_HOST} cpus",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
