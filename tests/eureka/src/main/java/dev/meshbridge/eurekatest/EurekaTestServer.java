package dev.meshbridge.eurekatest;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.cloud.netflix.eureka.server.EnableEurekaServer;

/** A stock Eureka server; all test behaviour comes from application.properties. */
@SpringBootApplication
@EnableEurekaServer
public class EurekaTestServer {
    public static void main(String[] args) {
        SpringApplication.run(EurekaTestServer.class, args);
    }
}
