#!/bin/sh
# The consul stand-in's entrypoint (tests/containers/consul/Containerfile).
set -e
case "$1" in
  -*) set -- consul agent "$@" ;;
esac
if [ "$1" = agent ]; then
  shift
  set -- consul agent -data-dir=/consul/data -config-dir=/consul/config "$@"
elif [ "$1" != consul ] && consul --help 2>&1 | grep -q "^    $1 "; then
  set -- consul "$@"
fi
exec "$@"
