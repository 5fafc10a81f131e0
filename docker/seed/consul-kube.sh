#!/bin/sh
# One-shot seed (curlimages/curl): registers demo services in Consul through its HTTP API (one of
# them a real HTTP backend), and creates the istio-system namespace istiod needs in the Kubernetes
# API server.
set -eu
CONSUL="${CONSUL_HTTP_ADDR:-http://consul:8500}"
KUBE="${KUBE_API:-https://kube-apiserver:6443}"
TOKEN="${KUBE_TOKEN:-demo-istiod-token}"

# register NODE SERVICE ID ADDRESS PORT PROTOCOL CHECK_STATUS
register() {
  curl -fsS --retry 5 --retry-all-errors --retry-delay 1 -X PUT "$CONSUL/v1/catalog/register" -d @- <<JSON
{"Node":"$1","Address":"$4","Service":{"ID":"$3","Service":"$2","Address":"$4","Port":$5,
 "Meta":{"protocol":"$6"}},
 "Check":{"CheckID":"service:$3","Name":"$2 health","ServiceID":"$3","Status":"$7"}}
JSON
  echo " consul: $2 $3 $4:$5 ($7)"
}

echo "waiting for Consul at $CONSUL"
until curl -fsS "$CONSUL/v1/status/leader" | grep -q ':'; do sleep 1; done
register node-a payments payments-1 10.0.0.1 8080 http passing
register node-b payments payments-2 10.0.0.2 8080 http passing
register node-a inventory inventory-1 10.0.1.1 9090 grpc passing
register node-b inventory inventory-2 10.0.1.2 9090 grpc critical # left out: check critical
# A real one: backend-consul (docker/compose.yaml: its fixed address and -listen port), which the
# envoy service reaches as hello.service.consul (docker/README.md, "A request through Envoy").
register node-c hello hello-consul-1 10.203.0.21 8080 http passing

echo "waiting for the Kubernetes API server at $KUBE"
until curl -fsSk -H "Authorization: Bearer $TOKEN" "$KUBE/readyz" >/dev/null; do sleep 1; done
code=$(curl -sSk --retry 5 --retry-all-errors --retry-delay 1 -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $TOKEN" \
  -H 'Content-Type: application/json' "$KUBE/api/v1/namespaces" \
  -d '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"istio-system"}}')
case "$code" in
  201|409) echo " kube: namespace istio-system ($code)" ;;
  *) echo "creating namespace istio-system: HTTP $code" >&2; exit 1 ;;
esac
echo "seed done"
