#!/bin/sh
# One-shot seed (curlimages/curl): makes the compose Kubernetes API server a mesh cluster for
# istiod's `k8s://` source, as tests/src/mesh.rs does for the traffic tests:
#   1. Istio's CRDs (the base chart's crd-all.gen.yaml of the same Istio as the istiod image),
#   2. a mesh-wide PeerAuthentication with mTLS DISABLE (a stock Envoy has no istio-agent to get
#      certificates from; only needed with iptables capture, harmless without),
#   3. a Sidecar for namespace `default` (the envoy service's namespace, docker/envoy/bootstrap.yaml)
#      whose egress imports only the namespaces of EGRESS_NAMESPACES (the Consul, ZooKeeper and
#      Eureka adapters'), so the demo sidecar gets listeners and clusters for those registries'
#      services, not for every Service of the cluster and every file adapter entry.
# Every object is written with server-side apply, so a second `up` (etcd keeps its volume)
# updates instead of failing.
set -eu
KUBE="${KUBE_API:-https://kube-apiserver:6443}"
TOKEN="${KUBE_TOKEN:-demo-istiod-token}"
CRDS="${ISTIO_CRDS_URL:?ISTIO_CRDS_URL: where Istio's crd-all.gen.yaml is}"
# Where the egress of the Sidecar points: adapters' --namespace defaults.
EGRESS_NAMESPACES="${EGRESS_NAMESPACES:-consul zookeeper eureka}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# apply PATH FILE: server-side apply of the YAML object in FILE at PATH (the object's own URL).
# Retried on transport errors: podman's DNS server can fail a lookup on a busy machine (seen:
# `Could not resolve host: kube-apiserver` right after a request to it had worked), and an
# apply is idempotent.
apply() {
  code=$(curl -sSk --retry 5 --retry-all-errors --retry-delay 1 -o "$work/out" -w '%{http_code}' -X PATCH \
    -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/apply-patch+yaml' \
    --data-binary @"$2" "$KUBE$1?fieldManager=mcp-demo-seed&force=true")
  case "$code" in
    200|201) echo " kube: $1 ($code)" ;;
    *) echo "applying $1: HTTP $code" >&2; cat "$work/out" >&2; return 1 ;;
  esac
}

# serves GROUP_VERSION RESOURCE: the API server serves RESOURCE in GROUP_VERSION.
serves() {
  # (the API server pretty-prints JSON for curl: `"name": "sidecars"`)
  curl -fsSk -H "Authorization: Bearer $TOKEN" "$KUBE/apis/$1" 2>/dev/null |
    grep -Eq "\"name\": ?\"$2\""
}

echo "waiting for the Kubernetes API server at $KUBE"
until curl -fsSk -H "Authorization: Bearer $TOKEN" "$KUBE/readyz" >/dev/null 2>&1; do sleep 1; done

for ns in istio-system default; do
  printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n' "$ns" >"$work/ns.yaml"
  apply "/api/v1/namespaces/$ns" "$work/ns.yaml"
done

echo "Istio CRDs from $CRDS"
curl -fsSL --retry 5 --retry-all-errors "$CRDS" -o "$work/crds.yaml"
# One file per YAML document; each CRD applied under its metadata.name (the first
# two-space-indented `name:` of a document: metadata comes before spec in these files).
awk -v dir="$work" '/^---/ {n++; next} {print > (dir "/crd-" n ".yaml")}' "$work/crds.yaml"
count=0
for f in "$work"/crd-*.yaml; do
  grep -q '^kind: CustomResourceDefinition' "$f" || continue
  name=$(awk '/^  name: / {print $2; exit}' "$f")
  case "$name" in
    *.istio.io) ;;
    *) echo "unexpected CRD name '$name' in $CRDS" >&2; exit 1 ;;
  esac
  apply "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name" "$f" >/dev/null
  count=$((count + 1))
done
[ "$count" -gt 0 ] || { echo "no CustomResourceDefinition in $CRDS" >&2; exit 1; }
echo " kube: $count Istio CRDs"

echo "waiting for the API server to serve them"
until serves networking.istio.io/v1 sidecars && serves security.istio.io/v1 peerauthentications; do
  sleep 1
done

cat >"$work/peerauthentication.yaml" <<'YAML'
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: DISABLE}}
YAML
apply /apis/security.istio.io/v1/namespaces/istio-system/peerauthentications/default \
  "$work/peerauthentication.yaml"

{
  printf 'apiVersion: networking.istio.io/v1\nkind: Sidecar\n'
  printf 'metadata: {name: default, namespace: default}\n'
  printf 'spec:\n  egress:\n  - hosts:\n'
  for ns in $EGRESS_NAMESPACES; do printf '    - "%s/*"\n' "$ns"; done
} >"$work/sidecar.yaml"
apply /apis/networking.istio.io/v1/namespaces/default/sidecars/default "$work/sidecar.yaml"
echo "seed done"
