"""What a loop process imports when it starts is paid again at every restart (the chaos suite's
recovery time): loading a policy and embedding prompts must not import scikit-learn
(`prepare_transformers`) or sentence-transformers (the MiniLM featurizer), both installed (MLflow
and a test need them)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from rlstream.streams.policystore import preload
from rlstream.trainers.envs.base import make_prompt
from rlstream.trainers.selection.features import make_featurizer

preload()
make_featurizer("minilm")([make_prompt("add", "12+34=", "46", 1)])
print(sorted(m for m in ("sklearn", "sentence_transformers") if m in sys.modules))
"""


def test_a_follower_and_the_minilm_featurizer_do_not_import_sklearn():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
