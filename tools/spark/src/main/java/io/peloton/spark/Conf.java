package io.peloton.spark;

/** The {@code spark.peloton.*} settings (README.md lists them with their meaning). */
final class Conf {
  private Conf() {}

  /**
   * The CA (PEM) that signed the server's certificate; default {@code $PELOTON_CA_FILE}. With a
   * CA the server is reached over https (see {@link PelotonAccess}).
   */
  static final String CA_FILE = "spark.peloton.caFile";
  /**
   * A file holding the bearer token; default {@code $PELOTON_TOKEN}, else the file {@code
   * $PELOTON_TOKEN_FILE}.
   */
  static final String TOKEN_FILE = "spark.peloton.tokenFile";
  /** Refused: a token in Spark's configuration would show in its UI and event logs. */
  static final String TOKEN_FORBIDDEN = "spark.peloton.token";

  /** The leaf pool of a new application job; required unless the driver runs in its job. */
  static final String POOL = "spark.peloton.pool";
  /**
   * The APPLICATION job the driver runs in (cluster mode); by default {@code $PELOTON_JOB_ID}.
   * Set it to the empty string to register a new job from a driver that runs in another job.
   */
  static final String JOB_ID = "spark.peloton.jobId";
  /** The job's owner (default: the driver's user). */
  static final String OWNER = "spark.peloton.owner";
  /** Priority of the executors within their pool (default 0). */
  static final String PRIORITY = "spark.peloton.priority";
  /** Executors are never preempted (default false). */
  static final String NON_PREEMPTIBLE = "spark.peloton.nonPreemptible";
  /** Placement of executors: pack, spread or first_fit (default: the server's, pack). */
  static final String PLACEMENT = "spark.peloton.placement";
  /** {@code spark.peloton.label.KEY=VALUE}: labels of a new job. */
  static final String LABEL_PREFIX = "spark.peloton.label.";

  /** CPUs of one executor task (default {@code spark.executor.cores}). */
  static final String EXECUTOR_CPUS = "spark.peloton.executor.cpus";
  /** Disk of one executor task, MiB (its sandbox: shuffle and spill files). */
  static final String EXECUTOR_DISK_MB = "spark.peloton.executor.diskMb";
  static final long DEFAULT_EXECUTOR_DISK_MB = 1024;
  /** Between the stop signal and SIGKILL, ms. */
  static final String EXECUTOR_KILL_GRACE_MS = "spark.peloton.executor.killGraceMs";
  static final long DEFAULT_KILL_GRACE_MS = 30_000;
  /** A placement constraint of executors, e.g. {@code zone == "z1"}. */
  static final String EXECUTOR_CONSTRAINT = "spark.peloton.executor.constraint";
  /** The java command on executor hosts (default $JAVA_HOME/bin/java of the driver, or java). */
  static final String EXECUTOR_JAVA = "spark.peloton.executor.java";
  /** The directory of Spark's jars on executor hosts (default: the driver's SPARK_HOME/jars). */
  static final String EXECUTOR_SPARK_JARS = "spark.peloton.executor.sparkJars";
  /** The address executors advertise (default: Spark's choice on the executor's host). */
  static final String EXECUTOR_HOSTNAME = "spark.peloton.executor.hostname";

  /**
   * How long, after an executor's connection drops, the driver waits for Peloton to say why it
   * ended before it counts the loss against the application.
   */
  static final String LOSS_REASON_WAIT_MS = "spark.peloton.lossReasonWaitMs";
  static final long DEFAULT_LOSS_REASON_WAIT_MS = 5_000;

  /**
   * When the driver stops, how long its executors get to exit by themselves before the
   * application is unregistered (which stops the rest with the stop signal).
   */
  static final String STOP_WAIT_MS = "spark.peloton.stopWaitMs";
  static final long DEFAULT_STOP_WAIT_MS = 5_000;
}
