package dev.meshbridge.nacosregistrar;

import com.alibaba.nacos.api.NacosFactory;
import com.alibaba.nacos.api.PropertyKeyConst;
import com.alibaba.nacos.api.naming.NamingService;
import com.alibaba.nacos.api.naming.pojo.Instance;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

/**
 * Registers and deregisters ephemeral instances through the official Nacos client (its 2.x gRPC
 * path, as Spring Cloud Alibaba and Dubbo services do), driven line by line over stdin by the
 * end-to-end tests (tests/src/nacos.rs).
 *
 * <p>Arguments: {@code --server HOST:HTTP_PORT [--namespace NS] [--username U --password P]}.
 * Prints {@code ready} once the client is connected, then answers each command with one line,
 * {@code ok <command>} or {@code error <message>}:
 *
 * <ul>
 *   <li>{@code register SERVICE GROUP IP PORT WEIGHT [k=v,k=v...]}: an ephemeral instance in
 *       cluster DEFAULT with that metadata;
 *   <li>{@code batch SERVICE GROUP COUNT PORT PADBYTES}: COUNT ephemeral instances of one service
 *       in one {@code batchRegisterInstance} request, on 10.a.b.c (the instance's number n, from
 *       1, as a.b.c), each with metadata {@code pad} of PADBYTES characters;
 *   <li>{@code many PREFIX GROUP COUNT IP PORT}: one ephemeral instance on IP:PORT in each of COUNT
 *       services PREFIX-0 ... PREFIX-(COUNT-1), one request each;
 *   <li>{@code deregister SERVICE GROUP IP PORT};
 *   <li>{@code quit} (or the end of stdin): {@code shutDown()}, which closes the connection, and
 *       exit 0.
 * </ul>
 *
 * <p>stdout carries only these lines; the client logs to stderr (slf4j-simple).
 */
public final class Registrar {
  /** How long the client may take to connect before {@code ready} (a JVM on busy cores). */
  private static final long CONNECT_TIMEOUT_MS = 90_000;

  private Registrar() {}

  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    for (int i = 0; i < args.length; i++) {
      String value = i + 1 < args.length ? args[i + 1] : null;
      String key =
          switch (args[i]) {
            case "--server" -> PropertyKeyConst.SERVER_ADDR;
            case "--namespace" -> PropertyKeyConst.NAMESPACE;
            case "--username" -> PropertyKeyConst.USERNAME;
            case "--password" -> PropertyKeyConst.PASSWORD;
            default -> null;
          };
      if (key == null || value == null) {
        System.err.println(
            "usage: Registrar --server HOST:PORT [--namespace NS] [--username U --password P]");
        System.exit(2);
      }
      props.setProperty(key, value);
      i++;
    }
    NamingService naming = NacosFactory.createNamingService(props);
    // The client connects in the background; a command sent before it is connected fails.
    long end = System.currentTimeMillis() + CONNECT_TIMEOUT_MS;
    while (!"UP".equals(naming.getServerStatus())) {
      if (System.currentTimeMillis() > end) {
        reply("error not connected to " + props.getProperty(PropertyKeyConst.SERVER_ADDR));
        naming.shutDown();
        System.exit(1);
      }
      Thread.sleep(100);
    }
    reply("ready");

    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      line = line.trim();
      if (line.isEmpty()) {
        continue;
      }
      if (line.equals("quit")) {
        break;
      }
      try {
        run(naming, line.split("\\s+"));
        reply("ok " + line);
      } catch (Exception e) {
        reply("error " + String.valueOf(e).replace('\n', ' '));
      }
    }
    naming.shutDown();
    reply("ok quit");
    // Non-daemon threads of the client could keep the JVM alive after shutDown().
    System.exit(0);
  }

  private static void run(NamingService naming, String[] cmd) throws Exception {
    switch (cmd[0]) {
      case "register" -> {
        if (cmd.length != 6 && cmd.length != 7) {
          throw new IllegalArgumentException(
              "usage: register SERVICE GROUP IP PORT WEIGHT [k=v,k=v...]");
        }
        Instance instance = new Instance();
        instance.setIp(cmd[3]);
        instance.setPort(Integer.parseInt(cmd[4]));
        instance.setWeight(Double.parseDouble(cmd[5]));
        instance.setEphemeral(true);
        instance.setMetadata(cmd.length == 7 ? metadata(cmd[6]) : new HashMap<>());
        naming.registerInstance(cmd[1], cmd[2], instance);
      }
      case "batch" -> {
        if (cmd.length != 6) {
          throw new IllegalArgumentException("usage: batch SERVICE GROUP COUNT PORT PADBYTES");
        }
        int count = Integer.parseInt(cmd[3]);
        String pad = "x".repeat(Integer.parseInt(cmd[5]));
        List<Instance> instances = new ArrayList<>(count);
        for (int n = 1; n <= count; n++) {
          Instance instance = new Instance();
          instance.setIp("10." + (n >> 16) + "." + ((n >> 8) & 255) + "." + (n & 255));
          instance.setPort(Integer.parseInt(cmd[4]));
          instance.setEphemeral(true);
          Map<String, String> meta = new HashMap<>();
          meta.put("pad", pad);
          instance.setMetadata(meta);
          instances.add(instance);
        }
        naming.batchRegisterInstance(cmd[1], cmd[2], instances);
      }
      case "many" -> {
        if (cmd.length != 6) {
          throw new IllegalArgumentException("usage: many PREFIX GROUP COUNT IP PORT");
        }
        int count = Integer.parseInt(cmd[3]);
        for (int n = 0; n < count; n++) {
          Instance instance = new Instance();
          instance.setIp(cmd[4]);
          instance.setPort(Integer.parseInt(cmd[5]));
          instance.setEphemeral(true);
          naming.registerInstance(cmd[1] + "-" + n, cmd[2], instance);
        }
      }
      case "deregister" -> {
        if (cmd.length != 5) {
          throw new IllegalArgumentException("usage: deregister SERVICE GROUP IP PORT");
        }
        naming.deregisterInstance(cmd[1], cmd[2], cmd[3], Integer.parseInt(cmd[4]));
      }
      default -> throw new IllegalArgumentException("unknown command " + cmd[0]);
    }
  }

  /** {@code k=v,k=v} as a map; a pair without {@code =} is an error. */
  private static Map<String, String> metadata(String pairs) {
    Map<String, String> out = new HashMap<>();
    for (String pair : pairs.split(",")) {
      int eq = pair.indexOf('=');
      if (eq <= 0) {
        throw new IllegalArgumentException("metadata pair without key=value: " + pair);
      }
      out.put(pair.substring(0, eq), pair.substring(eq + 1));
    }
    return out;
  }

  private static void reply(String line) {
    System.out.println(line);
    System.out.flush();
  }
}
