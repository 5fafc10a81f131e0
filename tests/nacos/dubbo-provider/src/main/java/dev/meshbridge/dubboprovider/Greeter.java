package dev.meshbridge.dubboprovider;

/** The one service interface the test provider exports, over both {@code dubbo} and {@code tri}. */
public interface Greeter {
  /**
   * Answers {@code "hello NAME from APP@IP:PORT via PROTOCOL"}, PORT and PROTOCOL being those of
   * the protocol the call came in on.
   */
  String greet(String name);
}
