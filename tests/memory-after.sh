#!/usr/bin/env bash
# The bridge's RSS before and after load, sampled every 15 s: what it gives back.
#
#   tests/memory-after.sh flood      # 30 s of fresh identities dialling through a local relay
#   tests/memory-after.sh sessions   # 32 sessions moving 2 MB each at once, then 32 idle ones
#
# Needs release binaries (cargo build --release --workspace --bins). Run it inside a
# loopback-only namespace (as root: unshare --net, then ip link set lo up); every
# endpoint is kept on 127.0.0.1 and the local relay anyway. Takes about 2.5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
R=$PWD/target/release
MODE=${1:-flood}
N=32
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; pkill -P $$ 2>/dev/null; rm -rf "$W"' EXIT

rss() { awk '/VmRSS/ {print $2 " KiB"}' /proc/$BP/status; }

$R/thunderbolt-relay --dev --bind 127.0.0.1:0 > "$W/relay.out" 2>/dev/null &
for _ in $(seq 100); do grep -q listening "$W/relay.out" && break; sleep 0.1; done
RELAY=$(awk '{print $4}' "$W/relay.out")
export THUNDERBOLT_IROH_RELAY_URL=$RELAY THUNDERBOLT_IROH_DISCOVERY=off \
  THUNDERBOLT_IROH_PORTMAPPER=off THUNDERBOLT_IROH_BIND=127.0.0.1:0 RUST_LOG=warn

if [ "$MODE" = sessions ]; then
  for i in $(seq $N); do
    ID=$(THUNDERBOLT_HOME=$W/c$i $R/thunderbolt iroh id --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["nodeId"])')
    THUNDERBOLT_HOME=$W/b $R/thunderbolt iroh allow "$ID" > /dev/null
  done
fi
THUNDERBOLT_HOME=$W/b $R/thunderbolt acp --transport iroh --per-remote-max 1000 --max-agents 100 -- cat \
  > "$W/b.out" 2> "$W/b.err" < /dev/null &
BP=$!
for _ in $(seq 300); do grep -q Ticket: "$W/b.out" 2>/dev/null && break; sleep 0.1; done
T=$(awk '/Ticket:/ {print $2}' "$W/b.out")
sleep 1
echo "before: $(rss)"

if [ "$MODE" = flood ]; then
  $R/bench flood "$RELAY" "$T" 30 > /dev/null 2>&1
else
  line='{"jsonrpc":"2.0","method":"x","params":{"text":"'$(printf 'a%.0s' $(seq 100))'"}}'
  for i in $(seq $N); do
    yes "$line" | head -n 20000 | THUNDERBOLT_HOME=$W/c$i $R/thunderbolt acp connect --no-resume "$T" > /dev/null 2>&1 &
  done
  wait $(jobs -p | tail -n $N) 2>/dev/null || true
fi
echo "end of load: $(rss)"
for s in 15 30 45 60 75 90; do sleep 15; echo "t+${s}s: $(rss)"; done

if [ "$MODE" = sessions ]; then
  # Then 32 idle sessions (one echoed line each, held open): their cost on a used heap.
  for i in $(seq $N); do
    mkfifo "$W/f$i"
    ( (printf '{}\n'; sleep 600) > "$W/f$i" & )
    THUNDERBOLT_HOME=$W/c$i $R/thunderbolt acp connect --no-resume "$T" < "$W/f$i" > "$W/o$i" 2> /dev/null &
  done
  for _ in $(seq 300); do [ "$(cat "$W"/o* | wc -l)" -ge $N ] && break; sleep 0.1; done
  echo "with $N idle sessions: $(rss)"
  pkill -f "sleep 600" || true
fi
