package io.peloton.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.net.ConnectException;
import java.net.URI;
import java.net.URISyntaxException;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collection;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;

/**
 * Peloton's {@code ApplicationService} through the server's JSON/HTTP mirror (protobuf canonical
 * JSON: lowerCamelCase names, 64-bit integers as strings, enums by name).
 *
 * <p>Unary calls answer the response message; a refusal becomes a {@link PelotonException} with
 * the server's HTTP status, gRPC status name and message. The executor event stream is a sequence
 * of JSON lines, read through {@link EventStream}.
 *
 * <p>A secure server (the default) is reached over https with the CA and bearer token of a
 * {@link PelotonAccess}: every request carries {@code Authorization: Bearer <token>}.
 *
 * <p>Thread-safe: {@link HttpClient} is, and the object mapper is only used to read and write
 * trees.
 */
final class PelotonClient {
  /** Connection set-up, per attempt. */
  private static final Duration CONNECT_TIMEOUT = Duration.ofSeconds(10);
  /** A unary call, from sending to the response headers (below Spark's 120 s ask timeout). */
  static final Duration CALL_TIMEOUT = Duration.ofSeconds(30);
  /** Response bodies quoted in errors are cut to this many characters. */
  private static final int MAX_QUOTED_BODY = 500;

  private final URI base;
  private final HttpClient http;
  private final ObjectMapper json;
  /** {@code Bearer <token>}, or null to send none. */
  private final String authorization;

  /**
   * A client of the server of {@code masterUrl} ({@code peloton://HOST:PORT}): https with the
   * access's CA and token if it has a CA, else plain http.
   *
   * @throws IllegalArgumentException if the URL is not of that form
   */
  PelotonClient(String masterUrl, PelotonAccess access, ObjectMapper json) {
    this.base = baseUri(masterUrl, access.secure());
    this.json = json;
    this.authorization = access.authorization();
    // HTTP/1.1: the mirror shares its port with gRPC; an h2c upgrade would buy nothing (and
    // over TLS, HTTP/1.1 keeps the event stream on a connection of its own).
    HttpClient.Builder http =
        HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(CONNECT_TIMEOUT)
            .followRedirects(HttpClient.Redirect.NEVER);
    if (access.secure()) {
      http.sslContext(access.ssl());
    }
    this.http = http.build();
  }

  /**
   * The server's base URI of a master URL {@code peloton://HOST:PORT} (an optional trailing
   * slash is allowed): {@code https://HOST:PORT} if {@code secure}, else {@code http://HOST:PORT}.
   *
   * @throws IllegalArgumentException if the URL is not of that form
   */
  static URI baseUri(String masterUrl, boolean secure) {
    String prefix = PelotonClusterManager.URL_PREFIX;
    if (masterUrl == null || !masterUrl.startsWith(prefix)) {
      throw new IllegalArgumentException(
          "not a Peloton master URL: " + masterUrl + " (expected " + prefix + "HOST:PORT)");
    }
    String authority = masterUrl.substring(prefix.length());
    if (authority.endsWith("/")) {
      authority = authority.substring(0, authority.length() - 1);
    }
    try {
      URI uri = new URI((secure ? "https://" : "http://") + authority);
      if (uri.getHost() == null
          || uri.getPort() < 0
          || !uri.getRawPath().isEmpty()
          || uri.getRawQuery() != null
          || uri.getRawUserInfo() != null) {
        throw new URISyntaxException(authority, "expected HOST:PORT");
      }
      return uri;
    } catch (URISyntaxException e) {
      throw new IllegalArgumentException(
          "bad Peloton master URL " + masterUrl + ": expected " + prefix + "HOST:PORT", e);
    }
  }

  /** The server's base URI (http or https), for messages. */
  URI base() {
    return base;
  }

  /** {@code POST /v1/apps}: registers the application; answers its {@code Application}. */
  JsonNode register(ObjectNode request) throws IOException, InterruptedException {
    return call("register the application", "POST", "/v1/apps", request).path("app");
  }

  /** {@code GET /v1/apps/{id}}: the application's {@code Application}. */
  JsonNode getApp(String appId) throws IOException, InterruptedException {
    return call("read the application", "GET", appPath(appId, ""), null).path("app");
  }

  /**
   * {@code POST /v1/apps/{id}/target}: asks for {@code total} executors under {@code generation}.
   * Completes with the {@code SetExecutorTargetResponse} ({@code applied}, {@code target},
   * {@code generation}), or exceptionally.
   */
  CompletableFuture<JsonNode> setTarget(String appId, long generation, int total) {
    ObjectNode body = json.createObjectNode();
    body.put("generation", Long.toString(generation));
    body.put("total", total);
    return callAsync("set the executor target", "POST", appPath(appId, "/target"), body);
  }

  /**
   * {@code POST /v1/apps/{id}/kill}: stops these executors. Completes with the {@code
   * KillExecutorsResponse} ({@code killed}, {@code unknown}), or exceptionally.
   */
  CompletableFuture<JsonNode> killExecutors(String appId, Collection<String> executorIds) {
    ObjectNode body = json.createObjectNode();
    ArrayNode ids = body.putArray("executorIds");
    executorIds.forEach(ids::add);
    return callAsync("kill executors", "POST", appPath(appId, "/kill"), body);
  }

  /** {@code POST /v1/apps/{id}/unregister}: stops all executors; answers the application. */
  JsonNode unregister(String appId) throws IOException, InterruptedException {
    return call(
            "unregister the application",
            "POST",
            appPath(appId, "/unregister"),
            json.createObjectNode())
        .path("app");
  }

  /**
   * {@code GET /v1/apps/{id}/events?fromRevision=N}: opens the executor event stream. Returns
   * once the server answered its headers; an error the server finds at once (an unknown
   * application, a revision out of range) is thrown here with its own status.
   */
  EventStream watchExecutors(String appId, long fromRevision)
      throws IOException, InterruptedException {
    String call = "watch executor events";
    HttpRequest request =
        authorized(
                HttpRequest.newBuilder(
                    base.resolve(appPath(appId, "/events?fromRevision=" + fromRevision))))
            .header("Accept", "application/x-ndjson")
            .timeout(CALL_TIMEOUT) // until the headers; the body may stay open for ever
            .GET()
            .build();
    HttpResponse<InputStream> response =
        http.send(request, HttpResponse.BodyHandlers.ofInputStream());
    if (response.statusCode() != 200) {
      String body;
      try (InputStream in = response.body()) {
        body = new String(in.readNBytes(64 * 1024), StandardCharsets.UTF_8);
      }
      throw refusal(call, response.statusCode(), body);
    }
    return new EventStream(call, response.body());
  }

  /**
   * An open executor event stream: one {@code WatchExecutorsResponse} per line. {@link #close()}
   * may be called from another thread; together with an interrupt of the reading thread it ends
   * a blocked {@link #next()}.
   */
  final class EventStream implements AutoCloseable {
    private final String call;
    private final InputStream body;
    private final BufferedReader lines;

    private EventStream(String call, InputStream body) {
      this.call = call;
      this.body = body;
      this.lines = new BufferedReader(new InputStreamReader(body, StandardCharsets.UTF_8));
    }

    /**
     * The next message, or null when the server ended the stream. An error line ({@code
     * {"error": {...}}}, the server's last) is thrown as a {@link PelotonException}.
     */
    JsonNode next() throws IOException {
      String line;
      do {
        line = lines.readLine();
        if (line == null) {
          return null;
        }
      } while (line.isBlank());
      JsonNode message = json.readTree(line);
      if (message.has("error")) {
        throw refusal(call, message.path("error").path("code").asInt(0), line);
      }
      return message;
    }

    @Override
    public void close() {
      try {
        body.close();
      } catch (IOException ignored) {
        // Closing only releases the connection; nothing to report.
      }
    }
  }

  /** A blocking unary call: the parsed answer, or the server's refusal. */
  private JsonNode call(String what, String method, String path, JsonNode body)
      throws IOException, InterruptedException {
    try {
      return callAsync(what, method, path, body).get();
    } catch (ExecutionException e) {
      Throwable cause = e.getCause();
      if (cause instanceof IOException) {
        throw (IOException) cause;
      }
      throw new IOException("could not " + what + ": " + describe(cause), cause);
    }
  }

  /** An asynchronous unary call (completes on the HTTP client's threads). */
  private CompletableFuture<JsonNode> callAsync(
      String what, String method, String path, JsonNode body) {
    HttpRequest.Builder request =
        authorized(HttpRequest.newBuilder(base.resolve(path)))
            .timeout(CALL_TIMEOUT)
            .header("Accept", "application/json");
    if (body == null) {
      request.method(method, HttpRequest.BodyPublishers.noBody());
    } else {
      byte[] bytes;
      try {
        bytes = json.writeValueAsBytes(body);
      } catch (IOException e) {
        return CompletableFuture.failedFuture(e);
      }
      request
          .header("Content-Type", "application/json")
          .method(method, HttpRequest.BodyPublishers.ofByteArray(bytes));
    }
    return http.sendAsync(request.build(), HttpResponse.BodyHandlers.ofString())
        .handle(
            (response, error) -> {
              if (error != null) {
                Throwable cause = unwrap(error);
                throw new CompletionException(
                    new IOException(
                        "could not " + what + ": Peloton at " + base + ": " + describe(cause),
                        cause));
              }
              if (response.statusCode() != 200) {
                throw new CompletionException(
                    refusal(what, response.statusCode(), response.body()));
              }
              try {
                return json.readTree(response.body());
              } catch (IOException e) {
                throw new CompletionException(
                    new IOException(
                        "could not " + what + ": unreadable answer: " + quote(response.body()), e));
              }
            });
  }

  /** {@code request} with the bearer token, if there is one. */
  private HttpRequest.Builder authorized(HttpRequest.Builder request) {
    return authorization == null ? request : request.header("Authorization", authorization);
  }

  /** The exception for an error answer: parsed from the mirror's JSON error if it is one. */
  private PelotonException refusal(String what, int httpStatus, String body) {
    String status = "UNKNOWN";
    String message = quote(body);
    try {
      JsonNode error = json.readTree(body).path("error");
      if (error.isObject()) {
        status = error.path("status").asText(status);
        message = error.path("message").asText(message);
        if (httpStatus == 0) {
          httpStatus = error.path("code").asInt(0);
        }
      }
    } catch (IOException | RuntimeException notJson) {
      // Not the mirror's JSON (a proxy's page, say): quote it as it is.
    }
    return new PelotonException("could not " + what, httpStatus, status, message);
  }

  private static String appPath(String appId, String rest) {
    return "/v1/apps/"
        + URLEncoder.encode(appId, StandardCharsets.UTF_8).replace("+", "%20")
        + rest;
  }

  private static String quote(String body) {
    String text = body == null ? "" : body.strip();
    return text.length() <= MAX_QUOTED_BODY ? text : text.substring(0, MAX_QUOTED_BODY) + "…";
  }

  private static Throwable unwrap(Throwable t) {
    while ((t instanceof CompletionException || t instanceof ExecutionException)
        && t.getCause() != null) {
      t = t.getCause();
    }
    return t;
  }

  /**
   * A readable account of a failure: the message of this client's own exceptions, else the chain
   * of causes (the JDK's HTTP client throws a {@code ConnectException} without a message when a
   * connection is refused).
   */
  static String describe(Throwable t) {
    t = unwrap(t);
    if (t instanceof PelotonException || (t != null && t.getClass() == IOException.class)) {
      return t.getMessage();
    }
    StringBuilder out = new StringBuilder();
    for (int depth = 0; t != null && depth < 4; t = t.getCause(), depth++) {
      if (out.length() > 0) {
        out.append(": ");
      }
      String message = t.getMessage();
      out.append(t.getClass().getSimpleName());
      if (message != null && !message.isBlank()) {
        out.append(" (").append(message).append(')');
      } else if (t instanceof ConnectException) {
        return out.append(" (connection refused or host unreachable)").toString();
      }
    }
    return out.toString();
  }

}
