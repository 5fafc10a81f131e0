#!/bin/sh
# The envoy stand-in's entrypoint (tests/containers/envoy/Containerfile).
set -e
if [ "${1#-}" != "$1" ]; then
  set -- envoy "$@"
fi
if [ "$1" = envoy ] && [ -n "${loglevel:-}" ]; then
  set -- "$@" --log-level "$loglevel"
fi
if [ "${ENVOY_UID:-}" != 0 ] && [ "$(id -u)" = 0 ]; then
  chown envoy:envoy /dev/stdout /dev/stderr 2>/dev/null || true
  exec setpriv --reuid=envoy --regid=envoy --init-groups "$@"
fi
exec "$@"
