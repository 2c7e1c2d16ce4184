"""Start a PySpark driver whose executors run on Peloton.

    from peloton_spark import session
    sc = session("peloton://127.0.0.1:5391", "target/spark/peloton-spark.jar",
                 {"spark.peloton.pool": "/batch/spark", "spark.executor.instances": "2"})

Why not plain ``SparkContext(master="peloton://…")``: pyspark starts its JVM through
spark-submit, which refuses masters it does not know ("Master must either be yarn or start with
spark, k8s, or local") and would be handed every SparkConf entry as ``--conf``. So the JVM is
started first with no configuration, with the plugin jar on the driver's class path, and the
context is created in it afterwards: the master URL then only reaches SparkContext, which finds
the Peloton cluster manager through Java's ServiceLoader.
"""

import os
import shlex
import sys

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway

__all__ = ["session"]


def session(master, jar, conf=None, submit_args=()):
    """A SparkContext on ``master`` (``peloton://HOST:PORT``).

    ``jar``: the plugin (``tools/spark/build.sh`` prints its path).
    ``conf``: Spark settings (``spark.peloton.pool`` and the like; values are turned into strings).
    A secure server (the default) wants ``spark.peloton.caFile`` (or ``PELOTON_CA_FILE``) and a
    token from ``spark.peloton.tokenFile``, ``PELOTON_TOKEN`` or ``PELOTON_TOKEN_FILE``, never
    the token itself in ``conf`` (tools/spark/README.md, "Security").
    ``submit_args``: extra spark-submit options for the driver JVM itself (``--driver-memory 2g``),
    which SparkConf can no longer change once the JVM runs.

    One context at a time per Python process (as always with pyspark). pyspark keeps its JVM
    after ``sc.stop()``: a later call reuses it, so the first call's jar and ``submit_args`` stay.
    """
    if not master.startswith("peloton://"):
        raise ValueError("not a Peloton master URL: %r (expected peloton://HOST:PORT)" % master)
    jar = os.path.abspath(jar)
    if not os.path.isfile(jar):
        raise FileNotFoundError("no plugin jar at %s (run tools/spark/build.sh)" % jar)

    # Executors run Python workers with the driver's interpreter unless told otherwise; the
    # interpreter's own path (not a shim such as pyenv's) works in a task's bare environment.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    gateway = SparkContext._gateway
    if gateway is None:
        os.environ["PYSPARK_SUBMIT_ARGS"] = " ".join(
            ["--driver-class-path", _quote(jar), *map(_quote, submit_args), "pyspark-shell"]
        )
        gateway = launch_gateway()  # no conf: nothing reaches spark-submit as --conf

    spark_conf = SparkConf().setMaster(master)
    for key, value in (conf or {}).items():
        spark_conf.set(key, _text(value))
    return SparkContext(conf=spark_conf, gateway=gateway)


def _text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _quote(word):
    """For PYSPARK_SUBMIT_ARGS, which pyspark splits as a shell would."""
    return shlex.quote(str(word))
