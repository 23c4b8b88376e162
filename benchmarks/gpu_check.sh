#!/usr/bin/env bash
# The learning core's GPU checks, as one script for a lent CUDA machine (see the device tool):
# training/sampling throughput against bare torch / model.generate with MFU and peak memory on
# the 0.5 B-parameter Qwen2-shaped preset and on the default tiny one, DeepSpeed ZeRO-2 and
# ZeRO-3 runs (ZeRO-3 stopped and resumed from its checkpoint), and the default local loop.
# Needs the wheels of deepspeed's and transformers' missing dependencies in .whl/ (README of
# the device tool); writes its results under $OUT.
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
rl bench train --device cuda --model preset:qwen2-0.5b --batch-size 16 --block-size 256 \
  --json "$OUT/bench_train_qwen2_0.5b.json" 2>&1 | tee "$OUT/bench_train_qwen2_0.5b.txt"
rl bench train --device cuda --json "$OUT/bench_train.json" 2>&1 | tee "$OUT/bench_train.txt"
rl train --mode local --backend deepspeed --set model.zero_stage=2 --pretrain-max-steps 400 --rl-steps 40 \
  --no-progress --summary "$OUT/deepspeed_zero2.json" 2>&1 | tail -30 | tee "$OUT/deepspeed_zero2.txt"
rl train --mode local --no-progress --summary "$OUT/default_gpu.json" 2>&1 | tail -30 \
  | tee "$OUT/default_gpu.txt"
rl train --mode local --backend deepspeed --set model.zero_stage=3 --pretrain-max-steps 200 \
  --rl-steps 10 --checkpoint-dir "$OUT/z3" --no-progress --summary "$OUT/zero3_part.json" \
  2>&1 | tail -5
rl train --mode local --backend deepspeed --set model.zero_stage=3 --pretrain-max-steps 200 \
  --rl-steps 20 --checkpoint-dir "$OUT/z3" --resume --no-progress \
  --summary "$OUT/zero3_resumed.json" 2>&1 | tail -30 | tee "$OUT/zero3_resumed.txt"
