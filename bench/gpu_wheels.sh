#!/usr/bin/env bash
# The wheels a lent GPU machine needs beside its own image (JAX 0.11.2 with CUDA 13, torch,
# transformers; Python 3.12; no package index there): the pins of requirements.txt its image
# lacks or holds at other versions, and what those need that it lacks (read from each wheel's
# Requires-Dist against the image's package list, 2026-12-07). Run here, where pip reaches an
# index; the device call carries .whl/ (gitignored, 6.4 MB) and starts with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;
# then runs bench/gpu_session.py (its docstring says in what order).
set -euo pipefail
cd "$(dirname "$0")/.."

pinned() { grep -E "^$1==" requirements.txt | cut -d' ' -f1; }
wanted=(
    "$(pinned ml-collections)" "$(pinned tensorboardX)" "$(pinned datasets)"
    "$(pinned flax)" "$(pinned optax)" "$(pinned orbax-checkpoint)"
    # not ml-dtypes: the pin is for jax 0.10's start-up, and the image's JAX 0.11.2 brings its own
    "$(pinned fastapi)" "$(pinned uvicorn)"  # jaxgpt serve, bench/serve.py
    dill==0.4.1 multiprocess==0.70.19  # datasets'
    starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0  # fastapi's
    typing-inspection==0.4.5 opentelemetry-api==1.45.3 typing-extensions==4.16.0  # fastapi's, pydantic's
)
rm -rf .whl && mkdir .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${wanted[@]}" 2> >(grep -v "is ignored" >&2)
got=$(ls .whl | wc -l)
[ "$got" = "${#wanted[@]}" ] || { echo "got $got wheels of ${#wanted[@]}: ${wanted[*]}" >&2; exit 1; }
echo "$got wheels in .whl, $(du -sh .whl | cut -f1)"
