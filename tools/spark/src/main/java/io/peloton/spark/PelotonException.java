package io.peloton.spark;

import java.io.IOException;

/**
 * A refusal from the Peloton server: its HTTP status and the gRPC status name of its JSON error
 * body ({@code {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "..."}}}).
 * Transport failures (connection refused, timeouts) are plain {@link IOException}s.
 */
final class PelotonException extends IOException {
  private static final long serialVersionUID = 1L;

  private final int httpStatus;
  private final String status;
  private final String serverMessage;

  PelotonException(String call, int httpStatus, String status, String serverMessage) {
    super(call + ": " + status + " (HTTP " + httpStatus + "): " + serverMessage);
    this.httpStatus = httpStatus;
    this.status = status;
    this.serverMessage = serverMessage;
  }

  /** The HTTP status (for an error line inside a stream: the code its body names). */
  int httpStatus() {
    return httpStatus;
  }

  /** The gRPC status name, e.g. {@code OUT_OF_RANGE}; {@code UNKNOWN} if the body had none. */
  String status() {
    return status;
  }

  /** The server's own message. */
  String serverMessage() {
    return serverMessage;
  }
}
