#!/usr/bin/env bash
# GPU device check: install the CuPy extra that matches what is installed (the CuPy, the
# toolkit, else the driver), run a one-line preflight (a RawKernel compile, a library
# GEMM), the GPU test suite (live gates fail instead of skipping), a GEMM table printed
# row by row, and the emitted kernels under compute-sanitizer where it runs.
# Budget: under 5 minutes on one GPU, plus up to 4 for the sanitizer runs at the end.
# Run from anywhere: ci/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3 || command -v python || true)}
if [ -z "$PY" ]; then
    echo "gpu-check: no python3 or python on PATH (or set PYTHON)" >&2
    exit 2
fi
# A GPU image's newer CuPy or NumPy may deprecate something: on this one run, show such
# warnings instead of failing on them (the suite's ini turns warnings into errors).
KEEP_WARNINGS=(-W "default::DeprecationWarning" -W "default::PendingDeprecationWarning"
               -W "default::FutureWarning")
start=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - start )) s)"; }

INSTALL=pytest_arbiter/runtime/cuda/install.py  # standard library only: runs before install
failed=()

step "detect the GPU stack"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    driver_cuda=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\)\..*/\1/p' | head -n 1)
    toolkit_cuda=""
    nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    if [ -x "$nvcc_bin" ]; then
        toolkit_cuda=$("$nvcc_bin" --version | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p' | head -n 1)
    fi
    extra=$("$PY" "$INSTALL" extra --driver-major "${driver_cuda:-12}" \
            ${toolkit_cuda:+--local-toolkit "$toolkit_cuda"})
    target=nvidia
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,uuid --format=csv,noheader
elif command -v rocminfo >/dev/null 2>&1 || [ -e /dev/kfd ]; then
    extra=rocm
    target=amd
else
    echo "gpu-check: neither a working nvidia-smi nor ROCm was found; run this on a GPU machine" >&2
    exit 2
fi
echo "target=$target extra=$extra"

# A GPU image that already holds one CuPy >= 14 (bfloat16 arrays), every runtime
# dependency, the build backend and the test tools may reach no package index at all:
# there, install the project alone, offline. Anywhere else pip removes every other CuPy
# distribution (two overwrite each other's files, and CuPy's import warning would fail
# every live test under filterwarnings = error), then installs the extra.
if "$PY" "$INSTALL" offline; then
    step "install pytest-arbiter alone (CuPy, its dependencies and the test tools are there)"
    if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . ; then
        echo "gpu-check: the offline editable install failed; using the checkout in place"
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
        export PYTEST_ADDOPTS="-p pytest_arbiter.plugin ${PYTEST_ADDOPTS:-}"
    fi
else
    others=$("$PY" "$INSTALL" conflicts "$extra")
    if [ -n "$others" ]; then
        step "remove the other CuPy distributions: $others"
        # shellcheck disable=SC2086  # one word per distribution
        "$PY" -m pip uninstall -q -y $others
    fi
    step "install pytest-arbiter[test,$extra]"
    timeout 240 "$PY" -m pip install -q -e ".[test,$extra]"
fi

step "device as the arbiter sees it"
tag=$("$PY" - "$target" <<'PYEOF'
import sys
from pytest_arbiter.device import probe_device
found = probe_device(sys.argv[1])
if isinstance(found, str):
    sys.exit(f"gpu-check: no {sys.argv[1]} device: {found}")
import cupy
print(f"{found.tag} ({found.name}), CuPy {cupy.__version__}", file=sys.stderr)
print(found.tag)
PYEOF
)

step "preflight: one RawKernel compile and launch, one library GEMM"
"$PY" -m pytest_arbiter.runtime.cuda.preflight "$target"

step "host-free GPU tests (probes, checks, compile proof when nvcc is present)"
timeout 120 "$PY" -m pytest -q -p no:cacheprovider "${KEEP_WARNINGS[@]}" \
    tests/runtime/test_cuda_host.py tests/runtime/test_cuda_compile.py \
    tests/runtime/test_cuda_bench.py

step "live gates on $tag (--arbiter-no-skip: a missing device fails)"
if [ "$target" = nvidia ]; then
    select="not amd and not rocm"
    [ "$tag" = sm_120 ] || select="$select and not sm120"
else
    select="amd or rocm"
fi
timeout 180 "$PY" -m pytest -q -p no:cacheprovider "${KEEP_WARNINGS[@]}" \
    tests/runtime/test_cuda_live.py --arbiter-no-skip -k "$select" -rs || failed+=("live gates (status $?)")

if [ "$target" = nvidia ]; then
    # rows are printed as they are measured, so a timeout keeps the ones so far; the
    # gates run at 256 cubed, not at the timed sizes
    step "GEMM benchmark: emitted vs library"
    timeout 150 "$PY" bench/gpu_gemm.py --require-device --sizes 1024,2048,4096 --repeat 20 \
        || failed+=("GEMM benchmark (status $?)")
else
    step "GEMM benchmark skipped: the emitted lane is NVIDIA-only"
fi

# Last, as it is the slowest: the emitted kernels under compute-sanitizer, after the table
# is out. Status 0 passes. A sanitizer that cannot attach to this device (seen on some GPU
# sandboxes: "Device not supported") is reported and does not fail the check; any other
# non-zero status does (3: errors found, 1: a gate failed, 124: out of time, a crash).
sanitizer=$(command -v compute-sanitizer || true)
[ -n "$sanitizer" ] || [ ! -x /usr/local/cuda/bin/compute-sanitizer ] \
    || sanitizer=/usr/local/cuda/bin/compute-sanitizer
sanitizer_failed=0
if [ "$target" != nvidia ]; then
    step "compute-sanitizer skipped: the emitted lane is NVIDIA-only"
elif [ -z "$sanitizer" ]; then
    step "compute-sanitizer skipped: not on PATH nor in /usr/local/cuda/bin"
else
    for tool in memcheck racecheck; do
        step "compute-sanitizer --tool $tool on the emitted kernels"
        log="$(mktemp)"
        status=0
        timeout 120 "$sanitizer" --tool "$tool" --error-exitcode 3 \
            "$PY" ci/sanitize_emitted.py 2>&1 | tee "$log" || status=${PIPESTATUS[0]}
        if [ "$status" -eq 0 ]; then
            echo "gpu-check: compute-sanitizer $tool: clean"
        elif grep -qiE "device not supported|unable to (find|load)|failed to initialize" "$log"; then
            echo "gpu-check: compute-sanitizer $tool could not run here (status $status)"
        else
            echo "gpu-check: compute-sanitizer $tool FAILED (status $status)"
            sanitizer_failed=1
        fi
        rm -f "$log"
    done
fi

step "done"
if [ "$sanitizer_failed" -ne 0 ]; then
    failed+=("compute-sanitizer found problems in the emitted kernels (above)")
fi
if [ "${#failed[@]}" -gt 0 ]; then
    printf 'gpu-check: failed: %s\n' "${failed[@]}"
    exit 1
fi
