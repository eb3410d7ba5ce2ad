#!/usr/bin/env bash
# ncu_kernels.sh REGEX SKIP COUNT CSV [pagoda run args...]: on the GPU machine, ncu over COUNT
# launches of the kernels whose name matches REGEX (after SKIP of them), in a short greedy
# `pagoda run` with CUDA graphs off, with the warp-stall breakdown (why the warps did not issue),
# issue activity, cache hit rates, time and DRAM bytes; one CSV row per metric (ncu --csv).
# For finding what holds back one kernel family (bench/RESULTS.md); the whole-step view is
# GPUNEXT_NCU in bench/gpunext_h200.sh.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source tools/device_env.sh
re=${1:?regex} skip=${2:?skip} count=${3:?count} csv=${4:?csv}
shift 4
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -n $NCU ]] || { echo "no ncu"; exit 1; }
stalls=""
for s in long_scoreboard short_scoreboard misc lg_throttle mio_throttle wait barrier membar drain no_instruction \
  math_pipe_throttle selected not_selected dispatch_stall imc_miss branch_resolving sleeping; do
  stalls+=",smsp__warp_issue_stalled_${s}_per_warp_active.pct"
done
PAGODA_CUDA_GRAPHS=0 timeout 150 "$NCU" --clock-control none --kernel-name "regex:$re" --launch-skip "$skip" \
  --launch-count "$count" --csv --print-units base \
  --metrics "gpu__time_duration.sum,dram__bytes_read.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,l1tex__t_sector_hit_rate.pct$stalls" \
  "$P" run --device cuda --temperature 0 -n 4 --ignore-eos "$@" \
  -p "one two three four five six seven eight nine ten eleven twelve" >"$csv" 2>"$csv.err"
echo "ncu rc=$?"
python3 - "$csv" <<'PY'
import csv, sys, collections
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
k = collections.OrderedDict()
for r in csv.DictReader(rows):
    try:
        v = float(r["Metric Value"].replace(",", ""))
    except ValueError:
        continue
    d = k.setdefault(r["ID"], {"name": r["Kernel Name"].split("(")[0] + " grid " + r["Grid Size"]})
    d[r["Metric Name"]] = v
for d in k.values():
    t = d.get("gpu__time_duration.sum", 0)
    print(f'{d["name"]}: {t / 1e3:.1f} us, {d.get("dram__bytes_read.sum", 0) / max(t, 1):.0f} GB/s')
    st = sorted(((v, m.split("stalled_")[1].split("_per")[0]) for m, v in d.items() if "stalled_" in m), reverse=True)
    print("   stalls (% of active warps' cycles): " + ", ".join(f"{n} {v:.0f}" for v, n in st if v >= 1))
    print("   " + ", ".join(f"{m.split('__')[1].split('.')[0]} {v:.1f}" for m, v in d.items()
                           if m not in ("name", "gpu__time_duration.sum", "dram__bytes_read.sum") and "stalled_" not in m))
PY
