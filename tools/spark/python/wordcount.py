#!/usr/bin/env python3
"""A PySpark driver whose executors run on Peloton, with a result known in advance.

    python3 tools/spark/python/wordcount.py peloton://127.0.0.1:5391 target/spark/peloton-spark.jar /batch/spark \\
        --dynamic --max-executors 4 --partitions 8 --sleep 0.5

Two jobs per round: the sum of the squares of 1..N through a map that sleeps (so that the work
lasts long enough to want several executors), and a word count with reduceByKey (a shuffle).
Prints `RESULT <value>` and `EXPECTED <value>` and exits 1 if they differ. With --linger it then
waits for idle executors to go (dynamic allocation) and prints `EXECUTORS_AFTER_IDLE <n>`.

In cluster mode (the driver is instance 0 of a Peloton APPLICATION job), pass "-" as the pool:
the driver registers into its own job ($PELOTON_JOB_ID).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peloton_spark import session  # noqa: E402

WORDS = "the quick brown fox jumps over the lazy dog and the cat sat on the mat".split()


def options(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("master", help="peloton://HOST:PORT")
    p.add_argument("jar", help="peloton-spark.jar (tools/spark/build.sh)")
    p.add_argument("pool", help="the executors' pool, or - in cluster mode")
    p.add_argument("--n", type=int, default=200, help="sum the squares of 1..N (default 200)")
    p.add_argument("--partitions", type=int, default=8, help="partitions per job (default 8)")
    p.add_argument("--sleep", type=float, default=0.2, help="seconds each partition sleeps (default 0.2)")
    p.add_argument("--rounds", type=int, default=1, help="run the jobs this many times (default 1)")
    p.add_argument("--pause", type=float, default=0, help="seconds between rounds (default 0)")
    p.add_argument("--executors", type=int, default=2, help="without --dynamic: executors (default 2)")
    p.add_argument("--dynamic", action="store_true", help="dynamic allocation (with shuffle tracking)")
    p.add_argument("--min-executors", type=int, default=0)
    p.add_argument("--max-executors", type=int, default=4)
    p.add_argument("--idle-timeout", default="5s", help="executor idle timeout (default 5s)")
    p.add_argument("--linger", type=float, default=0,
                   help="after the jobs, wait up to this many seconds for executors to go idle and away")
    p.add_argument("--local", action="store_true",
                   help="driver and executors on 127.0.0.1 (a one-machine cluster)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="any Spark setting")
    p.add_argument("--submit-arg", action="append", default=[], metavar="ARG",
                   help="a spark-submit option for the driver JVM (e.g. --submit-arg=--driver-memory=2g)")
    return p.parse_args(argv)


def spark_conf(args):
    conf = {
        "spark.app.name": "peloton-wordcount",
        "spark.ui.enabled": "false",
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
    }
    if args.pool != "-":
        conf["spark.peloton.pool"] = args.pool
    if args.local:
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.peloton.executor.hostname"] = "127.0.0.1"
    if args.dynamic:
        conf.update({
            "spark.dynamicAllocation.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.timeout": args.idle_timeout,
            "spark.dynamicAllocation.executorIdleTimeout": args.idle_timeout,
            "spark.dynamicAllocation.minExecutors": str(args.min_executors),
            "spark.dynamicAllocation.maxExecutors": str(args.max_executors),
            "spark.dynamicAllocation.schedulerBacklogTimeout": "1s",
        })
    else:
        conf["spark.executor.instances"] = str(args.executors)
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit("--conf wants KEY=VALUE, not %r" % item)
        conf[key] = value
    return conf


def slow_square(delay):
    def square(x):
        time.sleep(delay)
        return x * x
    return square


def run_round(sc, args):
    # Sleeps once per element, spread so that each partition sleeps about --sleep seconds.
    per_element = args.sleep * args.partitions / max(args.n, 1)
    total = sc.parallelize(range(1, args.n + 1), args.partitions).map(slow_square(per_element)).sum()

    lines = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(5)) for i in range(args.n)]
    counts = dict(
        sc.parallelize(lines, args.partitions)
        .flatMap(str.split)
        .map(lambda w: (w, 1))
        .reduceByKey(lambda a, b: a + b, args.partitions)
        .collect()
    )
    return total, counts, lines


def describe(total, counts):
    words = ",".join("%s:%d" % (w, counts[w]) for w in sorted(counts))
    return "sum_of_squares=%d words=%s" % (total, words)


def executors(sc):
    """Executors registered with the driver now (the driver itself excluded)."""
    return max(0, len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1)


def main(argv):
    args = options(argv)
    sc = session(args.master, args.jar, spark_conf(args), submit_args=args.submit_arg)
    ok = True
    try:
        print("APPLICATION %s" % sc.applicationId, flush=True)
        for round_ in range(args.rounds):
            if round_ and args.pause:
                time.sleep(args.pause)
            started = time.time()
            total, counts, lines = run_round(sc, args)
            expected_counts = {}
            for line in lines:
                for w in line.split():
                    expected_counts[w] = expected_counts.get(w, 0) + 1
            expected_total = sum(x * x for x in range(1, args.n + 1))
            result, expected = describe(total, counts), describe(expected_total, expected_counts)
            print("ROUND %d took %.1fs with %d executors" % (round_ + 1, time.time() - started, executors(sc)))
            print("RESULT %s" % result)
            print("EXPECTED %s" % expected, flush=True)
            ok = ok and result == expected
        if args.linger:
            deadline = time.time() + args.linger
            while executors(sc) > args.min_executors and time.time() < deadline:
                time.sleep(0.5)
            print("EXECUTORS_AFTER_IDLE %d" % executors(sc), flush=True)
    finally:
        sc.stop()
    if not ok:
        print("MISMATCH", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
