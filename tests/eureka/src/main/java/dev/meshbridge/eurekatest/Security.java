package dev.meshbridge.eurekatest;

import org.springframework.beans.factory.annotation.Value;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.security.config.Customizer;
import org.springframework.security.config.annotation.web.builders.HttpSecurity;
import org.springframework.security.web.SecurityFilterChain;

/**
 * Open by default, as the other tests want it; with --eureka-test.auth=true every request needs
 * HTTP basic auth (spring.security.user.name/password), as a secured production Eureka does.
 * CSRF is off either way: Eureka clients POST without tokens.
 */
@Configuration
public class Security {
    @Bean
    SecurityFilterChain chain(HttpSecurity http, @Value("${eureka-test.auth:false}") boolean auth)
            throws Exception {
        http.csrf(c -> c.disable());
        if (auth) {
            http.authorizeHttpRequests(a -> a.anyRequest().authenticated())
                .httpBasic(Customizer.withDefaults());
        } else {
            http.authorizeHttpRequests(a -> a.anyRequest().permitAll());
        }
        return http.build();
    }
}
