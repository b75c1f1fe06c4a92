#!/usr/bin/env bash
# Download the wheels the GPU image lacks into .gpu_wheels/ (git-ignored), for a later session's device run:
#
#     bash benchmarks/fetch_gpu_wheels.sh            # here (needs PyPI), once per checkout
#     run(command="bash benchmarks/gpu_check.sh", carry=[".gpu_wheels"], timeout_s=540)    # the device tool
#
# The device machine (x86-64, CPython 3.12, no network) has torch, transformers, peft and accelerate, but not trl,
# datasets, evaluate or vllm; what travels with the working tree is limited to 64 MiB in all. Measured 2026-12-01:
# 36.8 MiB of wheels + 13.8 MiB of working tree (outcome files stored as .jsonl.gz) = 50.6 MiB; the wheels must stay
# under 48 MiB. Fetched, pinned to the versions tested here:
#
#   trl==1.16.0          the project's pin (trl>=1.16,<1.17); installed with --no-deps (its pandas/pyarrow pins)
#   scipy==1.17.1        trl_ext imports scipy (BASIS, PAIR's design solver, statistics); numpy>=1.26.4,<2.7
#   setuptools, wheel    the build backend of `pip install --no-deps -e .` offline
#   datasets==5.2.0, evaluate==0.4.6, dill, multiprocess, xxhash
#                        small; installed only if the image already has pyarrow (>=24) and pandas
#
# NOT fetched, not needed: transformers. The image's (about 5.17) is older than the 5.20 trl_ext declares, but TRL
# 1.16 needs only >= 4.56.2 and gpu_check.py's whole code path ran on 5.17.0 (CPU, --tiny); the wrapper installs trl
# and this repository with --no-deps, so the declared floor is not enforced there (docs/gpu.md).
# NOT fetched, too big: pyarrow (about 55 MB for 26.x) and pandas (about 12 MB). `import datasets` (and TRL, which
# imports datasets, pandas and pyarrow at module level) then works through gpu_check.py's import shims (see
# docs/gpu.md); the check trains on a list-backed dataset, which is all TRL's GRPO path needs.
#
# Usage: bash benchmarks/fetch_gpu_wheels.sh [DEST]   (DEST default .gpu_wheels; GPU_WHEELS_LIMIT_MIB default 48)
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=${1:-.gpu_wheels}
LIMIT_MIB=${GPU_WHEELS_LIMIT_MIB:-48}
TREE_LIMIT_MIB=64
PYTHON=${PYTHON:-python}

PACKAGES=(
    "trl==1.16.0"
    "scipy==1.17.1"
    "setuptools==84.2.1"
    "wheel==0.45.1"
    "datasets==5.2.0"
    "evaluate==0.4.6"
    "dill==0.4.1"
    "multiprocess==0.70.19"
    "xxhash==4.1.0"
)

mkdir -p "$DEST"
rm -f "$DEST"/*.whl "$DEST"/SHA256SUMS
echo "fetching ${#PACKAGES[@]} wheels for CPython 3.12 / manylinux x86-64 into $DEST"
"$PYTHON" -m pip download --disable-pip-version-check --no-input --quiet \
    --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
    --only-binary=:all: --no-deps -d "$DEST" "${PACKAGES[@]}"

n=$(find "$DEST" -maxdepth 1 -name '*.whl' | wc -l)
if [ "$n" -ne "${#PACKAGES[@]}" ]; then
    echo "error: expected ${#PACKAGES[@]} wheels in $DEST, found $n" >&2
    exit 1
fi
(cd "$DEST" && sha256sum ./*.whl > SHA256SUMS)

echo
printf '%10s  %s\n' bytes wheel
total=0
for f in "$DEST"/*.whl; do
    size=$(stat -c %s "$f")
    total=$((total + size))
    printf '%10d  %s\n' "$size" "$(basename "$f")"
done
wheels_mib=$(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "total: $total bytes = $wheels_mib MiB (limit $LIMIT_MIB MiB)"

# What travels to the device: tracked files + untracked files git does not ignore + the carried wheels. A tracked
# file deleted on disk (e.g. replaced by its .gz before a commit) does not travel: stat skips it (and fails, hence
# the `|| true` under `set -e -o pipefail`).
tree=0
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } \
        | xargs -0 -r stat -c %s -- 2> /dev/null | awk '{ s += $1 } END { print s + 0 }') || true
    tree=${tree:-0}
fi
tree_mib=$(awk -v b="$tree" 'BEGIN { printf "%.1f", b / 1048576 }')
all_mib=$(awk -v a="$tree" -v b="$total" 'BEGIN { printf "%.1f", (a + b) / 1048576 }')
echo "working tree: $tree_mib MiB; working tree + wheels: $all_mib MiB (limit $TREE_LIMIT_MIB MiB)"

if awk -v b="$total" -v l="$LIMIT_MIB" 'BEGIN { exit !(b > l * 1048576) }'; then
    echo "error: the wheels exceed $LIMIT_MIB MiB" >&2
    exit 1
fi
if awk -v a="$tree" -v b="$total" -v l="$TREE_LIMIT_MIB" 'BEGIN { exit !(a + b > l * 1048576) }'; then
    echo "error: working tree + wheels exceed $TREE_LIMIT_MIB MiB: the device tool would not carry them" >&2
    exit 1
fi
echo "ok: carry with run(command=\"bash benchmarks/gpu_check.sh\", carry=[\"$DEST\"], timeout_s=540)"
