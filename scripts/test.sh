#!/usr/bin/env bash
# The project's tests, as the README's quick start gives them: installs what
# the suites need and is missing (a JDK, the pinned pyspark, Python's grpcio,
# PostgreSQL, Chromium, perl, a C++ compiler for libFuzzer, MPICH), then runs
#   cargo test --workspace            (unit, property, snapshot, service, CLI,
#                                      agent and browser suites; the fuzz
#                                      corpus replay)
#   the service's suites again on PostgreSQL (one suite, two stores).
# The suites fail rather than skip when what they need is missing, so a
# green run means every one of them ran. CI (.ci/run) calls this same
# script after formatting and lints.
#
# System packages come from apt-get (as root, or through sudo); Python
# packages from pip. PELOTON_TEST_NO_INSTALL=1 skips the installs.
# Arguments are passed to both cargo test commands (e.g. --locked).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s ===\n' "$*"; df -h . 2>/dev/null | tail -1 || true; }

apt_install() {
    local run=()
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            run=(sudo -n)
        else
            echo "need root or sudo to install: $*" >&2
            return 1
        fi
    fi
    DEBIAN_FRONTEND=noninteractive "${run[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${run[@]}" apt-get install -y -qq "$@"
}

pip_install() {
    python3 -m pip install --quiet --disable-pip-version-check "$@"
}

have_pg() {
    command -v initdb >/dev/null 2>&1 && return 0
    command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ] && return 0
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}

if [ "${PELOTON_TEST_NO_INSTALL:-0}" != 1 ]; then
    step "what the suites need"
    missing=()
    command -v c++ >/dev/null 2>&1 || missing+=(g++)          # libFuzzer (fuzz corpus replay)
    command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)   # Spark executors
    command -v perl >/dev/null 2>&1 || missing+=(perl)
    command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-pip)
    have_pg || missing+=(postgresql)                          # the second store
    if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpiexec.hydra >/dev/null 2>&1; then
        missing+=(mpich libmpich-dev)                         # the agent's mpirun (tests/mpi.rs)
    fi
    if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
        missing+=(chromium)                                   # the console's browser test
    fi
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "installing: ${missing[*]}"
        apt_install "${missing[@]}"
    fi
    PYSPARK_VERSION="$(cat tools/spark/PYSPARK_VERSION)"
    if ! python3 -c "import pyspark, sys; sys.exit(pyspark.__version__ != '$PYSPARK_VERSION')" 2>/dev/null; then
        pip_install "pyspark==$PYSPARK_VERSION"
    fi
    if ! python3 -c "import grpc, grpc_tools" 2>/dev/null; then
        pip_install grpcio grpcio-tools                       # examples/python/client.py
    fi
    java -version 2>&1 | head -1
    python3 -c "import pyspark, grpc; print('pyspark', pyspark.__version__, '| grpcio', grpc.__version__)"
fi
# The Spark tests fail (rather than skip) without a JDK and pyspark, the MPI
# tests without MPICH.
export PELOTON_REQUIRE_SPARK=1
export PELOTON_REQUIRE_MPI=1
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step "cargo test --workspace"
cargo test --workspace "$@"

step "the service's suites again, on PostgreSQL (one suite, two stores)"
# Every gateway suite whose servers come from tests/common (the full-disk
# suite is the embedded store's own; store and failover already run on both).
PELOTON_TEST_STORE=postgres cargo test -p peloton-gateway "$@" \
    --test agent_shell --test apps --test contract --test fairness --test history \
    --test hostpools --test http --test invalid --test jobs --test lifecycle --test metrics \
    --test pools --test recovery --test secrets --test security --test shares --test updates --test watch

step "tests done"
