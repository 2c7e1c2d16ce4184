#!/usr/bin/env bash
# Replay a bigsmall workload (gen.py's CSV) through a private Slurm cluster of
# 16 nodes x 8 cpus on this machine, once per scheduling policy, and write the
# figures (see README.md) as a JSON array, one object per policy.
#
#   scripts/bigsmall/slurm.sh [--trace FILE] [--scale N] [--policies "builtin backfill"]
#                             [--out FILE] [--jobs-dir DIR] [--keep]
#
# Needs root (namespaces, apt-get). Installs slurmctld, slurmd, slurm-client and
# faketime from Debian if missing. Each policy runs in its own network, pid,
# mount and uts namespaces (only loopback inside, so Slurm's ports are private)
# under `faketime -m -f "+0 xN"`, so Slurm's clock and all its intervals run N
# times faster than the real one; its files live in a temp dir removed at the
# end (--keep keeps it). Ending the namespace's first process kills everything
# in it, so nothing outlives the run, also on failure or Ctrl-C.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
trace="$here/workload.csv"
scale=10
policies="builtin backfill"
out="$here/slurm-results.json"
jobs_dir=""
keep=0
sample_s=5

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --trace) trace="$2"; shift 2 ;;
    --scale) scale="$2"; shift 2 ;;
    --policies) policies="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --jobs-dir) jobs_dir="$2"; shift 2 ;;
    --sample-s) sample_s="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "slurm.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done
case "$scale" in ''|*[!0-9]*) echo "slurm.sh: --scale must be a whole number >= 1, got '$scale'" >&2; exit 2 ;; esac
if [ "$scale" -lt 1 ] || [ "$scale" -gt 60 ]; then echo "slurm.sh: --scale must be in 1..60, got $scale" >&2; exit 2; fi
for p in $policies; do
  case "$p" in builtin|backfill) ;; *) echo "slurm.sh: unknown policy '$p' (builtin, backfill)" >&2; exit 2 ;; esac
done
[ -r "$trace" ] || { echo "slurm.sh: cannot read trace $trace" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "slurm.sh: must run as root (namespaces, apt-get)" >&2; exit 2; }

need=()
for c in slurmctld slurmd sbatch faketime unshare ip; do command -v "$c" >/dev/null || need+=("$c"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "slurm.sh: installing Slurm and faketime (missing: ${need[*]})" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q slurmctld slurmd slurm-client faketime iproute2 >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q slurmctld slurmd slurm-client faketime iproute2 >/dev/null; }
fi
# Debian's packages may start their own daemons on install where services run;
# this script uses its own config and ports inside a namespace, so those do not matter.

work="$(mktemp -d /tmp/bigsmall-slurm.XXXXXX)"
child=""
cleanup() {
  # $child is `timeout`: TERM makes it pass TERM on to unshare, whose death
  # (--kill-child) kills the namespace's first process and so all in it.
  if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$child" 2>/dev/null || break; sleep 1; done
    kill -KILL "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  if [ "$keep" = 1 ]; then echo "slurm.sh: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Real-time budget per policy: the trace's span plus an hour of drain, scaled, plus start-up.
last_submit="$(awk -F, 'NR>1 && $2>m {m=$2} END {print m+0}' "$trace")"
budget=$(( (last_submit + 3600) / scale + 300 ))

# Inside the namespaces: loopback up, plus a second loopback address so that
# getaddrinfo(AI_ADDRCONFIG), which ignores 127.0.0.1 itself, lets slurmctld
# bind; a hostname and an /etc/hosts of its own (bind-mounted in the private
# mount namespace only), and a /dev/shm of its own for faketime's shared clock
# (named by pid, which repeats in a new pid namespace). bash stays the namespace's first process (no exec) so
# that it reaps the orphans slurmstepd leaves behind.
inner='ip link set lo up && ip addr add 127.0.0.2/8 dev lo &&
  hostname bigsmall && printf "127.0.0.1 localhost bigsmall\n" > "$1/hosts" &&
  mount --bind "$1/hosts" /etc/hosts && mount -t tmpfs -o size=16m bigsmall-shm /dev/shm && shift &&
  faketime -m -f "+0 x$0" python3 "$@"; exit $?'

results=()
for p in $policies; do
  d="$work/$p"
  mkdir -p "$d"
  echo "slurm.sh: $p: replaying $(basename "$trace") at x$scale (at most ${budget}s)..." >&2
  t0=$(date +%s)
  timeout --kill-after=30 "$budget" \
    unshare --net --pid --mount --uts --fork --kill-child --mount-proc -- \
    bash -c "$inner" \
    "$scale" "$d" "$here/slurm_run.py" --trace "$trace" --policy "$p" --dir "$d" --scale "$scale" --sample-s "$sample_s" &
  child=$!
  rc=0
  wait "$child" || rc=$?
  child=""
  if [ "$rc" -ne 0 ]; then
    echo "slurm.sh: $p failed (exit $rc); last lines of the controller's log:" >&2
    tail -n 20 "$d/log/slurmctld.log" >&2 2>/dev/null || true
    tail -n 20 "$d/log/daemons.out" >&2 2>/dev/null || true
    exit 1
  fi
  echo "slurm.sh: $p done in $(( $(date +%s) - t0 ))s" >&2
  results+=("$d/result.json")
  if [ -n "$jobs_dir" ]; then mkdir -p "$jobs_dir" && cp "$d/result.json" "$jobs_dir/slurm-$p.json"; fi
done

python3 - "$out" "$trace" "$(slurmctld -V | awk '{print $2}')" "${results[@]}" <<'PY'
import json, os, sys, time
out, trace, version, paths = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
runs = []
for p in paths:
    s = json.load(open(p))["summary"]
    s["trace"] = os.path.basename(trace)
    s["slurm_version"] = version
    s["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    runs.append(s)
with open(out, "w") as f:
    json.dump(runs, f, indent=1)
    f.write("\n")
cols = [("policy", "{}"), ("jobs", "{}"), ("gang_wait_max_s", "{:.0f}"), ("gang_wait_median_s", "{:.0f}"),
        ("small_wait_median_s", "{:.0f}"), ("small_wait_p90_s", "{:.0f}"), ("utilization", "{:.3f}"),
        ("makespan_s", "{:.0f}"), ("estimate_error_median_gang", "{}"), ("estimate_error_median_small", "{}")]
heads = ["policy", "jobs", "gang max", "gang med", "small med", "small p90", "util", "makespan", "est.err gang", "est.err small"]
rows = [[f.format(r[k]) if r.get(k) is not None else "-" for k, f in cols] for r in runs]
w = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(heads)]
print("  ".join(h.rjust(w[i]) for i, h in enumerate(heads)))
for row in rows:
    print("  ".join(c.rjust(w[i]) for i, c in enumerate(row)))
print(f"(trace seconds; wrote {out})")
PY
