#!/bin/sh
# The entrypoint of the nacos/nacos-server:v2.4.3 stand-in (`sh bin/docker-startup.sh`, run in
# BASE_DIR /home/nacos), written after what the official image's bin/docker-startup.sh does with
# the image's variables; POSIX sh, as the image runs it with `sh`:
#   MODE=standalone        -Xms$JVM_XMS -Xmx$JVM_XMX -Xmn$JVM_XMN -Dnacos.standalone=true (any
#                          other MODE, the image's default `cluster` among them, is refused here:
#                          the stand-in runs one server with its embedded database only)
#   FUNCTION_MODE          config|naming: -Dnacos.functionMode (all: both, nothing passed)
#   NACOS_SERVER_IP, USE_ONLY_SITE_INTERFACES, PREFERRED_NETWORKS, IGNORED_INTERFACES
#                          -Dnacos.server.ip, -Dnacos.inetutils.use-only-site-local-interfaces,
#                          -Dnacos.inetutils.preferred-networks, -Dnacos.inetutils.ignored-interfaces
#   NACOS_AUTH_ENABLE      -Dnacos.core.auth.enabled (set: true|false; unset: the conf's, false)
#   PREFER_HOST_MODE       hostname: -Dnacos.preferHostnameOverIp=true (the server names itself
#                          by host name, not IP)
#   JAVA_OPT               prepended to the JVM's flags; JAVA_OPT_EXT put after `-jar JAR`, as
#                          upstream does (so it holds program arguments, e.g. --spring.* ones)
# and, as upstream: a GC log in logs/nacos_gc.log, -Dloader.path of the plugin directories,
# -Dnacos.home=$BASE_DIR (data in $BASE_DIR/data), Spring reading conf/application.properties
# (`--spring.config.additional-location=file:$BASE_DIR/conf/ --spring.config.name=application`),
# --server.max-http-header-size=524288, `exec java` (the JVM is PID 1 and stops on SIGTERM).
# Left out: upstream's CMS collector flags (Java 8's; the Java 17 here refuses them) and
# --logging.config=conf/nacos-logback.xml unless that file exists (the stand-in has none): the
# server's built-in logging is told -Dnacos.logs.path=$BASE_DIR/logs instead, where the release's
# nacos-logback.xml puts the logs (by default ${nacos.home}/logs; the built-in one would write
# to ~/nacos/logs).
# The settings of the image's conf/application.properties that come from the environment
# (NACOS_AUTH_TOKEN, NACOS_AUTH_IDENTITY_KEY/_VALUE, NACOS_APPLICATION_PORT, ...) are resolved by
# Spring from the environment itself (conf/application.properties, see the Containerfile).
set -eu
base="${BASE_DIR:-/home/nacos}"
java="${JAVA:-java}"

case "${MODE:-}" in
  standalone) ;;
  *)
    echo "docker-startup.sh: MODE=${MODE:-} is not supported by this stand-in of nacos/nacos-server:v2.4.3 (tests/containers/nacos-server): set MODE=standalone" >&2
    exit 1
    ;;
esac

# JVM flags, in upstream's order.
opts="${JAVA_OPT:-} -XX:SoftRefLRUPolicyMSPerMB=0 -XX:SurvivorRatio=8"
opts="$opts -Xms${JVM_XMS} -Xmx${JVM_XMX} -Xmn${JVM_XMN} -Dnacos.standalone=true"
case "${FUNCTION_MODE:-all}" in
  config) opts="$opts -Dnacos.functionMode=config" ;;
  naming) opts="$opts -Dnacos.functionMode=naming" ;;
esac
[ -z "${NACOS_SERVER_IP:-}" ] || opts="$opts -Dnacos.server.ip=$NACOS_SERVER_IP"
[ -z "${USE_ONLY_SITE_INTERFACES:-}" ] ||
  opts="$opts -Dnacos.inetutils.use-only-site-local-interfaces=$USE_ONLY_SITE_INTERFACES"
[ -z "${PREFERRED_NETWORKS:-}" ] || opts="$opts -Dnacos.inetutils.preferred-networks=$PREFERRED_NETWORKS"
[ -z "${IGNORED_INTERFACES:-}" ] || opts="$opts -Dnacos.inetutils.ignored-interfaces=$IGNORED_INTERFACES"
[ -z "${NACOS_AUTH_ENABLE:-}" ] || opts="$opts -Dnacos.core.auth.enabled=$NACOS_AUTH_ENABLE"
[ "${PREFER_HOST_MODE:-}" != hostname ] || opts="$opts -Dnacos.preferHostnameOverIp=true"
opts="$opts -Dnacos.member.list="
opts="$opts -Xlog:gc*:file=$base/logs/nacos_gc.log:time,tags:filecount=10,filesize=102400"
opts="$opts -Dloader.path=$base/plugins,$base/plugins/health,$base/plugins/cmdb,$base/plugins/selector"
opts="$opts -Dnacos.home=$base"

# The jar, then upstream's JAVA_OPT_EXT and Spring's arguments.
args="-jar $base/target/nacos-server.jar ${JAVA_OPT_EXT:-}"
args="$args --spring.config.additional-location=file:$base/conf/ --spring.config.name=application"
if [ -f "$base/conf/nacos-logback.xml" ]; then
  args="$args --logging.config=$base/conf/nacos-logback.xml"
else
  opts="$opts -Dnacos.logs.path=$base/logs"
fi
args="$args --server.max-http-header-size=524288"

mkdir -p "$base/logs"
echo "Nacos is starting (stand-in of nacos/nacos-server:v2.4.3): $java $opts $args"
# Word splitting wanted: the flags are one string, as upstream builds them.
# shellcheck disable=SC2086
exec "$java" $opts $args
