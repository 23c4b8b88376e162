#!/usr/bin/env bash
# The learning core's GPU checks, as one script for a lent CUDA machine (see the device tool):
# training/sampling throughput with MFU, a DeepSpeed ZeRO-2 run, and the default local loop.
# Needs the wheels of deepspeed's missing dependencies in .whl/ (README of the device tool);
# writes its results under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
DS_BUILD_OPS=0 python3 -m pip install -q --no-index --no-deps --no-build-isolation \
  --target /tmp/site .whl/deepspeed-*.tar.gz || exit 1
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi -L
python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, torch.cuda.get_device_name())"
rl() { python3 -m rlstream.cli "$@"; }
rl bench train --device cuda --json "$OUT/bench_train.json" 2>&1 | tee "$OUT/bench_train.txt"
rl train --mode local --backend deepspeed --set model.zero_stage=2 --pretrain-max-steps 400 --rl-steps 40 \
  --no-progress --summary "$OUT/deepspeed_zero2.json" 2>&1 | tail -30 | tee "$OUT/deepspeed_zero2.txt"
rl train --mode local --no-progress --summary "$OUT/default_gpu.json" 2>&1 | tail -30 \
  | tee "$OUT/default_gpu.txt"
