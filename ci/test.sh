#!/usr/bin/env bash
# The project's test command (README "Run the tests"; .ci/run runs exactly this).
# Installs what the tests need on a fresh Debian machine of this kind, then runs
# formatting, lints, the API documentation and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v valgrind >/dev/null || need_apt+=(valgrind)
command -v gcc >/dev/null || need_apt+=(gcc)
command -v objdump >/dev/null || need_apt+=(binutils)
# libipt's packet encoder is the independent reference of the PT decoder tests.
[ -f /usr/include/intel-pt.h ] || need_apt+=(libipt-dev)
# A cgo Go program must be refused before it runs (tests/it/rewriter.rs).
command -v go >/dev/null || need_apt+=(golang-go)
# The interpreter tests run Debian's dash and make instrumented (tests/it/rewriter.rs).
command -v dash >/dev/null || need_apt+=(dash)
command -v make >/dev/null || need_apt+=(make)
# Behaviour with instrumented libraries: sqlite3 and python3 run scripts (tests/it/libs.rs).
[ -x /usr/bin/sqlite3 ] || need_apt+=(sqlite3)
[ -x /usr/bin/python3 ] || need_apt+=(python3)
# The fork tests read each process's counts from the recorder's messages (tests/it/rewriter.rs).
command -v strace >/dev/null || need_apt+=(strace)
# Headless Chromium lays out the HTML report in the layout test (tests/it/report_browser.rs).
command -v chromium >/dev/null || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

# A one-off build gains nothing from incremental state (2 GB on disk).
export CARGO_INCREMENTAL=0

# Each step says how long the run has taken so far (CI logs show where the
# time goes).
step() { echo "ci: $1 (at ${SECONDS} s)" >&2; }
step "fmt"
cargo fmt --all -- --check
step "clippy"
cargo clippy --workspace --all-targets -- -D warnings
step "doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
step "test"
cargo test --workspace
step "done"
