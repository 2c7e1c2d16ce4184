package io.peloton.spark;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.File;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.launcher.JavaModuleOptions;
import scala.Tuple2;

/**
 * The Peloton task spec of the application's executors: one {@code
 * CoarseGrainedExecutorBackend} JVM per task, started by a {@code /bin/sh} line that connects it
 * back to the driver. Built from the driver's Spark configuration and environment.
 *
 * <p>The executor's id is the Peloton instance number ({@code $PELOTON_INSTANCE_ID}) and its
 * Spark application id is the Peloton job id ({@code $PELOTON_JOB_ID}), which is what the driver's
 * backend reports as the application id. Every other value in the line is quoted.
 */
final class ExecutorSpec {
  /** The executor's main class. */
  static final String EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend";

  /**
   * What Spark 4's launchers pass to a Java 17 JVM, for when {@link JavaModuleOptions} (in
   * spark-launcher) is not on the driver's class path.
   */
  private static final String[] FALLBACK_MODULE_OPTIONS = {
    "-XX:+IgnoreUnrecognizedVMOptions",
    "--add-modules=jdk.incubator.vector",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.invoke=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.net=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.cs=ALL-UNNAMED",
    "--add-opens=java.base/sun.security.action=ALL-UNNAMED",
    "--add-opens=java.base/sun.util.calendar=ALL-UNNAMED",
    "--add-opens=java.security.jgss/sun.security.krb5=ALL-UNNAMED",
    "-Djdk.reflect.useDirectMethodHandle=false",
    "-Dio.netty.tryReflectionSetAccessible=true",
  };

  private ExecutorSpec() {}

  /**
   * The {@code TaskSpec} JSON of an executor.
   *
   * @param conf the driver's Spark configuration
   * @param driverEnv the driver's environment ({@link System#getenv()})
   * @param driverUrl where executors reach the driver's scheduler endpoint
   */
  static ObjectNode taskSpec(
      SparkConf conf, Map<String, String> driverEnv, String driverUrl, ObjectMapper json) {
    ObjectNode spec = json.createObjectNode();
    spec.put("shell", shellLine(conf, driverEnv, driverUrl));

    ObjectNode env = spec.putObject("env");
    environment(conf, driverEnv).forEach(env::put);

    ObjectNode resources = spec.putObject("resources");
    resources.put("cpu", conf.getDouble(Conf.EXECUTOR_CPUS, executorCores(conf)));
    resources.put("memoryMb", taskMemoryMb(conf));
    resources.put("diskMb", conf.getLong(Conf.EXECUTOR_DISK_MB, Conf.DEFAULT_EXECUTOR_DISK_MB));

    spec.put(
        "killGracePeriodMs",
        Long.toString(conf.getLong(Conf.EXECUTOR_KILL_GRACE_MS, Conf.DEFAULT_KILL_GRACE_MS)));
    // A decommissioning executor hands its blocks over before it goes (on SIGPWR).
    spec.put(
        "stopSignal", conf.getBoolean("spark.decommission.enabled", false) ? "SIGPWR" : "SIGTERM");
    // A JVM reserves far more address space than it uses: limit resident memory instead.
    spec.put("memoryLimit", "MEMORY_LIMIT_RESIDENT");
    String constraint = conf.get(Conf.EXECUTOR_CONSTRAINT, "");
    if (!constraint.isEmpty()) {
      spec.put("constraint", constraint);
    }
    return spec;
  }

  /** Cores of one executor ({@code spark.executor.cores}, 1 by default). */
  static int executorCores(SparkConf conf) {
    return conf.getInt("spark.executor.cores", 1);
  }

  /** The executor's JVM heap, MiB ({@code spark.executor.memory}, 1 GiB by default). */
  static long heapMb(SparkConf conf) {
    return conf.getSizeAsMb("spark.executor.memory", "1g");
  }

  /**
   * The task's memory, MiB: the heap, its overhead ({@code spark.executor.memoryOverhead}, by
   * default {@code spark.executor.memoryOverheadFactor} (0.1) of the heap but at least {@code
   * spark.executor.minMemoryOverhead} (384 MiB)), the Python workers' {@code
   * spark.executor.pyspark.memory} and, when enabled, {@code spark.memory.offHeap.size}: what
   * YARN and Kubernetes ask for a container.
   */
  static long taskMemoryMb(SparkConf conf) {
    long heap = heapMb(conf);
    long overhead;
    if (conf.contains("spark.executor.memoryOverhead")) {
      overhead = conf.getSizeAsMb("spark.executor.memoryOverhead");
    } else {
      double factor = conf.getDouble("spark.executor.memoryOverheadFactor", 0.1);
      long floor = conf.getSizeAsMb("spark.executor.minMemoryOverhead", "384m");
      overhead = Math.max(floor, (long) (factor * heap));
    }
    long pyspark =
        conf.contains("spark.executor.pyspark.memory")
            ? conf.getSizeAsMb("spark.executor.pyspark.memory")
            : 0;
    long offHeap =
        conf.getBoolean("spark.memory.offHeap.enabled", false)
            ? conf.getSizeAsBytes("spark.memory.offHeap.size", "0") >> 20
            : 0;
    return heap + overhead + pyspark + offHeap;
  }

  /**
   * The executor's {@code /bin/sh} line: {@code exec java … CoarseGrainedExecutorBackend …}. The
   * executor id and application id come from the task's environment; everything else is quoted.
   */
  static String shellLine(SparkConf conf, Map<String, String> driverEnv, String driverUrl) {
    List<String> words = new ArrayList<>();
    words.add("exec");
    words.add(quote(javaCommand(conf, driverEnv)));
    words.add("-Xmx" + heapMb(conf) + "m");

    // Spark 4 already adds its module options to spark.executor.extraJavaOptions (SparkContext
    // does, for every cluster manager): only what is missing from there is added here.
    List<String> extraOptions = splitOptions(conf.get("spark.executor.extraJavaOptions", ""));
    List<String> jvmOptions = new ArrayList<>();
    jvmOptions.add("-XX:+IgnoreUnrecognizedVMOptions");
    jvmOptions.addAll(moduleOptions());
    for (String option : new LinkedHashSet<>(jvmOptions)) {
      if (!extraOptions.contains(option)) {
        words.add(quote(option));
      }
    }

    // Settings an executor needs before it can fetch the rest from the driver (RPC, network,
    // SSL, ports, authentication switches), as system properties, as Spark's launchers do.
    // The authentication secret is never among them (it would be stored in the job's spec).
    for (Tuple2<String, String> entry : conf.getAll()) {
      if (SparkConf.isExecutorStartupConf(entry._1())) {
        words.add(quote("-D" + entry._1() + "=" + entry._2()));
      }
    }

    for (String option : extraOptions) {
      words.add(placeholders(quote(option)));
    }

    String classPath = jarsDir(conf, driverEnv) + "/*";
    String extra = conf.get("spark.executor.extraClassPath", "");
    if (!extra.isEmpty()) {
      classPath += File.pathSeparator + extra;
    }
    words.add("-cp");
    words.add(quote(classPath));

    words.add(EXECUTOR_MAIN);
    words.add("--driver-url");
    words.add(quote(driverUrl));
    words.add("--executor-id");
    words.add("\"$PELOTON_INSTANCE_ID\"");
    String hostname = conf.get(Conf.EXECUTOR_HOSTNAME, "");
    if (!hostname.isEmpty()) {
      // Otherwise the executor advertises what Spark finds itself: $SPARK_LOCAL_HOSTNAME, or a
      // non-loopback address of its host ($SPARK_LOCAL_IP to choose one).
      words.add("--hostname");
      words.add(quote(hostname));
    }
    words.add("--cores");
    words.add(Integer.toString(executorCores(conf)));
    words.add("--app-id");
    words.add("\"$PELOTON_JOB_ID\"");
    words.add("--resourceProfileId");
    words.add("0");

    String line = String.join(" ", words);
    if (!conf.contains("spark.local.dir")) {
      // Shuffle and spill files go to the sandbox (charged to the task's disk, removed with
      // it) unless spark.local.dir or an executor SPARK_LOCAL_DIRS says otherwise.
      line = "export SPARK_LOCAL_DIRS=\"${SPARK_LOCAL_DIRS:-$PELOTON_SANDBOX}\"; " + line;
    }
    return line;
  }

  /**
   * The executor's environment: {@code SPARK_HOME}, a {@code PYTHONPATH} from which Python
   * workers import pyspark, {@code PYSPARK_PYTHON}, {@code JAVA_HOME} and the {@code
   * spark.executorEnv.*} entries (which win).
   */
  static Map<String, String> environment(SparkConf conf, Map<String, String> driverEnv) {
    Map<String, String> env = new TreeMap<>();
    String sparkHome = sparkHome(driverEnv);
    env.put("SPARK_HOME", sparkHome);

    Set<String> pythonPath = new LinkedHashSet<>();
    String driverPythonPath = driverEnv.getOrDefault("PYTHONPATH", "");
    for (String entry : driverPythonPath.split(File.pathSeparator)) {
      if (!entry.isEmpty()) {
        pythonPath.add(entry);
      }
    }
    String pysparkParent = pysparkParent(sparkHome);
    if (pysparkParent != null) {
      pythonPath.add(pysparkParent);
    }
    if (!pythonPath.isEmpty()) {
      env.put("PYTHONPATH", String.join(File.pathSeparator, pythonPath));
    }

    String python = driverEnv.get("PYSPARK_PYTHON");
    if (python == null || python.isEmpty()) {
      python = conf.get("spark.pyspark.python", "python3");
    }
    env.put("PYSPARK_PYTHON", python);

    String javaHome = driverEnv.get("JAVA_HOME");
    if (javaHome != null && !javaHome.isEmpty()) {
      env.put("JAVA_HOME", javaHome);
    }
    String libraryPath = conf.get("spark.executor.extraLibraryPath", "");
    if (!libraryPath.isEmpty()) {
      env.put("LD_LIBRARY_PATH", libraryPath);
    }
    for (Tuple2<String, String> entry : conf.getAllWithPrefix("spark.executorEnv.")) {
      env.put(entry._1(), entry._2());
    }
    return env;
  }

  /**
   * The driver's Spark installation: {@code $SPARK_HOME} (pyspark's launcher sets it to the
   * pyspark package), else the directory above the jar that holds Spark's classes.
   */
  static String sparkHome(Map<String, String> driverEnv) {
    String home = driverEnv.get("SPARK_HOME");
    if (home != null && !home.isEmpty()) {
      return home;
    }
    try {
      Path jar =
          Paths.get(SparkContext.class.getProtectionDomain().getCodeSource().getLocation().toURI());
      return jar.getParent().getParent().toString();
    } catch (Exception | LinkageError e) {
      throw new IllegalStateException(
          "cannot tell where Spark is installed: set SPARK_HOME or "
              + Conf.EXECUTOR_SPARK_JARS
              + " and "
              + Conf.EXECUTOR_JAVA,
          e);
    }
  }

  /**
   * The directory to put on executors' {@code PYTHONPATH} so that {@code import pyspark} works:
   * the one holding the pyspark package of a pip install (SPARK_HOME is the package itself), or
   * a Spark distribution's {@code python} directory; null if neither is there.
   */
  static String pysparkParent(String sparkHome) {
    File home = new File(sparkHome);
    if (new File(home, "__init__.py").isFile()) {
      File parent = home.getAbsoluteFile().getParentFile();
      return parent == null ? null : parent.getPath();
    }
    File python = new File(home, "python");
    return new File(python, "pyspark").isDirectory() ? python.getPath() : null;
  }

  /** The Spark jars of executors: {@code spark.peloton.executor.sparkJars} or SPARK_HOME/jars. */
  static String jarsDir(SparkConf conf, Map<String, String> driverEnv) {
    String dir = conf.get(Conf.EXECUTOR_SPARK_JARS, "");
    if (dir.isEmpty()) {
      dir = sparkHome(driverEnv) + "/jars";
    }
    return dir.endsWith("/") ? dir.substring(0, dir.length() - 1) : dir;
  }

  /** The executors' java: {@code spark.peloton.executor.java}, $JAVA_HOME/bin/java, or java. */
  static String javaCommand(SparkConf conf, Map<String, String> driverEnv) {
    String java = conf.get(Conf.EXECUTOR_JAVA, "");
    if (!java.isEmpty()) {
      return java;
    }
    String javaHome = driverEnv.get("JAVA_HOME");
    return javaHome == null || javaHome.isEmpty() ? "java" : javaHome + "/bin/java";
  }

  /** The JVM options Spark's launchers use on Java 17 ({@code --add-opens} and the like). */
  static List<String> moduleOptions() {
    try {
      return List.of(JavaModuleOptions.defaultModuleOptionArray());
    } catch (LinkageError notOnClassPath) {
      return List.of(FALLBACK_MODULE_OPTIONS);
    }
  }

  /**
   * A word for {@code /bin/sh}, taken literally: single-quoted, with each {@code '} written as
   * {@code '\''}. Words made only of characters the shell never interprets stay bare.
   */
  static String quote(String word) {
    if (!word.isEmpty() && word.matches("[A-Za-z0-9_@%+=:,./-]+")) {
      return word;
    }
    return "'" + word.replace("'", "'\\''") + "'";
  }

  /**
   * Spark's placeholders in {@code spark.executor.extraJavaOptions}, in an already quoted word:
   * {@code {{EXECUTOR_ID}}} and {@code {{APP_ID}}} become the task's own values.
   */
  private static String placeholders(String quoted) {
    return quoted
        .replace("{{EXECUTOR_ID}}", "'\"$PELOTON_INSTANCE_ID\"'")
        .replace("{{APP_ID}}", "'\"$PELOTON_JOB_ID\"'");
  }

  /**
   * Splits a Java options string as a shell would, without expanding anything: words separated
   * by blanks; single quotes keep everything, double quotes keep all but {@code \"} and {@code
   * \\}, a backslash outside quotes keeps the next character.
   */
  static List<String> splitOptions(String options) {
    List<String> words = new ArrayList<>();
    StringBuilder word = new StringBuilder();
    boolean inWord = false;
    char quote = 0;
    for (int i = 0; i < options.length(); i++) {
      char c = options.charAt(i);
      if (quote == '\'') {
        if (c == '\'') {
          quote = 0;
        } else {
          word.append(c);
        }
      } else if (quote == '"') {
        if (c == '"') {
          quote = 0;
        } else if (c == '\\'
            && i + 1 < options.length()
            && "\"\\".indexOf(options.charAt(i + 1)) >= 0) {
          word.append(options.charAt(++i));
        } else {
          word.append(c);
        }
      } else if (Character.isWhitespace(c)) {
        if (inWord) {
          words.add(word.toString());
          word.setLength(0);
          inWord = false;
        }
      } else {
        inWord = true;
        if (c == '\'' || c == '"') {
          quote = c;
        } else if (c == '\\' && i + 1 < options.length()) {
          word.append(options.charAt(++i));
        } else {
          word.append(c);
        }
      }
    }
    if (quote != 0) {
      throw new IllegalArgumentException(
          "spark.executor.extraJavaOptions has an unclosed " + quote + ": " + options);
    }
    if (inWord) {
      words.add(word.toString());
    }
    return words;
  }
}
