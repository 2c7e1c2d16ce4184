package io.peloton.spark;

import org.apache.spark.SparkContext;
import org.apache.spark.scheduler.ExternalClusterManager;
import org.apache.spark.scheduler.SchedulerBackend;
import org.apache.spark.scheduler.TaskScheduler;
import org.apache.spark.scheduler.TaskSchedulerImpl;

/**
 * Spark's entry point for master URLs {@code peloton://HOST:PORT}: Spark finds it through {@code
 * META-INF/services/org.apache.spark.scheduler.ExternalClusterManager} and runs the application's
 * executors as tasks of a Peloton application job (see {@link PelotonSchedulerBackend}).
 *
 * <p>{@code ExternalClusterManager} is {@code private[spark]} in Scala but a public interface in
 * bytecode; its signatures are those of Spark 4.0.
 */
public final class PelotonClusterManager implements ExternalClusterManager {
  /** The scheme of Peloton master URLs. */
  public static final String URL_PREFIX = "peloton://";

  /** For {@link java.util.ServiceLoader}. */
  public PelotonClusterManager() {}

  @Override
  public boolean canCreate(String masterURL) {
    return masterURL != null && masterURL.startsWith(URL_PREFIX);
  }

  @Override
  public TaskScheduler createTaskScheduler(SparkContext sc, String masterURL) {
    return new TaskSchedulerImpl(sc);
  }

  @Override
  public SchedulerBackend createSchedulerBackend(
      SparkContext sc, String masterURL, TaskScheduler scheduler) {
    return new PelotonSchedulerBackend((TaskSchedulerImpl) scheduler, sc, masterURL);
  }

  @Override
  public void initialize(TaskScheduler scheduler, SchedulerBackend backend) {
    ((TaskSchedulerImpl) scheduler).initialize(backend);
  }
}
