#!/usr/bin/env bash
# check_boundary.sh - the library boundary, checked on the built artifacts:
#  1. libpagoda.so exports only pagoda_* (what include/pagoda.h declares; -fvisibility=hidden);
#  2. the pagoda binary and libpagoda.so link no CUDA library (the CUDA backend is a dlopen'ed
#     module), and that module, when built, exports only its entry point;
#  3. the CLI sources (src/cli, and the server it runs, src/server) include no internal header:
#     only pagoda.h and their own cli/ and server/ headers.
# Usage: check_boundary.sh LIBPAGODA_SO PAGODA_BIN SOURCE_DIR [LIBPAGODA_CUDA_SO]
set -u
lib=$1 bin=$2 src=$3 mod=${4:-}
fail=0
# Names the linker itself defines in every shared object.
linker='^(_init|_fini|_edata|_end|__bss_start|_DYNAMIC|_GLOBAL_OFFSET_TABLE_)$'

exports=$(nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | grep -Ev "$linker" | sort -u)
bad=$(grep -v '^pagoda_' <<<"$exports")
n=$(grep -c . <<<"$exports")
if [[ -n $bad ]]; then
  echo "FAIL: $lib exports $(grep -c . <<<"$bad") symbols outside pagoda_*, e.g.:"
  head -20 <<<"$bad"
  fail=1
fi
for want in pagoda_engine_create pagoda_last_error pagoda_tokenizer_load pagoda_tokenizer_encode \
            pagoda_tokenizer_decode pagoda_render_template; do
  grep -qx "$want" <<<"$exports" || { echo "FAIL: $lib does not export $want"; fail=1; }
done
echo "libpagoda.so exports $n symbols"

for f in "$bin" "$lib"; do
  cuda=$(ldd "$f" | grep -Ei 'libcuda|libcudart|libcublas|libnvrtc')
  if [[ -n $cuda ]]; then
    echo "FAIL: $f links CUDA libraries:"; echo "$cuda"; fail=1
  fi
done

if [[ -n $mod ]]; then
  mexp=$(nm -D --defined-only "$mod" | awk '{print $NF}' | sed 's/@.*//' | grep -Ev "$linker" | sort -u)
  if [[ $mexp != pagoda_backend_module_init ]]; then
    echo "FAIL: $mod must export only pagoda_backend_module_init, exports:"; head -20 <<<"$mexp"; fail=1
  fi
fi

inc=$(grep -Hn '^#include "' "$src"/src/cli/*.[ch] "$src"/src/server/*.[ch] |
      grep -Ev '#include "(pagoda\.h|cli/[a-z_]+\.h|server/[a-z_]+\.h)"')
if [[ -n $inc ]]; then
  echo "FAIL: the CLI reaches past include/pagoda.h:"; echo "$inc"; fail=1
fi
[[ $fail -eq 0 ]] && echo "boundary OK"
exit $fail
