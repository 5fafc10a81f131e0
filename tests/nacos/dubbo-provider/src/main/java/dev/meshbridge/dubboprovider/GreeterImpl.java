package dev.meshbridge.dubboprovider;

import org.apache.dubbo.common.URL;
import org.apache.dubbo.rpc.RpcContext;
import org.apache.dubbo.rpc.RpcServiceContext;

/** Says which application, address and protocol answered, so a test can tell instances apart. */
final class GreeterImpl implements Greeter {
  private final String app;
  private final String ip;
  private final int dubboPort;
  private final int triPort;

  GreeterImpl(String app, String ip, int dubboPort, int triPort) {
    this.app = app;
    this.ip = ip;
    this.dubboPort = dubboPort;
    this.triPort = triPort;
  }

  @Override
  public String greet(String name) {
    RpcServiceContext context = RpcContext.getServiceContext();
    URL url = context.getUrl();
    String protocol = url == null ? "" : url.getProtocol();
    int port;
    if ("dubbo".equals(protocol)) {
      port = dubboPort;
    } else if ("tri".equals(protocol)) {
      port = triPort;
    } else {
      // Not expected: name what the context knows rather than guess.
      port = context.getLocalPort();
      protocol = protocol == null || protocol.isEmpty() ? "unknown" : protocol;
    }
    return "hello " + name + " from " + app + "@" + ip + ":" + port + " via " + protocol;
  }
}
