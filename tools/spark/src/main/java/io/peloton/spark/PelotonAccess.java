package io.peloton.spark;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.util.Collection;
import java.util.Map;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;
import org.apache.spark.SparkConf;

/**
 * How the driver reaches a secure Peloton server (the default): over https, trusting the CA
 * that signed the server's certificate, with a bearer token on every request.
 *
 * <ul>
 *   <li>CA: {@code spark.peloton.caFile}, else {@code $PELOTON_CA_FILE} (PEM; a local {@code
 *       pelotond} keeps its private CA in {@code DATA_DIR/tls/ca.pem}). With a CA the master
 *       {@code peloton://HOST:PORT} means {@code https://HOST:PORT}; without one, {@code
 *       http://HOST:PORT} (a server started with {@code --insecure}).
 *   <li>Token: {@code spark.peloton.tokenFile}, else {@code $PELOTON_TOKEN}, else {@code
 *       $PELOTON_TOKEN_FILE} (a file holding it; trailing whitespace is ignored). Never a plain
 *       Spark setting: the configuration shows in the Spark UI and event logs, so {@code
 *       spark.peloton.token} is refused.
 * </ul>
 *
 * <p>Only the JDK: the PEM certificates go through an X.509 {@link CertificateFactory} into an
 * in-memory {@link KeyStore}, its {@link TrustManagerFactory} into an {@link SSLContext}. The
 * JDK's default trust store is not used: the server's certificate must come from the CA given.
 */
final class PelotonAccess {
  /** Where each setting came from, for messages (never the token itself). */
  private final String caSource;

  private final String tokenSource;
  private final SSLContext ssl;
  private final String token;

  private PelotonAccess(SSLContext ssl, String caSource, String token, String tokenSource) {
    this.ssl = ssl;
    this.caSource = caSource;
    this.token = token;
    this.tokenSource = tokenSource;
  }

  /**
   * The access the configuration and environment describe.
   *
   * @throws IllegalArgumentException if a file cannot be read or holds no usable CA or token, or
   *     if the token was put in the Spark configuration itself
   */
  static PelotonAccess from(SparkConf conf, Map<String, String> env) {
    if (conf.contains(Conf.TOKEN_FORBIDDEN)) {
      throw new IllegalArgumentException(
          Conf.TOKEN_FORBIDDEN
              + " is not read: Spark's configuration shows in its UI and event logs; put the token"
              + " in a file (" + Conf.TOKEN_FILE + " or PELOTON_TOKEN_FILE) or in PELOTON_TOKEN");
    }
    SSLContext ssl = null;
    String caSource = null;
    String caFile = nonEmpty(conf.get(Conf.CA_FILE, null));
    if (caFile != null) {
      caSource = Conf.CA_FILE;
    } else if ((caFile = nonEmpty(env.get("PELOTON_CA_FILE"))) != null) {
      caSource = "PELOTON_CA_FILE";
    }
    if (caFile != null) {
      ssl = sslContext(Path.of(caFile), caSource);
      caSource = caSource + " (" + caFile + ")";
    }
    String token;
    String tokenSource;
    String tokenFile = nonEmpty(conf.get(Conf.TOKEN_FILE, null));
    if (tokenFile != null) {
      tokenSource = Conf.TOKEN_FILE + " (" + tokenFile + ")";
      token = readToken(Path.of(tokenFile), tokenSource);
    } else if (env.get("PELOTON_TOKEN") != null) {
      tokenSource = "PELOTON_TOKEN";
      token = checkToken(env.get("PELOTON_TOKEN").strip(), tokenSource);
    } else if ((tokenFile = nonEmpty(env.get("PELOTON_TOKEN_FILE"))) != null) {
      tokenSource = "PELOTON_TOKEN_FILE (" + tokenFile + ")";
      token = readToken(Path.of(tokenFile), tokenSource);
    } else {
      tokenSource = null;
      token = null;
    }
    return new PelotonAccess(ssl, caSource, token, tokenSource);
  }

  /** Whether the server is reached over https. */
  boolean secure() {
    return ssl != null;
  }

  /** The TLS context trusting the configured CA; null without one (plain http). */
  SSLContext ssl() {
    return ssl;
  }

  /**
   * The {@code Authorization} header's value ({@code Bearer <token>}); null without a token, and
   * over plain http, which would show it to anyone on the path.
   */
  String authorization() {
    return token == null || ssl == null ? null : "Bearer " + token;
  }

  /** Whether a token was configured but is withheld because the server is plain http. */
  boolean tokenWithheld() {
    return token != null && ssl == null;
  }

  /** Where the CA and the token come from, for the log (no secret). */
  String describe() {
    return "CA from "
        + (caSource == null ? "nowhere (plain http)" : caSource)
        + ", token from "
        + (tokenSource == null ? "nowhere" : tokenSource);
  }

  private static String nonEmpty(String s) {
    return s == null || s.isBlank() ? null : s.strip();
  }

  private static SSLContext sslContext(Path caFile, String source) {
    Collection<? extends Certificate> certificates;
    try (InputStream in = Files.newInputStream(caFile)) {
      certificates = CertificateFactory.getInstance("X.509").generateCertificates(in);
    } catch (IOException e) {
      throw new IllegalArgumentException(source + ": cannot read " + caFile + ": " + e, e);
    } catch (GeneralSecurityException e) {
      throw new IllegalArgumentException(
          source + ": " + caFile + " holds no readable PEM certificate: " + e.getMessage(), e);
    }
    if (certificates.isEmpty()) {
      throw new IllegalArgumentException(source + ": no certificate in " + caFile);
    }
    try {
      KeyStore trusted = KeyStore.getInstance(KeyStore.getDefaultType());
      trusted.load(null, null);
      int i = 0;
      for (Certificate certificate : certificates) {
        trusted.setCertificateEntry("peloton-ca-" + i++, certificate);
      }
      TrustManagerFactory trust =
          TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
      trust.init(trusted);
      SSLContext ssl = SSLContext.getInstance("TLS");
      ssl.init(null, trust.getTrustManagers(), null);
      return ssl;
    } catch (GeneralSecurityException | IOException e) {
      throw new IllegalArgumentException(
          source + ": cannot trust the CA in " + caFile + ": " + e.getMessage(), e);
    }
  }

  private static String readToken(Path file, String source) {
    String text;
    try {
      text = Files.readString(file, StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new IllegalArgumentException(source + ": cannot read the token: " + e, e);
    }
    return checkToken(text.strip(), source);
  }

  /** A header value must be printable ASCII; a token is one line of it. */
  private static String checkToken(String token, String source) {
    if (token.isEmpty()) {
      throw new IllegalArgumentException(source + ": the token is empty");
    }
    for (int i = 0; i < token.length(); i++) {
      char c = token.charAt(i);
      if (c < 0x21 || c > 0x7e) {
        throw new IllegalArgumentException(
            source + ": the token is not one word of printable ASCII");
      }
    }
    return token;
  }
}
