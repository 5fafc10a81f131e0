#!/bin/sh
# One-shot seed (curlimages/curl): registers the demo's HTTP backend in Nacos through its 1.x Open
# API (POST /nacos/v1/ns/instance, answered `ok`), as an operator or a 1.x client does, as a
# persistent instance (ephemeral=false): an ephemeral one lives only as long as the heartbeats or
# the gRPC connection of the client that registered it, and this seed exits. Nacos keeps a
# persistent instance in its Raft log (the nacos service's /home/nacos/data) and health-checks it
# itself, with a TCP connection to ip:port every few seconds: it is registered at backend-nacos'
# own address and port, where http-echo listens, so it stays healthy (and turns unhealthy, left
# out by adapter-nacos, while backend-nacos is stopped). Nacos' checks stay on: they are part of
# what the demo shows.
# Group DEFAULT_GROUP, namespace public (the default one, no namespaceId): adapter-nacos serves it
# as `hello.default-group.public` in namespace `nacos`, host `hello.default-group.public.nacos`.
set -eu
NACOS="${NACOS_URL:-http://nacos:8848}"

# register SERVICE IP PORT VERSION: a persistent, healthy instance with metadata version=VERSION.
# Retried: a write goes through Nacos' Raft log, which may not be ready when reads already are
# (a server that has just started may answer 500 for some seconds).
register() {
  tries=0
  until out=$(curl -fsS -X POST "$NACOS/nacos/v1/ns/instance?serviceName=$1&groupName=DEFAULT_GROUP&ip=$2&port=$3&weight=1&healthy=true&enabled=true&ephemeral=false&metadata=%7B%22version%22%3A%22$4%22%7D") \
    && [ "$out" = ok ]; do
    tries=$((tries + 1))
    if [ "$tries" -ge 60 ]; then
      echo "nacos: registering $1 at $2:$3 failed 60 times (last answer: ${out:-none})" >&2
      exit 1
    fi
    sleep 2
  done
  echo " nacos: DEFAULT_GROUP@@$1 $2:$3"
}

echo "waiting for Nacos at $NACOS"
until curl -fsS "$NACOS/nacos/v1/ns/service/list?pageNo=1&pageSize=1" >/dev/null 2>&1; do sleep 2; done
# backend-nacos (docker/compose.yaml: its fixed address and -listen port)
register hello 10.203.0.24 8080 v1
echo "seed done"
