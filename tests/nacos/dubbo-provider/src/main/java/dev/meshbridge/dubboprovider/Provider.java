package dev.meshbridge.dubboprovider;

import java.io.BufferedReader;
import java.io.FileOutputStream;
import java.io.FileDescriptor;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.dubbo.config.ApplicationConfig;
import org.apache.dubbo.config.MetricsConfig;
import org.apache.dubbo.config.ProtocolConfig;
import org.apache.dubbo.config.RegistryConfig;
import org.apache.dubbo.config.ServiceConfig;
import org.apache.dubbo.config.bootstrap.DubboBootstrap;

/**
 * A Dubbo 3 provider that registers itself in Nacos through Dubbo's own Nacos registry, for the
 * end-to-end tests of adapter-nacos (tests/src/nacos.rs).
 *
 * <pre>
 * java -jar dubbo-provider.jar --nacos HOST:PORT [--namespace NS] [--username U --password P]
 *     --mode interface|instance|all --app APP --ip IP --dubbo-port P1 --tri-port P2
 *     [--version V] [--group G]
 * </pre>
 *
 * <p>Exports {@link Greeter} on {@code dubbo} (port P1) and {@code tri} (Triple, port P2), both
 * bound to and registered as IP, and registers it in Nacos in Dubbo's register mode MODE:
 * {@code interface} (Dubbo 2 style services {@code providers:INTERFACE:VERSION:GROUP}),
 * {@code instance} (application-level: service APP, metadata {@code dubbo.endpoints} and {@code
 * dubbo.metadata.revision}) or {@code all}. The metadata stays local (served by the provider's own
 * MetadataService); Nacos is used neither as config center nor as metadata center, so nothing but
 * Nacos naming is needed (Dubbo then logs an ERROR "Failed register interface application mapping":
 * the interface-to-application mapping it would write to a metadata center, which Nacos naming
 * does not hold). IP may be a loopback address such as 127.0.0.5 (see {@link
 * RegisterIpConfiguratorFactory}), so several providers can share ports on distinct addresses.
 *
 * <p>stdout carries exactly two lines: {@code ready} once the services are exported and
 * registered, and {@code bye} after stdin's end or a line {@code quit} has unregistered and
 * stopped everything (exit 0). Everything else, logs included, goes to stderr.
 */
public final class Provider {
  private static final String USAGE =
      "usage: Provider --nacos HOST:PORT [--namespace NS] [--username U --password P]"
          + " --mode interface|instance|all --app APP --ip IP --dubbo-port P1 --tri-port P2"
          + " [--version V] [--group G]";

  private Provider() {}

  public static void main(String[] argv) throws Exception {
    // stdout is the protocol with the test: keep it for `ready` and `bye`, and send whatever
    // anything else prints there (a library's banner, a stray println) to stderr.
    PrintStream protocol =
        new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
    System.setOut(System.err);
    // slf4j-simple reads these when the first logger is made, so before anything logs.
    System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
    defaultProperty("org.slf4j.simpleLogger.defaultLogLevel", "info");
    defaultProperty("org.slf4j.simpleLogger.showDateTime", "true");
    defaultProperty("org.slf4j.simpleLogger.dateTimeFormat", "HH:mm:ss.SSS");
    // Dubbo's graceful shutdown waits up to this long (ms, default 10 s) for calls in flight, and
    // each Netty event loop group of a server then for a quiet period of up to 2 s: keep it short.
    defaultProperty("dubbo.service.shutdown.wait", "500");

    Map<String, String> args = parse(argv);
    String nacos = required(args, "--nacos");
    String mode = required(args, "--mode");
    if (!List.of("interface", "instance", "all").contains(mode)) {
      usage("--mode must be interface, instance or all, not " + mode);
    }
    String app = required(args, "--app");
    String ip = required(args, "--ip");
    int dubboPort = port(required(args, "--dubbo-port"));
    int triPort = port(required(args, "--tri-port"));

    ApplicationConfig application = new ApplicationConfig(app);
    application.setLogger("slf4j");
    application.setQosEnable(false);
    application.setRegisterMode(mode);
    // Application-level discovery with the metadata kept in this process: the instance in Nacos
    // carries the revision and endpoints, and consumers ask this provider's MetadataService.
    application.setMetadataType("local");
    // No registry or mapping cache files under ~/.dubbo: every run starts from Nacos.
    application.setEnableFileCache(false);

    RegistryConfig registry = new RegistryConfig("nacos://" + nacos);
    // By default Dubbo would also use the registry as config center and metadata center (Nacos
    // config): neither is needed for what lands in Nacos naming, and both slow start-up.
    registry.setUseAsConfigCenter(false);
    registry.setUseAsMetadataCenter(false);
    Map<String, String> registryParameters = new HashMap<>();
    if (args.containsKey("--namespace")) {
      registryParameters.put("namespace", args.get("--namespace"));
    }
    registry.setParameters(registryParameters);
    if (args.containsKey("--username") != args.containsKey("--password")) {
      usage("--username and --password go together");
    }
    if (args.containsKey("--username")) {
      registry.setUsername(args.get("--username"));
      registry.setPassword(args.get("--password"));
    }

    // Dubbo would replace a loopback IP by the machine's address and bind the wildcard address.
    RegisterIpConfiguratorFactory.setIp(ip);
    ProtocolConfig dubbo = new ProtocolConfig("dubbo", dubboPort);
    dubbo.setHost(ip);
    ProtocolConfig tri = new ProtocolConfig("tri", triPort);
    tri.setHost(ip);

    // No metrics: Dubbo turns its collectors on when Micrometer is on the class path (the Nacos
    // client brings it), so switch each off, and export no MetricsService.
    MetricsConfig metrics = new MetricsConfig();
    metrics.setExportMetricsService(false);
    metrics.setEnableMetricsInit(false);
    metrics.setEnableJvm(false);
    metrics.setEnableThreadpool(false);
    metrics.setEnableRegistry(false);
    metrics.setEnableMetadata(false);
    metrics.setEnableRpc(false);
    metrics.setEnableNetty(false);
    metrics.setEnableCollectorSync(false);

    ServiceConfig<Greeter> service = new ServiceConfig<>();
    service.setInterface(Greeter.class);
    service.setRef(new GreeterImpl(app, ip, dubboPort, triPort));
    service.setProtocols(List.of(dubbo, tri));
    if (args.containsKey("--version")) {
      service.setVersion(args.get("--version"));
    }
    if (args.containsKey("--group")) {
      service.setGroup(args.get("--group"));
    }

    DubboBootstrap bootstrap =
        DubboBootstrap.getInstance()
            .application(application)
            .registry(registry)
            .protocols(List.of(dubbo, tri))
            .metrics(metrics)
            .service(service);
    try {
      // Blocks until the services are exported, registered and the application instance (with
      // its final metadata revision) is registered.
      bootstrap.start();
    } catch (Throwable e) {
      System.err.println("dubbo-provider: start failed: " + e);
      e.printStackTrace();
      Runtime.getRuntime().halt(1);
    }
    protocol.println("ready");

    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      line = line.trim();
      if (line.equals("quit")) {
        break;
      }
      if (!line.isEmpty()) {
        System.err.println("dubbo-provider: unknown command: " + line);
      }
    }
    // Unregisters the interface-level URLs and the application instance, closes the servers
    // and the Nacos client.
    bootstrap.stop();
    protocol.println("bye");
    // Non-daemon threads left by a library must not keep the JVM up.
    System.exit(0);
  }

  private static Map<String, String> parse(String[] argv) {
    Map<String, String> args = new HashMap<>();
    List<String> known =
        List.of(
            "--nacos", "--namespace", "--username", "--password", "--mode", "--app", "--ip",
            "--dubbo-port", "--tri-port", "--version", "--group");
    for (int i = 0; i < argv.length; i += 2) {
      if (!known.contains(argv[i])) {
        usage("unknown argument " + argv[i]);
      }
      if (i + 1 >= argv.length) {
        usage(argv[i] + " needs a value");
      }
      args.put(argv[i], argv[i + 1]);
    }
    return args;
  }

  private static String required(Map<String, String> args, String name) {
    String value = args.get(name);
    if (value == null || value.isEmpty()) {
      usage(name + " is required");
    }
    return value;
  }

  private static int port(String value) {
    try {
      int port = Integer.parseInt(value);
      if (port > 0 && port < 65536) {
        return port;
      }
    } catch (NumberFormatException e) {
      // reported below
    }
    usage("not a port: " + value);
    return 0;
  }

  private static void defaultProperty(String key, String value) {
    if (System.getProperty(key) == null) {
      System.setProperty(key, value);
    }
  }

  private static void usage(String problem) {
    System.err.println("dubbo-provider: " + problem);
    System.err.println(USAGE);
    System.exit(2);
  }
}
