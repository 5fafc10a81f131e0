#!/bin/sh
# One-shot seed (curlimages/curl): registers the demo's HTTP backend in Eureka through its REST
# API, the way a Eureka client does (POST /eureka/apps/{APP}, JSON, 204).
# Eureka keeps its registry in memory and evicts an instance whose lease runs out without a
# heartbeat; this seed sends none, so the lease is long (7 days; Eureka multiplies it in an int
# of milliseconds, so at most ~24 days). A restarted `eureka` container forgets the instance: run
#   docker compose -f docker/compose.yaml up seed-eureka
# again.
set -eu
EUREKA="${EUREKA_URL:-http://eureka:8761/eureka}"

# register APP ID IP PORT: an UP instance with plain port PORT (Eureka upper-cases APP).
register() {
  curl -fsS --retry 5 --retry-all-errors --retry-delay 1 -X POST -H 'Content-Type: application/json' "$EUREKA/apps/$1" -d @- <<JSON
{"instance":{"instanceId":"$2","hostName":"$3","app":"$1","ipAddr":"$3","status":"UP",
 "port":{"\$":$4,"@enabled":"true"},"securePort":{"\$":443,"@enabled":"false"},
 "dataCenterInfo":{"@class":"com.netflix.appinfo.InstanceInfo\$DefaultDataCenterInfo","name":"MyOwn"},
 "leaseInfo":{"renewalIntervalInSecs":30,"durationInSecs":604800},
 "metadata":{"version":"v1"}}}
JSON
  echo " eureka: $1 $2 $3:$4"
}

echo "waiting for Eureka at $EUREKA"
until curl -fsS -H 'Accept: application/json' "$EUREKA/apps" >/dev/null 2>&1; do sleep 2; done
# backend-eureka (docker/compose.yaml: its fixed address and -listen port)
register HELLO hello-eureka-1 10.203.0.23 8080
echo "seed done"
