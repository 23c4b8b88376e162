"""What a loop process imports when it starts is paid again at every restart (the chaos suite's
recovery time), and what it holds is held by each of the loop's torch processes: loading a
policy must not import scikit-learn or scipy.optimize (`prepare_transformers`), which are
installed (MLflow needs them)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from rlstream.streams.policystore import preload

preload()
print(sorted(m for m in ("sklearn", "scipy.optimize") if m in sys.modules))
"""


def test_a_policy_follower_does_not_import_sklearn_or_scipy_optimize():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
