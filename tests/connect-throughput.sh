#!/usr/bin/env bash
# `thunderbolt acp connect` throughput: 64 MiB of ndjson through a cat agent,
# stdin → bridge → agent → stdout, three runs, MB/s each (process start and
# endpoint close included). Needs release binaries; run inside a loopback-only
# namespace (as root: unshare --net, then ip link set lo up) or with the knobs
# below, which keep everything on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
R=target/release
H=$(mktemp -d); C=$(mktemp -d)
export THUNDERBOLT_IROH_RELAY_URL=disabled THUNDERBOLT_IROH_DISCOVERY=off THUNDERBOLT_IROH_PORTMAPPER=off THUNDERBOLT_IROH_BIND=127.0.0.1:0
CID=$(THUNDERBOLT_HOME=$C $R/thunderbolt iroh id --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["nodeId"])')
THUNDERBOLT_HOME=$H $R/thunderbolt iroh allow $CID >/dev/null
THUNDERBOLT_HOME=$H $R/thunderbolt acp --transport iroh -- $R/test-agent cat > /tmp/cp.out 2>/tmp/cp.err &
BP=$!
sleep 2
T=$(grep "Ticket:" /tmp/cp.out | awk '{print $2}')
[ -f /tmp/64m.ndjson ] || python3 -c '
import sys
line = ("{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"params\":{\"t\":\"" + "a"*16000 + "\"}}\n").encode()
with open("/tmp/64m.ndjson","wb") as f:
    for _ in range(64*1024*1024//len(line)): f.write(line)
'
for i in 1 2 3; do
  s=$(date +%s.%N)
  THUNDERBOLT_HOME=$C $R/thunderbolt acp connect $T < /tmp/64m.ndjson | wc -c > /tmp/cp.n
  e=$(date +%s.%N)
  python3 -c "import os; n=int(open('/tmp/cp.n').read()); print(f'{n/1e6/($e-$s):.1f} MB/s ({n} bytes)')"
done
kill $BP
