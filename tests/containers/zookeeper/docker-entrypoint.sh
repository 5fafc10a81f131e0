#!/bin/bash
# The zookeeper stand-in's entrypoint (tests/containers/zookeeper/Containerfile).
set -e
if [[ "$1" = 'zkServer.sh' && "$(id -u)" = '0' ]]; then
  chown -R zookeeper "$ZOO_DATA_DIR" "$ZOO_DATA_LOG_DIR" "$ZOO_LOG_DIR" "$ZOO_CONF_DIR"
  exec setpriv --reuid=zookeeper --regid=zookeeper --init-groups "$0" "$@"
fi
cfg="$ZOO_CONF_DIR/zoo.cfg"
if [[ ! -f "$cfg" ]]; then
  {
    echo "dataDir=$ZOO_DATA_DIR"
    echo "dataLogDir=$ZOO_DATA_LOG_DIR"
    echo "tickTime=$ZOO_TICK_TIME"
    echo "initLimit=$ZOO_INIT_LIMIT"
    echo "syncLimit=$ZOO_SYNC_LIMIT"
    echo "maxClientCnxns=$ZOO_MAX_CLIENT_CNXNS"
    echo "standaloneEnabled=$ZOO_STANDALONE_ENABLED"
    echo "admin.enableServer=$ZOO_ADMINSERVER_ENABLED"
    echo "4lw.commands.whitelist=$ZOO_4LW_COMMANDS_WHITELIST"
    if [[ -z "$ZOO_SERVERS" ]]; then
      echo "clientPort=2181"
      echo "server.1=localhost:2888:3888;2181"
    else
      for server in $ZOO_SERVERS; do echo "$server"; done
    fi
  } > "$cfg"
fi
if [[ ! -f "$ZOO_DATA_DIR/myid" ]]; then
  echo "${ZOO_MY_ID:-1}" > "$ZOO_DATA_DIR/myid"
fi
exec "$@"
