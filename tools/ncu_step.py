#!/usr/bin/env python3
"""ncu_step.py CSV: one decode step's kernels from an ncu CSV (--csv --print-units base
--metrics gpu__time_duration.sum,dram__bytes_read.sum), summed by kernel name.

The run profiled is a short greedy `pagoda run` with CUDA graphs off. A decode step is taken to be
the kernels between two launches of the embedding gather (the first kernel of every forward
pass); the last complete one is printed: kernel time, launches and, where ncu read
dram__bytes_read, the bytes read and the rate (GB/s) per kernel name, then the step's total
kernel time. Kernels are grouped by name and grid size, so one kernel serving matrices of
different shapes (the o and down projections, the output head) gets a row for each. Any other
metric in the CSV (e.g. sm__warps_active.avg.pct_of_peak_sustained_active, the achieved
occupancy, or launch__registers_per_thread) is printed per row as its time-weighted mean. Each
kernel ran alone under ncu (no overlap through programmatic dependent launch), so a small kernel
carries its launch and drain (~2-3 us): the sum is an upper bound of the kernels' share of the
step's TPOT, and the rates show which kernels stream below the copy rate.
Used by bench/gpunext_h200.sh and bench/prenorm_probe_h200.sh."""
import collections
import csv
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: ncu_step.py NCU_CSV")
    with open(sys.argv[1]) as f:
        lines = [l for l in f if l.startswith('"')]
    kern = collections.OrderedDict()  # ID -> [name, time ns, bytes, {other metric: value}]
    extra_names = []
    for r in csv.DictReader(lines):
        try:
            i = int(r["ID"])
            v = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        name = r["Kernel Name"].split("(")[0][:90] + (f" grid {r['Grid Size']}" if r.get("Grid Size") else "")
        k = kern.setdefault(i, [name, 0.0, None, {}])
        m = r.get("Metric Name")
        if m == "gpu__time_duration.sum":
            k[1] = v
        elif m == "dram__bytes_read.sum":
            k[2] = v
        elif m:
            k[3][m] = v
            if m not in extra_names:
                extra_names.append(m)
    rows = [(i, *kern[i]) for i in sorted(kern)]
    print(len(rows), "kernels profiled")
    starts = [j for j, row in enumerate(rows) if "embed" in row[1].lower()]
    if len(starts) < 3:
        print("could not find the decode steps; kernel names:", sorted(set(row[1][:60] for row in rows))[:30])
        return
    step = rows[starts[-2]:starts[-1]]
    tot = collections.OrderedDict()  # name -> [time, launches, bytes, all had bytes, {metric: time-weighted sum}]
    for _, n, t, b, ex in step:
        e = tot.setdefault(n, [0.0, 0, 0.0, True, collections.defaultdict(float)])
        e[0] += t
        e[1] += 1
        if b is None:
            e[3] = False
        else:
            e[2] += b
        for m, v in ex.items():
            e[4][m] += v * t
    s = sum(row[2] for row in step)
    sb = sum(row[3] or 0.0 for row in step)
    print(f"one decode step: {len(step)} kernels, {s / 1e3:.1f} us of kernel time, {sb / 1e6:.1f} MB read from DRAM")
    if extra_names:
        print("  (then, per row, the time-weighted mean of: " + ", ".join(extra_names) + ")")
    for k, (t, c, b, has_b, ex) in sorted(tot.items(), key=lambda kv: -kv[1][0]):
        rate = f"{b / 1e6:9.1f} MB {b / t:7.1f} GB/s" if has_b and t > 0 else ""
        more = "".join(f" {ex[m] / t:8.1f}" for m in extra_names) if t > 0 and extra_names else ""
        print(f"  {t / 1e3:9.1f} us {c:4d}x  {rate}{more}  {k}")

if __name__ == "__main__":
    main()
