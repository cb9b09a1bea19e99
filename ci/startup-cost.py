#!/usr/bin/env python3
"""The software recorder's fixed cost on short programs: wall time of
`cargo memgaze record` minus the native run, with the instrumented copy
made beforehand (as the cache has it), and the recorder's own CPU time.

Usage: ci/startup-cost.py CARGO_MEMGAZE [RUNS [LIBS]]   (default 21 runs
per case; LIBS is passed as `record --libs LIBS`, default `none`: with
libraries, their instrumented copies are cached under the scratch directory
by an untimed first recording)

Cases: a C program whose main returns 0 (compiled here with gcc -O2),
`rg --version` and `fdfind . <small tree>` when installed (Debian:
`apt-get install ripgrep fd-find`). Native and recorded runs alternate;
prints median, min and 90th percentile (ms) of each, and the recorder's
median CPU time (user + system of cargo memgaze and the program, minus
the native run's).
"""
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def timed(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall * 1e3, cpu * 1e3


def stats(xs):
    xs = sorted(xs)
    return statistics.median(xs), xs[0], xs[len(xs) * 9 // 10]


def main():
    memgaze = os.path.abspath(sys.argv[1])
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 21
    libs = sys.argv[3] if len(sys.argv) > 3 else "none"
    work = tempfile.mkdtemp(prefix="memgaze-startup-")
    os.environ["MEMGAZE_LIBS_CACHE"] = os.path.join(work, "libs")
    try:
        true_c = os.path.join(work, "true.c")
        with open(true_c, "w") as f:
            f.write("int main(void) { return 0; }\n")
        subprocess.run(["gcc", "-O2", "-o", os.path.join(work, "true"), true_c], check=True)
        tree = os.path.join(work, "tree")
        for i in range(50):
            d = os.path.join(tree, f"d{i % 7}", f"e{i % 3}")
            os.makedirs(d, exist_ok=True)
            open(os.path.join(d, f"f{i}.txt"), "w").close()
        cases = [("true-like C", os.path.join(work, "true"), [])]
        for name, tool, args in [("rg --version", "rg", ["--version"]), ("fd . tree", "fdfind", [".", tree])]:
            path = shutil.which(tool)
            if path:
                copy = os.path.join(work, tool)
                shutil.copy(path, copy)
                cases.append((name, copy, args))
            else:
                print(f"{name}: {tool} not installed, left out")
        trace = os.path.join(work, "t.trace")
        print(f"--libs {libs}; load average before: {os.getloadavg()}")
        for name, program, args in cases:
            inst = program + ".inst"
            subprocess.run([memgaze, "instrument", program, "-o", inst], check=True,
                           stdout=subprocess.DEVNULL)
            record = [memgaze, "record", "-q", "--libs", libs, "-o", trace, "--", inst] + args
            subprocess.run(record, check=True, stdout=subprocess.DEVNULL)
            native, recorded, cpu = [], [], []
            for _ in range(runs):
                n_wall, n_cpu = timed([program] + args)
                r_wall, r_cpu = timed(record)
                native.append(n_wall)
                recorded.append(r_wall)
                cpu.append(r_cpu - n_cpu)
            n, r, c = stats(native), stats(recorded), stats(cpu)
            size = os.path.getsize(inst + ".memgaze.json") / 1e6
            print(f"{name:14s} annotation {size:5.1f} MB | native med {n[0]:6.1f} min {n[1]:6.1f} p90 {n[2]:6.1f}"
                  f" | record med {r[0]:6.1f} min {r[1]:6.1f} p90 {r[2]:6.1f}"
                  f" | cost: wall med {r[0] - n[0]:6.1f} min {r[1] - n[1]:6.1f}, CPU med {c[0]:6.1f} ms")
        print(f"load average after: {os.getloadavg()}")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
