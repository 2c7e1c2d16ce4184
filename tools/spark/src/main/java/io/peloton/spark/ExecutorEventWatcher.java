package io.peloton.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Follows an application's executor events ({@code GET /v1/apps/{id}/events}) on a daemon thread
 * and hands each event to a {@link Listener}, in revision order.
 *
 * <p>When the stream ends or fails while the watcher is open, it reconnects with back-off (0.5 s
 * doubling to 30 s) from the revision after the last one seen, so no event is lost or repeated.
 * If the server no longer has those revisions ({@code OUT_OF_RANGE}), it reads the application
 * and goes on from its current revision: events in between are skipped (with a warning), and the
 * driver's own fallbacks apply to executors whose exit it missed.
 */
final class ExecutorEventWatcher implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(ExecutorEventWatcher.class);
  private static final long MIN_BACKOFF_MS = 500;
  private static final long MAX_BACKOFF_MS = 30_000;

  /** What the watcher reports; called on its thread. */
  interface Listener {
    /** One {@code ExecutorEvent}. */
    void onEvent(JsonNode event);

    /** The stream is up again after a break (not called for the first connection). */
    void onReconnected();
  }

  private final PelotonClient client;
  private final String appId;
  private final Listener listener;
  private final Thread thread;
  private volatile boolean closed;
  private volatile PelotonClient.EventStream current;
  /** The next revision to watch from (touched by the watcher's thread only). */
  private long nextRevision;

  /**
   * @param fromRevision the first revision to report (the {@code revision} of a fresh {@code
   *     Application} answer, plus one)
   */
  ExecutorEventWatcher(PelotonClient client, String appId, long fromRevision, Listener listener) {
    this.client = client;
    this.appId = appId;
    this.listener = listener;
    this.nextRevision = fromRevision;
    this.thread = new Thread(this::run, "peloton-executor-events-" + appId);
    this.thread.setDaemon(true);
  }

  void start() {
    thread.start();
  }

  /** Stops following: ends the open stream and waits (briefly) for the thread to finish. */
  @Override
  public void close() {
    closed = true;
    PelotonClient.EventStream stream = current;
    if (stream != null) {
      stream.close();
    }
    thread.interrupt();
    try {
      thread.join(5_000);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private void run() {
    long backoffMs = MIN_BACKOFF_MS;
    boolean connectedBefore = false;
    while (!closed) {
      try (PelotonClient.EventStream stream = client.watchExecutors(appId, nextRevision)) {
        current = stream;
        if (closed) {
          break;
        }
        JsonNode message;
        boolean up = false;
        while ((message = stream.next()) != null) {
          if (!up) {
            // The server sends a first message at once, events or not: the stream is up.
            up = true;
            backoffMs = MIN_BACKOFF_MS;
            if (connectedBefore) {
              LOG.info(
                  "Following executor events of Peloton application {} again from revision {}",
                  appId,
                  nextRevision);
              listener.onReconnected();
            }
            connectedBefore = true;
          }
          for (JsonNode event : message.path("events")) {
            long revision = event.path("revision").asLong(0);
            if (revision != 0 && revision < nextRevision) {
              continue; // already handled (the server replays from the revision asked)
            }
            try {
              listener.onEvent(event);
            } catch (RuntimeException e) {
              LOG.error("Could not handle executor event {}", event, e);
            }
            nextRevision = Math.max(nextRevision, revision + 1);
          }
        }
        if (!closed) {
          LOG.warn(
              "Peloton ended the executor event stream of application {}; reconnecting", appId);
        }
      } catch (PelotonException e) {
        if (closed) {
          break;
        }
        if ("OUT_OF_RANGE".equals(e.status()) && skipToNow()) {
          continue;
        }
        LOG.warn("Executor events of Peloton application {}: {}", appId, e.getMessage());
      } catch (IOException | RuntimeException e) {
        if (closed) {
          break;
        }
        LOG.warn(
            "Lost the executor event stream of Peloton application {}: {}",
            appId,
            PelotonClient.describe(e));
      } catch (InterruptedException e) {
        if (closed) {
          break;
        }
      } finally {
        current = null;
      }
      if (closed) {
        break;
      }
      try {
        Thread.sleep(backoffMs);
      } catch (InterruptedException e) {
        if (closed) {
          break;
        }
      }
      backoffMs = Math.min(backoffMs * 2, MAX_BACKOFF_MS);
    }
    LOG.debug("Stopped following executor events of Peloton application {}", appId);
  }

  /**
   * The revisions wanted are gone: goes on from the application's current revision. False if
   * the application could not be read (the loop retries after its back-off).
   */
  private boolean skipToNow() {
    try {
      long revision = client.getApp(appId).path("revision").asLong(0);
      LOG.warn(
          "Peloton no longer has executor events of application {} from revision {}; following"
              + " from revision {}: exits in between are only seen as lost connections",
          appId,
          nextRevision,
          revision + 1);
      nextRevision = revision + 1;
      return true;
    } catch (IOException e) {
      LOG.warn("Could not read Peloton application {}: {}", appId, PelotonClient.describe(e));
      return false;
    } catch (InterruptedException e) {
      return false;
    }
  }
}
