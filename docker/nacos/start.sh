#!/bin/bash
# Entrypoint of the compose `nacos` service (qingpan/rnacos runs /usr/bin/rnacos directly): starts
# rnacos and starts it again when it hit rnacos 0.8.8's start-up race.
#
# On a first start (no data directory yet) its Raft initialisation may apply an entry before the
# actor that applies entries is wired; that actor panics (`panicked at .../raftapply.rs` in the
# log, before the HTTP port is bound), and the server then answers reads while every write
# through Raft (persistent instances: all seed-nacos registers) fails with "Mailbox has closed".
# Seen in about 1 start in 6 (tests/src/nacos.rs restarts its server the same way). So: rnacos'
# output goes to the container's log and to a file; until GET /health answers 200, a "panicked
# at" in that file stops it (SIGINT, which it stops on) and, if this start created the data
# directory, removes it; then rnacos starts again, at most 5 times. Once it answers, this script
# waits for it and passes SIGTERM on as SIGINT (`docker stop`; SIGTERM alone makes rnacos shut
# down slowly). It exits with rnacos' status, so the service's restart policy applies.
set -u
[ $# -gt 0 ] || set -- /usr/bin/rnacos
port="${RNACOS_HTTP_PORT:-8848}"
data="${RNACOS_DATA_DIR:-${RNACOS_CONFIG_DB_DIR:-nacos_db}}"
# A file of this run's own: two runs side by side (tests on one machine) must not read each
# other's output.
log="$(mktemp "${TMPDIR:-/tmp}/rnacos-start.XXXXXX")"
fresh=false
[ -e "$data" ] || fresh=true
pid=
trap '[ -n "$pid" ] && kill -INT "$pid" 2>/dev/null' INT TERM

# health: GET /health on the HTTP port answers 200 (no curl in the image: bash's /dev/tcp).
health() {
  (exec 3<>"/dev/tcp/127.0.0.1/$port" \
    && printf 'GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' >&3 \
    && head -n 1 <&3 | grep -q ' 200') 2>/dev/null
}

for attempt in 1 2 3 4 5; do
  : >"$log"
  # `trap -`: bash starts a background command with SIGINT ignored, which rnacos would inherit.
  (trap - INT QUIT; exec "$@") > >(tee -a "$log") 2>&1 &
  pid=$!
  panicked=false
  until health; do
    if grep -q 'panicked at' "$log"; then panicked=true; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if ! $panicked; then
    # Up (or exited by itself): wait for it; `wait` returns early on a trapped signal.
    while :; do
      wait "$pid"
      status=$?
      kill -0 "$pid" 2>/dev/null || exit "$status"
    done
  fi
  echo "nacos/start.sh: rnacos panicked while starting (attempt $attempt); starting it again" >&2
  kill -INT "$pid" 2>/dev/null
  for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  if $fresh; then rm -rf "$data"; fi
done
echo "nacos/start.sh: rnacos panicked at each of 5 starts" >&2
rm -f "$log"
exit 1
