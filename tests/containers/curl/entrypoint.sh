#!/bin/sh
# The curl stand-in's entrypoint (tests/containers/curl/Containerfile).
set -e
if [ "${1#-}" != "$1" ] || [ -z "$(command -v "$1")" ]; then
  set -- curl "$@"
fi
exec "$@"
