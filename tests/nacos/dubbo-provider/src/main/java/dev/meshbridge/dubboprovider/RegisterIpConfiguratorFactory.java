package dev.meshbridge.dubboprovider;

import org.apache.dubbo.common.URL;
import org.apache.dubbo.rpc.cluster.Configurator;
import org.apache.dubbo.rpc.cluster.ConfiguratorFactory;

/**
 * Puts {@code --ip} on every URL exported over {@code dubbo} and {@code tri}, as the address
 * registered in Nacos and the address the server binds, loopback addresses included.
 *
 * <p>Dubbo treats any {@code 127.x} host as "no host configured": a protocol's {@code host} (and
 * {@code DUBBO_IP_TO_BIND}/{@code DUBBO_IP_TO_REGISTRY}, which reject it outright) then gives way
 * to the machine's first non-loopback address, and a server whose bind address is {@code 127.x}
 * binds the wildcard address instead. The tests run on loopback, so this hook, which Dubbo calls
 * for each URL it builds when a {@link ConfiguratorFactory} extension is named after the URL's
 * protocol (registered in META-INF/dubbo/org.apache.dubbo.rpc.cluster.ConfiguratorFactory), sets
 * the host to IP, turns {@code anyhost} off and binds IP. For a {@code 127.x} address the bind
 * address is spelled as the IPv4-mapped IPv6 literal {@code ::ffff:127.x.y.z}: Java resolves it to
 * the same IPv4 address, but Dubbo's loopback check does not match it. For any other address the
 * result is what Dubbo itself does with {@code host} set.
 */
public final class RegisterIpConfiguratorFactory implements ConfiguratorFactory {
  private static volatile String ip;

  /** Set once by {@link Provider} before Dubbo starts. */
  static void setIp(String value) {
    ip = value;
  }

  @Override
  public Configurator getConfigurator(URL url) {
    return new RegisterIp(url);
  }

  private static final class RegisterIp implements Configurator {
    private final URL url;

    RegisterIp(URL url) {
      this.url = url;
    }

    @Override
    public URL getUrl() {
      return url;
    }

    @Override
    public URL configure(URL exported) {
      String address = ip;
      if (address == null) {
        return exported;
      }
      String bind = address.startsWith("127.") ? "::ffff:" + address : address;
      return exported
          .setHost(address)
          .addParameter("anyhost", false)
          .addParameter("bind.ip", bind);
    }
  }
}
