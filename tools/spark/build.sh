#!/usr/bin/env bash
# Builds the Spark cluster manager for Peloton: tools/spark/src → peloton-spark.jar.
#
#   tools/spark/build.sh [OUT_DIR]      (default: <repo>/target/spark)
#
# Compiles against the jars of the installed pyspark (no Maven, no downloads),
# for Java 17, and prints the jar's path on its last line. Works from any
# directory; a relative OUT_DIR is taken from the current directory.
# Environment: PYTHON (default python3) finds pyspark; JAVAC and JAR override
# the JDK tools.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/target/spark}"

die() { echo "build.sh: $*" >&2; exit 1; }

javac="${JAVAC:-javac}"
jar="${JAR:-jar}"
python="${PYTHON:-python3}"
command -v "$javac" >/dev/null 2>&1 ||
    die "javac not found: install a JDK 17 or newer (e.g. apt-get install openjdk-17-jdk-headless) or set JAVAC"
command -v "$jar" >/dev/null 2>&1 || die "jar not found (it comes with the JDK); set JAR"
command -v "$python" >/dev/null 2>&1 || die "$python not found: Python with pyspark is needed (set PYTHON)"

pyspark="$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null)" ||
    die "pyspark is not installed for $python (pip install pyspark==4.0.1), or set PYTHON"
jars="$pyspark/jars"
compgen -G "$jars/spark-core_*.jar" >/dev/null ||
    die "no spark-core jar in $jars: is pyspark ($pyspark) complete?"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mapfile -t sources < <(find "$here/src/main/java" -name '*.java' | sort)
[ "${#sources[@]}" -gt 0 ] || die "no Java sources under $here/src/main/java"

"$javac" --release 17 -Xlint:all,-path,-processing -encoding UTF-8 \
    -cp "$jars/*" -d "$work/classes" "${sources[@]}"
cp -R "$here/src/main/resources/." "$work/classes/"

mkdir -p "$out"
out="$(cd "$out" && pwd)"
"$jar" cf "$out/peloton-spark.jar" -C "$work/classes" .
echo "$out/peloton-spark.jar"
