#!/usr/bin/env bash
# The memory-locality regression gate for CI: records a baseline on the main
# branch and compares pull requests with it (ci/github-workflow.example.yml
# runs it; it works in any CI or locally).
#
#   ci/memgaze-gate.sh save    [BENCH ARGS…]   record and save baseline $MEMGAZE_BASELINE
#   ci/memgaze-gate.sh compare [BENCH ARGS…]   record and compare with it
#
# BENCH ARGS go to `cargo memgaze bench` as they are (`-p my-crate`,
# `--features …`, `--manifest-path …`, `-- <harness filter>`).
#
# Environment:
#   MEMGAZE_BASELINE   baseline name (default: main)
#   MEMGAZE_COMMAND    how to run the subcommand (default: `cargo memgaze`;
#                      e.g. `path/to/cargo-memgaze memgaze`)
#   CARGO_TARGET_DIR   as cargo uses it (default: target); results,
#                      baselines and the report live in $CARGO_TARGET_DIR/memgaze
#   GITHUB_STEP_SUMMARY, GITHUB_ACTIONS   set by GitHub Actions: the verdict
#                      goes to the job summary and as annotations
#
# `compare` also writes a Markdown summary of the comparison (regressions
# first, a table of changed metrics, the report's path) to
# $CARGO_TARGET_DIR/memgaze/summary.md (`--summary-md`): the job summary
# shows it, and the example workflow posts it on the pull request.
#
# Exit status: that of `cargo memgaze bench` — 0 within the limits, 3 on a
# regression, 101 when a bench body failed, 1 or 2 on errors — except that
# `compare` without a saved baseline (the first run of a repository, an
# expired cache) warns, records without comparing and exits 0.
set -euo pipefail

usage() {
  sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[ $# -ge 1 ] || usage
mode=$1
shift
case "$mode" in
  save | compare) ;;
  -h | --help) usage ;;
  *)
    echo "error: unknown mode \`$mode\` (expected \`save\` or \`compare\`)" >&2
    exit 2
    ;;
esac

name=${MEMGAZE_BASELINE:-main}
read -r -a memgaze <<<"${MEMGAZE_COMMAND:-cargo memgaze}"
results="${CARGO_TARGET_DIR:-target}/memgaze"
summary_md="$results/summary.md"

# The same sampling and backend on both sides: the gate refuses to compare
# recordings made differently. The software recorder runs on every x86-64
# runner; Intel PT is rarely available on hosted CI machines.
flags=(--backend soft)

annotate() { # level message
  if [ -n "${GITHUB_ACTIONS:-}" ]; then
    echo "::$1::$2"
  else
    echo "$1: $2" >&2
  fi
}

summary() { # markdown line
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    echo "$1" >>"$GITHUB_STEP_SUMMARY"
  fi
}

case "$mode" in
  save)
    flags+=(--save-baseline "$name")
    ;;
  compare)
    rm -f "$summary_md"
    if [ -d "$results/baselines/$name" ]; then
      flags+=(--baseline "$name" --summary-md "$summary_md")
    else
      annotate warning "no memgaze baseline \`$name\` in $results/baselines: recording without a comparison (save one on the main branch first)"
      summary "memgaze: no baseline \`$name\` to compare with; benches recorded, not gated."
    fi
    ;;
esac

log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
# stderr (progress, warnings, the build's output) joins stdout in one pipe,
# so the CI log keeps the order the lines were written in and the log file
# holds both streams.
"${memgaze[@]}" bench "${flags[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

report="$results/report/index.html"
if [ -f "$summary_md" ]; then
  # The full summary; the report itself is the `memgaze-report` artifact.
  summary "$(cat "$summary_md")"
  if [ -n "${GITHUB_RUN_ID:-}" ]; then
    run_url="${GITHUB_SERVER_URL:-https://github.com}/${GITHUB_REPOSITORY:-}/actions/runs/$GITHUB_RUN_ID"
    summary ""
    summary "The HTML report is the \`memgaze-report\` artifact of [this run]($run_url)."
    echo "" >>"$summary_md"
    echo "The HTML report is the \`memgaze-report\` artifact of [this run]($run_url)." >>"$summary_md"
  fi
fi
case "$status" in
  0)
    if [ "$mode" = compare ] && [ ! -f "$summary_md" ] && [[ " ${flags[*]} " == *" --baseline "* ]]; then
      # Benches the baseline lacks pass without a comparison: say so.
      missing=$(grep -c ": not in baseline \`$name\`, nothing to compare" "$log" || true)
      if [ "${missing:-0}" -gt 0 ]; then
        summary "memgaze: within the limits of baseline \`$name\`; $missing bench(es) not in it, not compared."
      else
        summary "memgaze: every bench within the limits of baseline \`$name\`."
      fi
    fi
    ;;
  3)
    annotate error "memgaze: memory-locality regression against baseline \`$name\` (report: $report)"
    if [ ! -f "$summary_md" ]; then
      summary "### memgaze: regressions against baseline \`$name\`"
      summary ""
      while IFS= read -r line; do
        summary "- \`${line#regression: }\`"
      done < <(grep '^regression: ' "$log" || true)
    fi
    ;;
  101) annotate error "memgaze: a bench body failed" ;;
  *) annotate error "memgaze: cargo memgaze bench exited with $status" ;;
esac
[ -f "$report" ] && echo "report: $report" >&2
exit "$status"
