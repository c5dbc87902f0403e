#!/usr/bin/env bash
# make gpu-check: the CUDA path in two commands of at most 5 minutes each (benchmarks/gpu_check.py
# says what each part measures): --parts speed (the attention kernel of each call site, base
# eager and compiled, beam search beside transformers' generate; 285 s) and --parts recipe (the
# Multi30k GPU recipe end to end; 290 s); with no argument both, one after the other. Results in
# benchmarks/gpu.txt (GPU_CHECK_OUTPUT), every command's output in GPU_CHECK_LOG. Without a CUDA
# GPU it says so in one line and exits 0.
#
#   bash benchmarks/gpu_check.sh                    # python: PYTHON, else .venv/bin/python, else python3
#   bash benchmarks/gpu_check.sh --parts speed      # the first command; a lent machine's first call
#   bash benchmarks/gpu_check.sh --parts recipe     # the second (.data/multi30k carried)
#   bash benchmarks/gpu_check.sh --parts profile    # optional: profile, levers, tests, sweep, wmt-hour
#   bash benchmarks/gpu_check.sh --rehearse-on-cpu --parts speed   # the code path, small, on the CPU
#   bash benchmarks/gpu_check.sh --prepare-wheels   # where pip reaches PyPI: fill .whl/ (see below)
#
# A machine without a network and without some of our packages (hydra-core, omegaconf, antlr4,
# sacremoses: the lent GPU machine's image has torch, transformers, sentencepiece, sacrebleu,
# tensorboard, tqdm, numpy, click, joblib and regex) gets them as wheels carried in .whl/ at the
# repository's root: --prepare-wheels downloads them for GPU_CHECK_PYTHON_VERSION (3.12) on
# manylinux x86-64; this script installs whatever .whl/ holds, without a network and without
# their requirements (the image's), into GPU_CHECK_SITE (a folder of its own, put first on
# PYTHONPATH). benchmarks/gpu_check.py's preflight checks that every one imports.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1

WHEELS=(hydra-core==1.3.8 omegaconf==2.3.1 sacremoses==0.2.0)
SDIST_WHEELS=(antlr4-python3-runtime==4.9.3)  # published as source only: built here (pure Python)

if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
else
    PY=python3
fi

if [ "${1:-}" = "--prepare-wheels" ]; then
    version="${GPU_CHECK_PYTHON_VERSION:-3.12}"
    mkdir -p .whl
    exclude="$(git rev-parse --git-path info/exclude 2>/dev/null)"  # a worktree's too
    if [ -n "$exclude" ] && ! grep -qx '/.whl/' "$exclude" 2>/dev/null; then
        mkdir -p "$(dirname "$exclude")" && echo /.whl/ >>"$exclude"
    fi
    platforms=()
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
        manylinux2014_x86_64 manylinux1_x86_64; do
        platforms+=(--platform "$p")
    done
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
        --implementation cp "${platforms[@]}" -d .whl "${WHEELS[@]}" || exit 1
    "$PY" -m pip wheel -q --no-deps -w .whl "${SDIST_WHEELS[@]}" || exit 1
    echo "gpu-check: .whl/ holds $(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1)," \
        "for Python $version; carry the folder to the GPU machine with the repository"
    exit 0
fi

# No GPU: one line, status 0 (a CI-safe dry run); GPUs that torch cannot use: status 1.
rehearsal=no
for argument in "$@"; do
    [ "$argument" = "--rehearse-on-cpu" ] && rehearsal=yes
done
if [ "$rehearsal" = no ]; then
    "$PY" -m benchmarks.gpu_check --probe
    case $? in
        0) ;;
        3) exit 0 ;;
        *) exit 1 ;;
    esac
fi

if compgen -G ".whl/*.whl" >/dev/null; then
    SITE="${GPU_CHECK_SITE:-${TMPDIR:-/tmp}/gpu_check_site}"
    echo "gpu-check: installing the $(ls .whl/*.whl | wc -l) wheels of .whl/ into $SITE (no network)"
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl; then
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "gpu-check: the wheels of .whl/ do not install here (for another Python?):" \
            "going on with the packages installed" >&2
    fi
fi
# The repository itself, for a machine where the package is not installed.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$PY" -m benchmarks.gpu_check "$@"
