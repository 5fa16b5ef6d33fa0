#!/usr/bin/env bash
# The benchmark harness in one command: builds the release binaries, then runs
# target/release/bench (tests/src/bin/bench/) with the given arguments inside a
# loopback-only network namespace when it can make one (root, unshare and ip).
#
#   tests/bench.sh --quick                 # about a minute
#   tests/bench.sh --json bench.json       # full run, also machine-readable
#   tests/bench.sh --quick --only small    # sections: setup bulk dumbpipe small many memory flood check stall resume connect
#                                          nat pressure host duplex failover devices restart
#
# The dumbpipe row needs `cargo install dumbpipe` (or DUMBPIPE=/path/to/dumbpipe)
# and the namespace: dumbpipe always talks to public relays and DNS otherwise, so
# the bench skips it when it sees any network interface besides loopback.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${TB_IN_NETNS:-}" != 1 ]; then
  cargo build --release --locked --workspace --bins
  if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && command -v ip >/dev/null; then
    exec unshare --net env TB_IN_NETNS=1 bash -c 'ip link set lo up && exec "$0" "$@"' "$0" "$@"
  fi
  echo "bench: no network namespace (needs root, unshare and ip); every process stays on loopback" >&2
fi
exec target/release/bench "$@"
