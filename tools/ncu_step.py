#!/usr/bin/env python3
"""ncu_step.py CSV: one decode step's kernels from an ncu CSV (--csv --print-units base
--metrics gpu__time_duration.sum,dram__bytes_read.sum), summed by kernel name.

The run profiled is a short greedy `pagoda run` with CUDA graphs off. A decode step is taken to be
the kernels between two launches of the embedding gather (the first kernel of every forward
pass); the last complete one is printed: kernel time, launches and, where ncu read
dram__bytes_read, the bytes read and the rate (GB/s) per kernel name, then the step's total
kernel time. Each kernel ran alone under ncu (no overlap through programmatic dependent launch),
so a small kernel carries its launch and drain (~2-3 us): the sum is an upper bound of the
kernels' share of the step's TPOT, and the rates show which kernels stream below the copy rate.
Used by bench/gpunext_h200.sh and bench/prenorm_probe_h200.sh."""
import collections
import csv
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: ncu_step.py NCU_CSV")
    with open(sys.argv[1]) as f:
        lines = [l for l in f if l.startswith('"')]
    kern = collections.OrderedDict()  # ID -> [name, time ns, bytes]
    for r in csv.DictReader(lines):
        try:
            i = int(r["ID"])
            v = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        k = kern.setdefault(i, [r["Kernel Name"], 0.0, None])
        if r.get("Metric Name") == "gpu__time_duration.sum":
            k[1] = v
        elif r.get("Metric Name") == "dram__bytes_read.sum":
            k[2] = v
    rows = [(i, *kern[i]) for i in sorted(kern)]
    print(len(rows), "kernels profiled")
    starts = [j for j, (_, n, _, _) in enumerate(rows) if "embed" in n.lower()]
    if len(starts) < 3:
        print("could not find the decode steps; kernel names:", sorted(set(n[:60] for _, n, _, _ in rows))[:30])
        return
    step = rows[starts[-2]:starts[-1]]
    tot = collections.OrderedDict()
    for _, n, t, b in step:
        k = n.split("(")[0][:90]
        e = tot.setdefault(k, [0.0, 0, 0.0, True])
        e[0] += t
        e[1] += 1
        if b is None:
            e[3] = False
        else:
            e[2] += b
    s = sum(t for _, _, t, _ in step)
    sb = sum(b or 0.0 for _, _, _, b in step)
    print(f"one decode step: {len(step)} kernels, {s / 1e3:.1f} us of kernel time, {sb / 1e6:.1f} MB read from DRAM")
    for k, (t, c, b, has_b) in sorted(tot.items(), key=lambda kv: -kv[1][0]):
        rate = f"{b / 1e6:9.1f} MB {b / t:7.1f} GB/s" if has_b and t > 0 else ""
        print(f"  {t / 1e3:9.1f} us {c:4d}x  {rate}  {k}")


if __name__ == "__main__":
    main()
