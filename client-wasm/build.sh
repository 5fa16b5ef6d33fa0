#!/usr/bin/env bash
# Builds the browser client into client-wasm/pkg/ (ES module, .wasm, .d.ts).
#
# These machines cannot `rustup target add`, so the wasm32 build uses Debian's
# rustc-web toolchain with -Zbuild-std (design §4). Installs what is missing:
# the Debian toolchain packages and wasm-bindgen-cli at the exact version in
# Cargo.lock. Debian's wasm-opt is deliberately not run (its output fails at
# runtime).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"

if [ ! -x /usr/bin/rustc ] || [ ! -d /usr/lib/rustlib/src/rust ] || ! command -v clang-22 >/dev/null \
   || [ ! -x /usr/lib/llvm-22/bin/wasm-ld ]; then
  echo "build.sh: installing Debian's wasm toolchain (rustc-web, rust-web-src, clang-22, lld-22)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends rustc-web cargo-web libstd-rust-web-dev rust-web-src \
    clang-22 lld-22 llvm >/dev/null
  apt-get clean
fi

wb_version="$(awk '/^name = "wasm-bindgen"$/{getline; gsub(/"/,"",$3); print $3; exit}' Cargo.lock)"
if [ -z "$wb_version" ]; then
  echo "build.sh: cannot find wasm-bindgen in Cargo.lock" >&2
  exit 1
fi
if ! command -v wasm-bindgen >/dev/null || [ "$(wasm-bindgen --version | awk '{print $2}')" != "$wb_version" ]; then
  echo "build.sh: installing wasm-bindgen-cli $wb_version" >&2
  cargo install wasm-bindgen-cli --version "$wb_version"
fi

# wasm SIMD (Rust, std and ring's C): 42 KB smaller at the same speed; needs a
# browser from 2021 on, or Safari/WebKit 16.4 (docs/browser.md).
# -Zlocation-detail=none: panics keep their message but not the file:line of
# every panic site in std, iroh and noq: 65 KB raw, 22 KB gzipped.
# -Zfmt-debug=shallow: a derived Debug prints its type's name, not its fields
# (hand-written ones, strings and numbers print as before). Nothing the page
# shows or sends is formatted with Debug; iroh's and rustls' error chains
# that are lose their fields: 66 KB raw, 27 KB gzipped (docs/perf-log/wasm.md).
PATH=/usr/lib/llvm-22/bin:/usr/local/bin:/usr/bin:/bin \
RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld \
CC_wasm32_unknown_unknown=clang-22 AR_wasm32_unknown_unknown=llvm-ar \
RUSTFLAGS='--cfg getrandom_backend="wasm_js" -C target-feature=+simd128 -Zlocation-detail=none -Zfmt-debug=shallow' CFLAGS_wasm32_unknown_unknown=-msimd128 \
  /usr/bin/cargo build --profile wasm-release --locked --target wasm32-unknown-unknown \
    -Zbuild-std=std,panic_abort -p thunderbolt-client-wasm --target-dir target/wasm

wasm-bindgen --target web --out-dir "$here/pkg" \
  target/wasm/wasm32-unknown-unknown/wasm-release/thunderbolt_client_wasm.wasm

# Size: binaryen's wasm-opt from npm (a maintained build that installs anywhere
# npm does; Debian's binaryen 108 produces modules that fail at runtime).
binaryen_version=132.0.0
tools="$here/.tools"
if [ ! -x "$tools/node_modules/.bin/wasm-opt" ] \
   || [ "$("$tools/node_modules/.bin/wasm-opt" --version | awk '{print $3}')" != "${binaryen_version%%.*}" ]; then
  echo "build.sh: installing binaryen $binaryen_version (wasm-opt) from npm" >&2
  mkdir -p "$tools"
  npm install --prefix "$tools" --no-audit --no-fund --silent --no-save "binaryen@$binaryen_version"
fi
wasm="$here/pkg/thunderbolt_client_wasm_bg.wasm"
# --converge repeats the passes until nothing shrinks: ~4 KB for ~2 min more.
# TB_WASM_NAMES=1 keeps function names (for measure.mjs's profile; ~0.9 MB more).
strip=(--strip-debug --strip-producers)
[ "${TB_WASM_NAMES:-}" = 1 ] && strip=(-g)
"$tools/node_modules/.bin/wasm-opt" -Oz --converge --detect-features "${strip[@]}" "$wasm" -o "$wasm.opt"
mv "$wasm.opt" "$wasm"
# The name the Thunderbolt app imports its client under: the same module, so
# the app can switch to this client by copying pkg/ and nothing else.
cat > "$here/pkg/thunderbolt_acp_client.js" <<'JS'
export * from "./thunderbolt_client_wasm.js";
export { default } from "./thunderbolt_client_wasm.js";
JS
cat > "$here/pkg/thunderbolt_acp_client.d.ts" <<'TS'
export * from "./thunderbolt_client_wasm.js";
export { default } from "./thunderbolt_client_wasm.js";
TS
ls -l "$here/pkg"
echo "build.sh: $(stat -c %s "$wasm") bytes raw, $(gzip -9 -c "$wasm" | wc -c) gzipped"
