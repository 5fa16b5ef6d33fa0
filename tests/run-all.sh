#!/usr/bin/env bash
# Runs every test of the project:
#   - Rust unit tests and the integration tests that start real `thunderbolt`
#     processes, real agents and a real local iroh relay on loopback;
#   - the browser end-to-end tests: the wasm client in headless Chromium against
#     a real bridge through a real local relay; and acpx (an ACP client from npm)
#     against a warm agent of `thunderbolt host`.
#
# Preparation needs the package registries (crates, npm, Debian packages) and
# installs what is missing (as root): Chromium, the wasm toolchain, npm deps.
# The tests then run inside a fresh network namespace that has only loopback,
# so nothing a test does can leave the machine (design §5). Without
# root/unshare the tests still run, with every network knob switched off by
# the harness. TB_NO_NETNS=1 skips the namespace; TB_SKIP_BROWSER=1 skips the
# browser tests (they are part of "all tests"; CI never sets it).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${TB_IN_NETNS:-}" ]; then
  cargo build --workspace --bins --tests --locked
  if ! command -v nft >/dev/null; then
    # The resume tests cut a bridge's path with nftables inside the namespace.
    echo "run-all: installing nftables for the outage tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends nftables >/dev/null && apt-get clean
  fi
  if [ "${TB_SKIP_BROWSER:-}" != 1 ]; then
    if ! command -v chromium >/dev/null; then
      echo "run-all: installing Debian's chromium for the browser tests" >&2
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null && apt-get clean
    fi
    client-wasm/build.sh
  fi
  # The npm packages: the browser tests' driver, acpx, and the ACP SDK that the
  # restart tests' agent is built with (tests/tests/restart.rs uses it too).
  # `npm ci` refuses this lock file on a fresh machine: acpx's fs-safe names
  # optional packages for other platforms that the registry does not serve
  # (404), so the lock cannot list them. `npm install` takes the lock as it
  # is (the same versions), installs what this platform needs, saves nothing.
  if command -v npm >/dev/null; then
    (cd client-wasm/e2e && { npm ci --no-audit --no-fund --silent 2>/dev/null \
      || { echo "run-all: npm ci refused the lock file; installing it with npm install" >&2
           npm install --no-audit --no-fund --no-save --silent; }; })
  fi
  if [ "${TB_NO_NETNS:-}" != 1 ] && [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && command -v ip >/dev/null; then
    echo "run-all: entering a network namespace with only loopback" >&2
    exec unshare --net env TB_IN_NETNS=1 bash -c 'ip link set lo up && exec "$0" "$@"' "$0" "$@"
  fi
  echo "run-all: no network namespace (needs root, unshare and ip); knobs keep tests on loopback" >&2
fi

export CARGO_NET_OFFLINE=true
# Every suite runs even when one fails (--no-fail-fast, and the browser tests
# after a cargo failure): one run tells everything that fails. The statuses
# are kept by hand (set -e would stop at the first), and any failure fails
# the run at the end.
status=0
cargo test --workspace --locked --no-fail-fast "$@" || status=$?
[ "$status" -eq 0 ] || echo "run-all: cargo test failed (status $status); the other tests still run" >&2
if [ "${TB_SKIP_BROWSER:-}" != 1 ]; then
  # The browser client in Chromium, and real clients from npm (acpx).
  browser=0
  (cd client-wasm/e2e && node --test --test-concurrency=1 e2e.test.mjs acpx.test.mjs session.test.mjs files.test.mjs failover.test.mjs markdown.test.mjs relay-app.test.mjs reach.test.mjs shapes.test.mjs scopes.test.mjs) || browser=$?
  if [ "$browser" -ne 0 ]; then
    echo "run-all: the browser tests failed (status $browser)" >&2
    [ "$status" -ne 0 ] || status=$browser
  fi
fi
[ "$status" -eq 0 ] || echo "run-all: FAILED (status $status)" >&2
exit "$status"
