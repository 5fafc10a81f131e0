#!/bin/bash
# One-shot seed (the zookeeper image, for zkCli.sh): writes Dubbo 2 providers and a Curator /
# Spring Cloud Zookeeper instance in the layouts adapter-zookeeper reads (adapter-zookeeper/README.md,
# "Layouts"). Real Dubbo and Curator clients write ephemeral znodes that live with their session;
# these are persistent, so they outlive this one-shot container.
set -euo pipefail
ZK="${ZK_SERVERS:-zookeeper:2181}"

zk() { zkCli.sh -server "$ZK" "$@" 2>/dev/null | grep -v '^$' | tail -n 1; }

# chain PATH [DATA]: creates PATH and any missing parents (zkCli's create has no -p).
chain() {
  local path="$1" data="${2:-}" prefix=""
  local IFS=/
  for part in ${path#/}; do
    prefix="$prefix/$part"
    if [ "$prefix" = "$path" ]; then
      zk create "$prefix" "$data" >/dev/null || true
    else
      zk create "$prefix" >/dev/null || true
    fi
  done
}

# create PATH [DATA]: chain, until PATH is there. zkCli.sh starts a session per command, and on a
# busy machine a command can run before its session is up and fail with ConnectionLoss instead of
# waiting (a parent left out that way failed the demo's seed once): check, and go again.
create() {
  local path="$1" attempt
  for ((attempt = 1; attempt <= 10; attempt++)); do
    chain "$@"
    if zk stat "$path" | grep -q numChildren; then
      echo " zookeeper: $path"
      return 0
    fi
    echo "zookeeper: $path not there after attempt $attempt, trying again" >&2
    sleep 1
  done
  echo "failed to create $path" >&2
  exit 1
}

# A Dubbo provider znode: /dubbo/{interface}/providers/{URL-encoded provider URL}.
provider() {
  local iface="$1" ip="$2" port="$3" version="$4"
  local url="dubbo://$ip:$port/$iface?anyhost=true&application=demo-provider&dubbo=2.0.2&interface=$iface&methods=sayHello&side=provider&version=$version"
  local enc
  enc=$(printf '%s' "$url" | sed -e 's/%/%25/g' -e 's/:/%3A/g' -e 's#/#%2F#g' -e 's/?/%3F/g' -e 's/=/%3D/g' -e 's/&/%26/g')
  create "/dubbo/$iface/providers/$enc"
}

echo "waiting for ZooKeeper at $ZK"
until zk ls / | grep -q zookeeper; do sleep 1; done

provider com.example.GreeterService 10.2.0.1 20880 1.0.0
provider com.example.GreeterService 10.2.0.2 20880 1.0.0
provider com.example.OrderService 10.2.0.3 20881 2.1.0

# A Spring Cloud Zookeeper (Curator x-discovery) instance: /services/{name}/{id}, JSON data
# (no spaces: zkCli splits its arguments on white space).
create /services/waiter-service/b1fdcb1e \
  '{"name":"waiter-service","id":"b1fdcb1e","address":"10.3.0.1","port":8080,"sslPort":null,"payload":{"@class":"org.springframework.cloud.zookeeper.discovery.ZookeeperInstance","id":"waiter-service","name":"waiter-service","metadata":{"instance_status":"UP","zone":"a"}},"registrationTimeUTC":1618899361271,"serviceType":"DYNAMIC","uriSpec":null}'
# A real one: backend-zookeeper (docker/compose.yaml: its fixed address and -listen port), which
# the envoy service reaches as hello.zookeeper (docker/README.md, "A request through Envoy").
create /services/hello/hello-zk-1 \
  '{"name":"hello","id":"hello-zk-1","address":"10.203.0.22","port":8080,"sslPort":null,"payload":{"@class":"org.springframework.cloud.zookeeper.discovery.ZookeeperInstance","id":"hello","name":"hello","metadata":{"instance_status":"UP","version":"v1"}},"registrationTimeUTC":1700000000000,"serviceType":"DYNAMIC","uriSpec":null}'
echo "seed done"
