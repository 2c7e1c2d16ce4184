package io.peloton.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.resource.ResourceProfile;
import org.apache.spark.rpc.RpcAddress;
import org.apache.spark.rpc.RpcEndpointAddress;
import org.apache.spark.scheduler.ExecutorLossReason;
import org.apache.spark.scheduler.ExecutorProcessLost;
import org.apache.spark.scheduler.TaskSchedulerImpl;
import org.apache.spark.scheduler.cluster.CoarseGrainedSchedulerBackend;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Option;
import scala.Tuple2;
import scala.collection.Iterator;
import scala.collection.immutable.Seq;
import scala.concurrent.Future;
import scala.jdk.javaapi.CollectionConverters;
import scala.jdk.javaapi.FutureConverters;

/**
 * Runs a Spark application's executors on Peloton.
 *
 * <p>On {@link #start()} the driver registers the application ({@code POST /v1/apps}) with the
 * executors' task spec (see {@link ExecutorSpec}); Peloton answers with the application's id,
 * which is its job's id and becomes Spark's application id. Executors are the job's instances:
 * each runs {@code CoarseGrainedExecutorBackend}, connects back to the driver and registers with
 * its instance number as executor id. From then on:
 *
 * <ul>
 *   <li>Spark's wanted number of executors (dynamic allocation, or {@code
 *       spark.executor.instances}) becomes the application's target, sent with a growing
 *       generation so that a late request never undoes a newer one;
 *   <li>executors Spark lets go are killed by id;
 *   <li>a daemon thread follows the executors' events: why executors wait (logged), and why
 *       they ended. An executor that Peloton preempted or lost with its host is reported to Spark
 *       as not the application's fault, so its running tasks do not count as task failures.
 * </ul>
 *
 * <p>Exit causes and lost connections race: an executor's RPC connection usually drops before
 * Peloton reports its exit. As Spark's YARN backend does, the driver endpoint here does not drop
 * a disconnected executor at once: it disables it (no new tasks; its running ones are put on
 * hold) and waits up to {@code spark.peloton.lossReasonWaitMs} for the exit event, then removes
 * the executor with the right cause, or, without an event, as the application's fault (Spark's
 * default).
 */
public class PelotonSchedulerBackend extends CoarseGrainedSchedulerBackend {
  private static final Logger LOG = LoggerFactory.getLogger(PelotonSchedulerBackend.class);

  /** Calls made while the driver stops are cut short: a dead server must not hold it up. */
  private static final long STOP_CALL_TIMEOUT_MS = 5_000;
  /** A pending reason is logged at most once per this interval. */
  private static final long PENDING_LOG_INTERVAL_MS = 30_000;
  /** Kills that fail are tried again this many times, after 1 s, 2 s, … */
  private static final int KILL_ATTEMPTS = 3;

  // NOTE: CoarseGrainedSchedulerBackend's constructor calls createDriverEndpoint(), before the
  // fields below are set; the endpoint only reads them once executors connect.

  private final SparkContext sc;
  private final PelotonClient client;
  private final ObjectMapper json = new ObjectMapper();
  private final AtomicBoolean stopped = new AtomicBoolean(false);
  private final long lossReasonWaitMs;
  private final long stopWaitMs;
  /** The executors' kill grace period (their stop signal to SIGKILL). */
  private final long killGraceMs;

  /** The registered application's id (its job's id); null until {@link #start()} registered. */
  private volatile String appId;

  /** The generation of the latest target; targets of older generations are dropped. */
  private final AtomicLong generation = new AtomicLong();

  /** The latest target asked for (null before the first), re-sent after reconnecting. */
  private final AtomicReference<Target> latestTarget = new AtomicReference<>();

  /** Executors whose connection dropped, awaiting their exit event: their fallback timers. */
  private final Map<String, ScheduledFuture<?>> awaitingExit = new ConcurrentHashMap<>();

  /**
   * Executors Peloton stopped for reasons not the application's (preemption, a lost host) whose
   * connection has not dropped yet: a preempted executor may still be decommissioning, so Spark
   * keeps it until it disconnects, and then learns this cause.
   */
  private final Map<String, ExecutorLossReason> exitCauses = new ConcurrentHashMap<>();

  /** Runs the fallbacks of {@link #awaitingExit} and kill retries. */
  private final ScheduledExecutorService timers =
      Executors.newSingleThreadScheduledExecutor(
          runnable -> {
            Thread thread = new Thread(runnable, "peloton-scheduler-backend");
            thread.setDaemon(true);
            return thread;
          });

  /** Pending reasons last logged: reason → {time logged, executors not logged since}. */
  private final Map<String, long[]> pendingLogged = new HashMap<>();

  /** Executors launched and not exited (from events); guarded by itself. */
  private final Set<String> liveExecutors = new HashSet<>();

  private final AtomicBoolean warnedProfiles = new AtomicBoolean(false);
  private volatile ExecutorEventWatcher watcher;

  /** A target and the generation it was sent with. */
  private static final class Target {
    final long generation;
    final int total;

    Target(long generation, int total) {
      this.generation = generation;
      this.total = total;
    }
  }

  /**
   * @param scheduler Spark's task scheduler
   * @param sc the application's context
   * @param masterUrl {@code peloton://HOST:PORT}
   */
  public PelotonSchedulerBackend(TaskSchedulerImpl scheduler, SparkContext sc, String masterUrl) {
    super(scheduler, sc.env().rpcEnv());
    this.sc = sc;
    PelotonAccess access;
    try {
      access = PelotonAccess.from(sc.conf(), System.getenv());
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException("Peloton cluster manager: " + e.getMessage(), e);
    }
    this.client = new PelotonClient(masterUrl, access, json);
    if (access.tokenWithheld()) {
      LOG.warn(
          "Peloton at {}: a token is configured but not sent over plain http; set {} (or"
              + " PELOTON_CA_FILE) to the server's CA to reach a secure server over https",
          client.base(),
          Conf.CA_FILE);
    }
    LOG.info("Peloton at {}: {}", client.base(), access.describe());
    this.lossReasonWaitMs =
        sc.conf().getLong(Conf.LOSS_REASON_WAIT_MS, Conf.DEFAULT_LOSS_REASON_WAIT_MS);
    this.stopWaitMs = sc.conf().getLong(Conf.STOP_WAIT_MS, Conf.DEFAULT_STOP_WAIT_MS);
    this.killGraceMs =
        sc.conf().getLong(Conf.EXECUTOR_KILL_GRACE_MS, Conf.DEFAULT_KILL_GRACE_MS);
  }

  // ---------------------------------------------------------------- lifecycle

  /**
   * Registers the application; with dynamic allocation off, also asks for {@code
   * spark.executor.instances} executors (2 by default).
   *
   * @throws IllegalArgumentException if the configuration is incomplete or wrong
   * @throws IllegalStateException if Peloton refused the application or could not be reached (the
   *     message says which)
   */
  @Override
  public void start() {
    super.start();
    SparkConf conf = sc.conf();
    String driverUrl =
        new RpcEndpointAddress(
                conf.get("spark.driver.host"),
                conf.getInt("spark.driver.port", 0),
                CoarseGrainedSchedulerBackend.ENDPOINT_NAME())
            .toString();

    ObjectNode request;
    try {
      request = registerRequest(conf, driverUrl);
    } catch (IllegalArgumentException | IllegalStateException e) {
      throw new IllegalArgumentException("Peloton cluster manager: " + e.getMessage(), e);
    }
    JsonNode app;
    try {
      app = client.register(request);
    } catch (IOException e) {
      throw new IllegalStateException(
          "Peloton cluster manager (spark.master "
              + sc.master()
              + ", Peloton at "
              + client.base()
              + "): "
              + PelotonClient.describe(e),
          e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("Peloton cluster manager: interrupted while registering", e);
    }
    String id = app.path("id").asText("");
    if (id.isEmpty()) {
      throw new IllegalStateException(
          "Peloton cluster manager: Peloton answered no application id: " + app);
    }
    // A driver that registers again (cluster mode, after a restart) continues the generations.
    generation.set(app.path("generation").asLong(0));
    appId = id;
    LOG.info(
        "Registered Spark application {} with Peloton at {} (pool {}, up to {} executors);"
            + " executors reach the driver at {}",
        id,
        client.base(),
        app.path("pool").asText("?"),
        app.path("maxExecutors").asText("?"),
        driverUrl);

    if (!dynamicAllocation(conf)) {
      int instances = staticExecutors(conf);
      // sendTarget never completes exceptionally, and its call times out.
      if (!sendTarget(instances).join()) {
        throw new IllegalStateException(
            "Peloton cluster manager: could not ask Peloton for "
                + instances
                + " executors (see the log above)");
      }
    }

    watcher =
        new ExecutorEventWatcher(
            client,
            id,
            app.path("revision").asLong(0) + 1,
            new ExecutorEventWatcher.Listener() {
              @Override
              public void onEvent(JsonNode event) {
                onExecutorEvent(event);
              }

              @Override
              public void onReconnected() {
                resendTarget();
              }
            });
    watcher.start();
  }

  /**
   * Lowers the target to 0 (no new executors), lets Spark stop its executors gracefully and
   * waits up to {@code spark.peloton.stopWaitMs} for them to exit, then unregisters the
   * application (Peloton stops whatever is left) and stops following events. Never throws.
   */
  @Override
  public void stop() {
    if (!stopped.compareAndSet(false, true)) {
      return;
    }
    String id = appId;
    if (id != null) {
      try {
        // No replacement for executors that end while Spark stops them.
        long next = generation.incrementAndGet();
        client.setTarget(id, next, 0).get(STOP_CALL_TIMEOUT_MS, TimeUnit.MILLISECONDS);
      } catch (Exception e) {
        LOG.warn("Could not set the executor target of {} to 0: {}", id, PelotonClient.describe(e));
      }
    }
    try {
      super.stop();
    } catch (Exception e) {
      LOG.warn("Stopping Spark's scheduler backend failed", e);
    }
    if (id != null) {
      awaitExecutorsExited();
    }
    if (id != null) {
      try {
        CompletableFuture.runAsync(
                () -> {
                  try {
                    client.unregister(id);
                  } catch (IOException e) {
                    throw new java.util.concurrent.CompletionException(e);
                  } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                  }
                })
            .get(STOP_CALL_TIMEOUT_MS, TimeUnit.MILLISECONDS);
        LOG.info("Unregistered Spark application {} from Peloton", id);
      } catch (Exception e) {
        LOG.warn(
            "Could not unregister Spark application {} from Peloton at {}: {}",
            id,
            client.base(),
            PelotonClient.describe(e));
      }
    }
    ExecutorEventWatcher w = watcher;
    if (w != null) {
      w.close();
    }
    timers.shutdownNow();
  }

  /** Waits (bounded) until every executor Peloton launched has exited. */
  private void awaitExecutorsExited() {
    long deadline = System.currentTimeMillis() + stopWaitMs;
    synchronized (liveExecutors) {
      long left;
      while (!liveExecutors.isEmpty() && (left = deadline - System.currentTimeMillis()) > 0) {
        try {
          liveExecutors.wait(left);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          return;
        }
      }
      if (!liveExecutors.isEmpty()) {
        LOG.info(
            "Executors {} still run after {} ms; unregistering stops them",
            liveExecutors,
            stopWaitMs);
      }
    }
  }

  /** The Peloton application id (its job's id) once registered; Spark's own before. */
  @Override
  public String applicationId() {
    String id = appId;
    return id != null ? id : super.applicationId();
  }

  // ------------------------------------------------- Spark's requests to the cluster manager

  /**
   * Spark's wanted total of executors. Peloton runs one executor spec per application, so the
   * totals of all resource profiles are added up (with a warning if there is more than the
   * default one).
   *
   * @return true once Peloton took the target (or already has a newer one), false if it could
   *     not be reached or refused
   */
  @Override
  public Future<Object> doRequestTotalExecutors(
      scala.collection.immutable.Map<ResourceProfile, Object> resourceProfileToTotalExecs) {
    int total = 0;
    for (Iterator<Tuple2<ResourceProfile, Object>> it = resourceProfileToTotalExecs.iterator();
        it.hasNext(); ) {
      Tuple2<ResourceProfile, Object> entry = it.next();
      total += ((Number) entry._2()).intValue();
      if (entry._1().id() != ResourceProfile.DEFAULT_RESOURCE_PROFILE_ID()
          && warnedProfiles.compareAndSet(false, true)) {
        LOG.warn(
            "Resource profile {} asks for its own executors; Peloton runs every executor of an"
                + " application with the default profile's spec (spark.executor.* and"
                + " spark.peloton.executor.*)",
            entry._1().id());
      }
    }
    return scalaFuture(sendTarget(total));
  }

  /** Kills these executors (Peloton stops them with the stop signal, then SIGKILL). */
  @Override
  public Future<Object> doKillExecutors(Seq<String> executorIds) {
    String id = appId;
    if (id == null || executorIds.isEmpty()) {
      return scalaFuture(CompletableFuture.completedFuture(Boolean.FALSE));
    }
    List<String> ids = new ArrayList<>(CollectionConverters.asJava(executorIds));
    LOG.info("Killing executors {}", ids);
    CompletableFuture<Boolean> done = new CompletableFuture<>();
    kill(id, ids, 1, done);
    return scalaFuture(done);
  }

  /**
   * One kill attempt; a failed one is tried again later (killing is idempotent). Completes
   * {@code done} with true after the first attempt either way: Spark has already taken the
   * executors out of service, and a false answer would not make it try again.
   */
  private void kill(String id, List<String> ids, int attempt, CompletableFuture<Boolean> done) {
    client
        .killExecutors(id, ids)
        .whenComplete(
            (answer, error) -> {
              if (error == null) {
                JsonNode unknown = answer.path("unknown");
                if (unknown.size() > 0) {
                  LOG.info("Peloton knows no executors {} (already gone)", unknown);
                }
              } else if (attempt < KILL_ATTEMPTS && !stopped.get()) {
                LOG.warn(
                    "Could not kill executors {} (attempt {}): {}",
                    ids,
                    attempt,
                    PelotonClient.describe(error));
                try {
                  timers.schedule(
                      () -> kill(id, ids, attempt + 1, done), attempt, TimeUnit.SECONDS);
                } catch (RuntimeException rejected) {
                  // Stopping: unregistering stops them.
                }
              } else {
                LOG.error(
                    "Could not kill executors {}: {}; they keep running until the application"
                        + " ends",
                    ids,
                    PelotonClient.describe(error));
              }
              done.complete(Boolean.TRUE);
            });
  }

  /**
   * Sends a target under a new generation. Completes with true if Peloton took it or already
   * has a newer generation, false (logged) otherwise; never exceptionally.
   */
  private CompletableFuture<Boolean> sendTarget(int total) {
    String id = appId;
    if (id == null || stopped.get()) {
      return CompletableFuture.completedFuture(Boolean.FALSE);
    }
    Target target = new Target(generation.incrementAndGet(), total);
    latestTarget.accumulateAndGet(
        target, (old, mine) -> old == null || old.generation < mine.generation ? mine : old);
    return client
        .setTarget(id, target.generation, target.total)
        .handle(
            (answer, error) -> {
              if (error != null) {
                LOG.error(
                    "Could not set the executor target of {} to {} (generation {}): {}",
                    id,
                    total,
                    target.generation,
                    PelotonClient.describe(error));
                return Boolean.FALSE;
              }
              if (answer.path("applied").asBoolean(false)) {
                LOG.info("Executor target of {}: {} (generation {})", id, total, target.generation);
              } else {
                LOG.debug(
                    "Executor target {} (generation {}) superseded by {} (generation {})",
                    total,
                    target.generation,
                    answer.path("target").asText(),
                    answer.path("generation").asText());
              }
              return Boolean.TRUE;
            });
  }

  /** After the event stream broke: the latest target again, same generation (a retry). */
  private void resendTarget() {
    String id = appId;
    Target target = latestTarget.get();
    if (id == null || target == null || stopped.get()) {
      return;
    }
    client
        .setTarget(id, target.generation, target.total)
        .whenComplete(
            (answer, error) -> {
              if (error != null) {
                LOG.warn(
                    "Could not re-send the executor target of {}: {}",
                    id,
                    PelotonClient.describe(error));
              }
            });
  }

  // ---------------------------------------------------------------- executor events

  /** One executor event, on the watcher's thread. */
  private void onExecutorEvent(JsonNode event) {
    String executorId = event.path("executorId").asText("");
    if (event.hasNonNull("exited")) {
      onExecutorExited(executorId, event.get("exited"));
    } else if (event.hasNonNull("launched")) {
      synchronized (liveExecutors) {
        liveExecutors.add(executorId);
      }
      LOG.info(
          "Peloton launched executor {} on {}",
          executorId,
          event.get("launched").path("host").asText("?"));
    } else if (event.hasNonNull("pending")) {
      logPending(executorId, event.get("pending").path("reason").asText(""));
    }
  }

  /**
   * An executor ended: Spark learns why. If its connection already dropped, this ends the wait
   * for its exit cause; if Spark still has it, it is removed now.
   */
  private void onExecutorExited(String executorId, JsonNode exited) {
    String cause = exited.path("cause").asText("EXECUTOR_EXIT_CAUSE_UNKNOWN");
    String shortCause = cause.replaceFirst("^EXECUTOR_EXIT_CAUSE_", "").toLowerCase(Locale.ROOT);
    int exitCode = exited.path("exitCode").asInt(0);
    String reason = exited.path("reason").asText("");
    // Absent means the server did not say: count it against the application, as Spark would.
    boolean causedByApp = !exited.has("causedByApp") || exited.path("causedByApp").asBoolean(true);

    String message =
        "Peloton executor "
            + executorId
            + " "
            + shortCause
            + " (exit code "
            + exitCode
            + (reason.isEmpty() ? "" : ", " + reason)
            + ")"
            + (causedByApp ? "" : "; not caused by the application");
    if (causedByApp && !"exited".equals(shortCause) && !"killed".equals(shortCause)) {
      LOG.warn(message);
    } else {
      LOG.info(message);
    }

    synchronized (liveExecutors) {
      liveExecutors.remove(executorId);
      liveExecutors.notifyAll();
    }
    if (stopped.get()) {
      return; // Spark's endpoint is gone; nothing to tell it
    }
    ExecutorLossReason loss = new ExecutorProcessLost(message, Option.empty(), causedByApp);
    ScheduledFuture<?> fallback = awaitingExit.remove(executorId);
    if (fallback != null) {
      fallback.cancel(false);
      removeExecutor(executorId, loss);
    } else if (knownToSpark(executorId) && !causedByApp) {
      // Still connected: Peloton decides a stop before its signal and grace period run out
      // (a preempted executor decommissions meanwhile). Spark keeps it until it disconnects, or
      // until the grace period and the loss-reason wait have passed.
      exitCauses.put(executorId, loss);
      try {
        timers.schedule(
            () -> {
              ExecutorLossReason left = exitCauses.remove(executorId);
              if (left != null && knownToSpark(executorId)) {
                removeExecutor(executorId, left);
              }
            },
            killGraceMs + lossReasonWaitMs,
            TimeUnit.MILLISECONDS);
      } catch (RuntimeException stopping) {
        exitCauses.remove(executorId);
        removeExecutor(executorId, loss);
      }
    } else if (knownToSpark(executorId)) {
      removeExecutor(executorId, loss);
    }
  }

  /** Logs why executors wait, each reason at most once per interval. */
  private void logPending(String executorId, String reason) {
    long now = System.currentTimeMillis();
    long[] seen = pendingLogged.get(reason);
    if (seen == null || now - seen[0] >= PENDING_LOG_INTERVAL_MS) {
      long others = seen == null ? 0 : seen[1];
      LOG.info(
          "Executor {} is pending: {}{}",
          executorId,
          reason.isEmpty() ? "(no reason given)" : reason,
          others == 0 ? "" : " (and " + others + " more pending events since last logged)");
      pendingLogged.put(reason, new long[] {now, 0});
      if (pendingLogged.size() > 1_000) {
        pendingLogged.values().removeIf(v -> now - v[0] >= PENDING_LOG_INTERVAL_MS);
      }
    } else {
      seen[1]++;
    }
  }

  private boolean knownToSpark(String executorId) {
    return getExecutorIds().contains(executorId);
  }

  /**
   * The connection of a registered executor dropped: it is disabled, and removed when Peloton
   * says why it ended, or after {@code spark.peloton.lossReasonWaitMs} as the application's
   * fault.
   */
  private void awaitExitCause(String executorId) {
    ScheduledFuture<?> fallback;
    try {
      fallback =
          timers.schedule(
              () -> {
                if (awaitingExit.remove(executorId) != null && knownToSpark(executorId)) {
                  removeExecutor(
                      executorId,
                      new ExecutorProcessLost(
                          "Executor "
                              + executorId
                              + " disconnected and Peloton reported no exit within "
                              + lossReasonWaitMs
                              + " ms",
                          Option.empty(),
                          true));
                }
              },
              lossReasonWaitMs,
              TimeUnit.MILLISECONDS);
    } catch (RuntimeException stopping) {
      removeExecutor(
          executorId,
          new ExecutorProcessLost(
              "Executor " + executorId + " disconnected", Option.empty(), true));
      return;
    }
    ScheduledFuture<?> previous = awaitingExit.put(executorId, fallback);
    if (previous != null) {
      previous.cancel(false);
    }
  }

  /** Spark's driver endpoint, but a dropped executor waits for its exit cause (see above). */
  @Override
  public CoarseGrainedSchedulerBackend.DriverEndpoint createDriverEndpoint() {
    return new PelotonDriverEndpoint();
  }

  /**
   * {@code DriverEndpoint} with a patient {@code onDisconnected}. Spark's removes the executor at
   * once as lost by the application's fault; this one disables it and lets {@link
   * #awaitExitCause} decide.
   */
  private final class PelotonDriverEndpoint extends CoarseGrainedSchedulerBackend.DriverEndpoint {
    @Override
    public void onDisconnected(RpcAddress remoteAddress) {
      Option<String> executorId = addressToExecutorId().get(remoteAddress);
      // While stopping (and, defensively, before the backend is fully built) Spark's way is right.
      if (executorId.isEmpty() || stopped == null || stopped.get() || appId == null) {
        super.onDisconnected(remoteAddress);
        return;
      }
      String id = executorId.get();
      ExecutorLossReason known = exitCauses.remove(id);
      if (known != null) {
        // Peloton said why already (it stopped the executor for others).
        removeExecutor(id, known);
        return;
      }
      // disableExecutor: true for an active executor or one the driver is killing; false for one
      // already on its way out (decommissioned, or disabled before), which Spark removes now.
      if (disableExecutor(id)) {
        LOG.info(
            "Executor {} disconnected; waiting up to {} ms for Peloton to say why",
            id,
            lossReasonWaitMs);
        awaitExitCause(id);
      } else {
        super.onDisconnected(remoteAddress);
      }
    }
  }

  // ---------------------------------------------------------------- configuration

  /** The {@code RegisterAppRequest}. */
  private ObjectNode registerRequest(SparkConf conf, String driverUrl) {
    ObjectNode request = json.createObjectNode();
    request.put("name", sc.appName());
    request.put("owner", conf.get(Conf.OWNER, System.getProperty("user.name", "")));

    String pool = conf.get(Conf.POOL, "");
    String jobId =
        conf.contains(Conf.JOB_ID)
            ? conf.get(Conf.JOB_ID)
            : System.getenv().getOrDefault("PELOTON_JOB_ID", "");
    if (!jobId.isEmpty()) {
      // Cluster mode: the driver is instance 0 of this APPLICATION job, whose pool applies.
      request.put("jobId", jobId);
      if (!pool.isEmpty()) {
        LOG.info(
            "The driver runs in Peloton job {}: its executors run in that job's pool, not {}",
            jobId,
            pool);
      }
    } else if (pool.isEmpty()) {
      throw new IllegalArgumentException(
          "set "
              + Conf.POOL
              + " to the Peloton pool for the executors (a leaf pool, e.g. /batch/spark), or run"
              + " the driver as an APPLICATION job (cluster mode, "
              + Conf.JOB_ID
              + " or $PELOTON_JOB_ID)");
    } else {
      request.put("pool", pool);
    }

    request.put("driverUrl", driverUrl);
    request.set("executor", ExecutorSpec.taskSpec(conf, System.getenv(), driverUrl, json));
    request.put("priority", conf.getInt(Conf.PRIORITY, 0));
    request.put("nonPreemptible", conf.getBoolean(Conf.NON_PREEMPTIBLE, false));
    request.put("maxExecutors", maxExecutors(conf));

    String placement = conf.get(Conf.PLACEMENT, "");
    if (!placement.isEmpty()) {
      String name = placement.toUpperCase(Locale.ROOT).replace('-', '_');
      if (!List.of("PACK", "SPREAD", "FIRST_FIT").contains(name)) {
        throw new IllegalArgumentException(
            Conf.PLACEMENT + " is pack, spread or first_fit, not " + placement);
      }
      request.put("placement", "PLACEMENT_STRATEGY_" + name);
    }
    Tuple2<String, String>[] labels = conf.getAllWithPrefix(Conf.LABEL_PREFIX);
    if (labels.length > 0) {
      ObjectNode map = request.putObject("labels");
      for (Tuple2<String, String> label : labels) {
        map.put(label._1(), label._2());
      }
    }
    if (conf.getBoolean("spark.authenticate", false)) {
      LOG.warn(
          "spark.authenticate is on: executors need the secret too (e.g. through"
              + " spark.authenticate.secret.file on their hosts); it is not put in their spec");
    }
    return request;
  }

  private static boolean dynamicAllocation(SparkConf conf) {
    return conf.getBoolean("spark.dynamicAllocation.enabled", false);
  }

  /** Executors without dynamic allocation: {@code spark.executor.instances}, 2 by default. */
  private static int staticExecutors(SparkConf conf) {
    return conf.getInt("spark.executor.instances", 2);
  }

  /**
   * The bound on executors at once: {@code spark.dynamicAllocation.maxExecutors} (0, Peloton's
   * default, when unbounded), or the static number.
   */
  private static int maxExecutors(SparkConf conf) {
    if (!dynamicAllocation(conf)) {
      return staticExecutors(conf);
    }
    int max = conf.getInt("spark.dynamicAllocation.maxExecutors", Integer.MAX_VALUE);
    return max == Integer.MAX_VALUE ? 0 : max;
  }

  @SuppressWarnings("unchecked")
  private static Future<Object> scalaFuture(CompletableFuture<Boolean> future) {
    return (Future<Object>) (Future<?>) FutureConverters.asScala(future);
  }
}
