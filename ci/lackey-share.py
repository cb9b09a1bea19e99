#!/usr/bin/env python3
"""How much of what a program loads in its executable a `--full` trace
records, against Valgrind Lackey on the original binary.

Usage: ci/lackey-share.py CARGO_MEMGAZE PROGRAM [ARGS...]
       (env FUNCTION=name also prints that function's share)

Instruments PROGRAM (all functions), records it with `record --full`, runs
the original under `valgrind --tool=lackey --trace-mem=yes`, and counts,
over the executable's explicit loads (the annotation's load sites; implicit
stack and string reads are excluded), Lackey's executions (one per
instruction execution that read memory) against the records: an
instrumented load is credited with min(records, Lackey count), a load
implied by a proxy with min(proxy records, Lackey count). PIE binaries run
at 0x108000 under Valgrind. Both runs use the same path length and
argument list (an interpreter's loads depend on argv[0]).

The scripts behind docs/performance.md's interpreter rows:

tables.lua:
    local t = {}
    for i = 1, 20000 do
      t[i % 5000] = (t[i % 5000] or 0) + i
    end
    local names = {}
    for k, v in pairs(t) do names["k" .. k] = v * 2 end
    local s = 0
    for i = 1, 1000 do s = s + (names["k" .. i] or 0) end
    print(#t, s)

dictlist.py (run with PYTHONHASHSEED=0 FUNCTION=_PyEval_EvalFrameDefault;
about 51 M instructions under Lackey, start-up included):
    d = {}
    for i in range(4000):
        d["k%d" % (i % 1000)] = d.get("k%d" % (i % 1000), 0) + i
    l = [v * 2 for v in d.values()]
    l.sort()
    s = 0
    for x in l[:500]:
        s += x
    print(len(d), s)
"""
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile


def lackey_counts(program, args, base):
    # Lackey's log streams through a pipe (it passed 2.5 GB for python3):
    # counted by address text, converted once at the end.
    read_end, write_end = os.pipe()
    lackey = subprocess.Popen(
        ["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-fd={write_end}", program]
        + args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        pass_fds=(write_end,),
    )
    os.close(write_end)
    counts = collections.Counter()
    ip, taken = None, False
    with os.fdopen(read_end, "rb", buffering=1 << 20) as f:
        for line in f:
            if line.startswith(b"I  "):
                ip = line[3 : line.index(b",")]
                taken = False
            elif not taken and (line.startswith(b" L ") or line.startswith(b" M ")):
                counts[ip] += 1
                taken = True
    lackey.wait()
    return collections.Counter({int(k, 16) - base: n for k, n in counts.items()})


def record_counts(memgaze, program, args, work):
    trace = os.path.join(work, "t.mgz")
    subprocess.run(
        [memgaze, "memgaze", "record", "--full", "-q", "-o", trace, "--", program] + args,
        stdout=subprocess.DEVNULL,
        check=True,
    )
    counts = collections.Counter()
    dump = subprocess.Popen([memgaze, "memgaze", "dump", trace], stdout=subprocess.PIPE)
    in_records = False
    for line in dump.stdout:
        if line.startswith(b"records"):
            in_records = True
            continue
        if not in_records or line.startswith(b"#"):
            continue
        fields = line.split()
        if len(fields) >= 4 and fields[2].startswith(b"0x"):
            counts[int(fields[2], 16)] += 1
    dump.wait()
    return counts


def main():
    memgaze, program, args = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3:]
    work = tempfile.mkdtemp()
    try:
        for side in ("o", "i"):
            os.mkdir(os.path.join(work, side))
        name = os.path.basename(program)
        original = os.path.join(work, "o", name)
        inst = os.path.join(work, "i", name)
        shutil.copy(program, original)
        report = subprocess.run(
            [memgaze, "memgaze", "instrument", original, "-o", inst, "--format", "json",
             "--annotation-format", "json"],
            stdout=subprocess.PIPE,
            check=True,
        )
        report = json.loads(report.stdout)
        annotation = json.load(open(inst + ".memgaze.json"))
        with open(original, "rb") as f:
            pie = int.from_bytes(f.read(18)[16:18], "little") == 3
        recorded = record_counts(memgaze, inst, args, work)
        seen = lackey_counts(original, args, 0x108000 if pie else 0)
        functions = annotation["functions"]
        wanted = os.environ.get("FUNCTION")
        total = covered = f_total = f_covered = 0
        for load in annotation["loads"]:
            n = seen.get(load["ip"], 0)
            if load["instrumented"]:
                got = min(recorded.get(load["ip"], 0), n)
            elif load["proxy"] is not None:
                got = min(recorded.get(load["proxy"], 0), n)
            else:
                got = 0
            total += n
            covered += got
            if wanted and functions[load["function"]]["name"] == wanted:
                f_total += n
                f_covered += got
        escapes = collections.Counter(e["reason"] for e in report["escapes"])
        print(f"{name}: {covered} of {total} Lackey loads in the executable recorded "
              f"({100.0 * covered / max(total, 1):.2f}%)")
        if wanted:
            print(f"  {wanted}: {f_covered} of {f_total} "
                  f"({100.0 * f_covered / max(f_total, 1):.2f}%)")
        print(f"  static coverage {100.0 * report['coverage']:.2f}%, "
              f"jumps through translated tables {report.get('table_jumps_translated', 'n/a')}, "
              f"escapes {dict(escapes)}")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
