#!/usr/bin/env python3
"""Wall time of `cargo memgaze bench` on a 10-bench criterion 0.5 suite
(ci/criterion-suite) against `cargo bench -- --profile-time 1` of the same
suite, after the build.

Usage: ci/criterion-suite-time.py CARGO_MEMGAZE [RUNS] [TARGET_DIR]
  CARGO_MEMGAZE  the cargo-memgaze binary (e.g. target/release/cargo-memgaze)
  RUNS           repetitions (default 5)
  TARGET_DIR     the suite's target directory (default target/criterion-suite
                 in this repository; kept, so a second call builds nothing)

First both builds (`cargo bench --no-run`, and one `cargo memgaze bench`,
whose bench build adds line tables to the suite's own crate only), then per
repetition, one after the other: `cargo bench -- --profile-time 1`;
`cargo memgaze bench` with its instrumented copies deleted (the first run
after a build of changed code: instrumentation included); `cargo memgaze
bench` again (instrumented copies cached). Every command includes cargo's
own up-to-date check. Prints each run, then median and min-max per command,
and the median of the per-repetition ratios against `cargo bench`; per
`cargo memgaze bench` run, the time spent recording and analysing the
benches (the sum of their `elapsed_s`; the rest is cargo's check,
instrumentation, start-up and the report).
Exits 1 if a command fails or a bench is missing from a run.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

BENCHES = 10


def run(cmd, capture=False):
    start = time.perf_counter()
    proc = subprocess.run(
        cmd,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"error: `{' '.join(cmd)}` exited with {proc.returncode}:\n{proc.stderr}")
    return wall, proc


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    memgaze = os.path.abspath(sys.argv[1])
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = os.path.abspath(
        sys.argv[3] if len(sys.argv) > 3 else os.path.join(repo, "target", "criterion-suite")
    )
    manifest = os.path.join(repo, "ci", "criterion-suite", "Cargo.toml")
    common = ["--manifest-path", manifest, "--target-dir", target]
    native = ["cargo", "bench", "--locked", *common, "--bench", "suite", "--", "--profile-time", "1"]

    def memgaze_cmd(seed):
        return [
            memgaze, "memgaze", "bench", "--locked", *common, "--seed", str(seed),
            "--message-format", "json",
        ]

    print("building (cargo bench --no-run, then a first cargo memgaze bench) ...", flush=True)
    run(["cargo", "bench", "--locked", *common, "--no-run"])
    run(memgaze_cmd(1))
    instrumented = os.path.join(target, "memgaze", "instrumented")
    times = {"cargo bench -- --profile-time 1": [], "memgaze, instrumenting": [], "memgaze, cached": []}
    for i in range(runs):
        wall, _ = run(native)
        times["cargo bench -- --profile-time 1"].append(wall)
        shutil.rmtree(instrumented, ignore_errors=True)
        for label in ("memgaze, instrumenting", "memgaze, cached"):
            wall, proc = run(memgaze_cmd(i + 2), capture=True)
            finished = [
                m for m in map(json.loads, proc.stdout.splitlines())
                if m.get("reason") == "bench-finished"
            ]
            if len(finished) != BENCHES:
                sys.exit(f"error: {label}: {len(finished)} benches finished, expected {BENCHES}")
            low = min(m["summary"]["samples"] for m in finished)
            warned = sum(1 for m in finished if m.get("warnings"))
            recording = sum(m["elapsed_s"] for m in finished)
            times[label].append(wall)
            print(
                f"run {i + 1}: {label}: {wall:.2f} s, of which {recording:.2f} s recording and "
                f"analysing the benches (fewest samples {low}, {warned} warned)",
                flush=True,
            )
        print(f"run {i + 1}: cargo bench: {times['cargo bench -- --profile-time 1'][-1]:.2f} s", flush=True)
    base = times["cargo bench -- --profile-time 1"]
    for label, walls in times.items():
        ratios = [w / b for w, b in zip(walls, base)]
        print(
            f"{label}: median {statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f}, "
            f"{runs} runs); ratio to cargo bench: median {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
