#!/usr/bin/env bash
# Builds one of the tests' Maven projects into OUTDIR/JAR, unless OUTDIR/JAR is newer than every
# file of the project's pom.xml and src/ (then calling it before each test run costs nothing).
# Artifacts come from Maven Central into the local repository (later builds need no network).
# The Maven build directory is OUTDIR/maven, never the source tree: the project's pom.xml reads
# it from the property BUILD_DIR_PROPERTY and names its jar JAR.
set -euo pipefail

if [ $# -ne 4 ]; then
  echo "usage: $0 PROJECT_DIR OUTDIR JAR BUILD_DIR_PROPERTY" >&2
  exit 2
fi
project="$(cd "$1" && pwd)"
mkdir -p "$2"
out="$(cd "$2" && pwd)"
name="$3"
property="$4"
jar="$out/$name"

if [ -f "$jar" ] && [ -z "$(find "$project/pom.xml" "$project/src" -newer "$jar" -print -quit)" ]; then
  echo "up to date: $jar"
  exit 0
fi
start=$(date +%s)
mvn -q -B -Dstyle.color=never -f "$project/pom.xml" -DskipTests \
  "-D$property=$out/maven" \
  package
built="$out/maven/$name"
if [ ! -f "$built" ]; then
  echo "maven produced no $name under $out/maven" >&2
  exit 1
fi
# Copied, then renamed: an interrupted copy never looks up to date.
cp "$built" "$jar.tmp"
mv "$jar.tmp" "$jar"
echo "built $jar in $(( $(date +%s) - start ))s"
