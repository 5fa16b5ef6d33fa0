#!/usr/bin/env bash
# Runs every test of the workspace: unit tests, and the integration tests that
# start real `thunderbolt` processes, real agents and a real local iroh relay
# on loopback.
#
# Dependencies are fetched and everything is built first (that needs the
# package registry); the tests then run inside a fresh network namespace that
# has only loopback, so nothing a test does can leave the machine (design §5).
# Without root/unshare the tests still run, with every network knob switched
# off by the harness. Set TB_NO_NETNS=1 to skip the namespace.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${TB_IN_NETNS:-}" ]; then
  cargo build --workspace --bins --tests --locked
  if [ "${TB_NO_NETNS:-}" != 1 ] && [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && command -v ip >/dev/null; then
    echo "run-all: entering a network namespace with only loopback" >&2
    exec unshare --net env TB_IN_NETNS=1 bash -c 'ip link set lo up && exec "$0" "$@"' "$0" "$@"
  fi
  echo "run-all: no network namespace (needs root, unshare and ip); knobs keep tests on loopback" >&2
fi

export CARGO_NET_OFFLINE=true
cargo test --workspace --locked "$@"
