# device_env.sh - sourced, from the root of a bundle that tools/device_stage.sh staged, by the
# scripts that run on the GPU machine (tools/h200_compare.sh, tools/arch_shapes_h200.sh,
# bench/qgemv_h200.sh, bench/qgemv3_h200.sh, bench/quant_h200.sh): the environment the bundle's
# binaries need there (our Debian libraries in .device/lib, the CUDA module beside the binary,
# the test data and fixtures), and the names those scripts share:
#   root  the bundle's root (the current directory);   out  $OUT, else /tmp/out (created);
#   P     the pagoda binary;   B  the build folder (tests/gpu_bin, bench/);
#   el    `el TEXT`: a log line with the seconds since sourcing.
root=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$root/.device/lib:$root/.device/build:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PAGODA_BACKEND_PATH="$root/.device/build" PAGODA_SOURCE_DIR="$root"
export PAGODA_TESTDATA="$root/.device/testdata" PAGODA_FIXTURES="$root/tests/fixtures"
P=$root/.device/build/pagoda
B=$root/.device/build
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s] $*"; }
