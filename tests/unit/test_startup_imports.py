"""What a loop process imports when it starts is paid again at every restart (the chaos suite's
recovery time): loading a policy must not import scikit-learn (`prepare_transformers`), which
is installed (MLflow needs it)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from rlstream.streams.policystore import preload

preload()
print(sorted(m for m in ("sklearn",) if m in sys.modules))
"""


def test_a_policy_follower_does_not_import_sklearn():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
