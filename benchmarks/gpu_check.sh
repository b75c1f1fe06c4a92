#!/usr/bin/env bash
# GPU readiness check in one command, for the device machine (see docs/gpu.md):
#
#     run(command="bash benchmarks/gpu_check.sh", carry=[".gpu_wheels"], timeout_s=540)
#
# 1. installs the carried wheels offline (benchmarks/fetch_gpu_wheels.sh put them in .gpu_wheels/): trl (--no-deps),
#    scipy when missing, datasets/evaluate only if the image can satisfy them (pyarrow, pandas), then this repository
#    with `pip install --no-deps -e .` (PYTHONPATH is set to the repository as well, in case the editable install fails);
#    the image's own transformers is used (about 5.17, below trl_ext's declared 5.20 but enough for this check: see
#    docs/gpu.md), so the "unmet requirement ... transformers" line printed next is expected;
# 2. prints the versions and the GPU;
# 3. runs benchmarks/gpu_check.py, writing $OUT/gpu_check.json and the whole console log to $OUT/log ($OUT is the
#    folder the device tool copies back; without it: outputs/gpu_check/).
#
# Extra arguments go to gpu_check.py, e.g. `bash benchmarks/gpu_check.sh --trainers trl_grpo pair --steps 2`.
# Environment: GPU_WHEELS (wheel folder, default .gpu_wheels), PYTHON (default python), GPU_CHECK_SKIP_INSTALL=1.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
WHEELS=${GPU_WHEELS:-$REPO/.gpu_wheels}
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
OUT_DIR=${OUT:-$REPO/outputs/gpu_check}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/log

export PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export WANDB_DISABLED=true TOKENIZERS_PARALLELISM=false
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

pip_offline() {
    "$PYTHON" -m pip install --no-index --find-links "$WHEELS" "$@"
}

importable() {
    "$PYTHON" -c "import $1" > /dev/null 2>&1
}

install_wheels() {
    if [ "${GPU_CHECK_SKIP_INSTALL:-0}" = "1" ]; then
        echo "GPU_CHECK_SKIP_INSTALL=1: using the installed packages"
        return 0
    fi
    if ! compgen -G "$WHEELS/*.whl" > /dev/null; then
        echo "warning: no wheels in $WHEELS (run benchmarks/fetch_gpu_wheels.sh where PyPI is reachable and carry"
        echo "         .gpu_wheels); using whatever is installed"
    else
        echo "== wheels in $WHEELS"
        ls -l "$WHEELS"
        if [ -f "$WHEELS/SHA256SUMS" ]; then
            (cd "$WHEELS" && sha256sum --quiet -c SHA256SUMS) || echo "warning: wheel checksums differ"
        fi
        echo "== pip install trl (no deps: its pandas/pyarrow/datasets pins are handled below)"
        pip_offline --no-deps "trl>=1.16,<1.17" || echo "warning: trl did not install"
        if importable scipy; then
            echo "== scipy already installed"
        else
            echo "== pip install scipy"
            pip_offline scipy || echo "warning: scipy did not install (trl_ext needs it)"
        fi
        if importable datasets; then
            echo "== datasets already installed"
        else
            echo "== pip install datasets (only works if the image has pyarrow >= 24 and pandas)"
            if pip_offline datasets; then
                pip_offline evaluate || echo "note: evaluate not installable offline (not needed by the check)"
            else
                echo "note: datasets is not installable offline here; gpu_check.py uses its import shims"
            fi
        fi
    fi
    echo "== pip install --no-deps -e . (trl_ext)"
    if ! pip_offline --no-deps -e "$REPO"; then
        pip_offline --no-deps --no-build-isolation -e "$REPO" \
            || echo "note: editable install failed; trl_ext is imported through PYTHONPATH=$REPO"
    fi
}

print_versions() {
    echo "== environment"
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    uname -a
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    "$PYTHON" - << 'EOF'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
for name in ("torch", "transformers", "trl", "accelerate", "peft", "datasets", "evaluate", "scipy", "numpy",
             "pandas", "pyarrow", "tokenizers", "trl_ext"):
    try:
        mod = importlib.import_module(name)
        print(f"{name:<13}{getattr(mod, '__version__', '?'):<16}{getattr(mod, '__file__', '')}")
    except Exception as e:  # noqa: BLE001
        print(f"{name:<13}MISSING ({type(e).__name__}: {str(e)[:100]})")
try:  # requirements of trl and trl-ext the image does not meet (informational: the shims cover datasets & co.)
    from importlib.metadata import PackageNotFoundError, requires, version
    from packaging.requirements import Requirement
    for dist in ("trl", "trl-ext"):
        for text in requires(dist) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = version(req.name)
            except PackageNotFoundError:
                have = None
            if have is None or not req.specifier.contains(have, prereleases=True):
                print(f"unmet requirement of {dist}: {req} (installed: {have})")
except Exception as e:  # noqa: BLE001
    print("requirement check skipped:", type(e).__name__, e)
import torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.1f} GiB")
EOF
}

main() {
    local t0=$SECONDS
    echo "== gpu_check.sh in $REPO, output in $OUT_DIR"
    install_wheels
    print_versions
    echo "== install + versions took $((SECONDS - t0)) s"
    echo "== python benchmarks/gpu_check.py --output $OUT_DIR/gpu_check.json $*"
    "$PYTHON" benchmarks/gpu_check.py --output "$OUT_DIR/gpu_check.json" "$@"
    local rc=$?
    echo "== gpu_check.py exit code $rc after $((SECONDS - t0)) s in all"
    return $rc
}

main "$@" 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
