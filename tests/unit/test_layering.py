"""The package's layering, read from the source: one training core that every loop calls, and
metrics below everything that uses them."""

from __future__ import annotations

import ast
from pathlib import Path

import rlstream

ROOT = Path(rlstream.__file__).parent


def imports(module: str) -> set[str]:
    """Every module a file imports (absolute names; `from a import b` gives a and a.b)."""
    tree = ast.parse((ROOT / module).read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


LOOPS = ("trainers/local.py", "streams/trainer.py", "trainers/selection/loop.py")


def test_every_loop_calls_the_shared_update_functions():
    for loop in LOOPS:
        names = imports(loop)
        assert "rlstream.trainers.core.rl_update" in names, loop
        assert "rlstream.trainers.core.TrainState" in names, loop
        assert "rlstream.trainers.rl.Learner" not in names, loop  # only the core drives it


def test_the_stream_trainer_does_not_import_the_in_process_entrypoint():
    assert not any(n.startswith("rlstream.trainers.local") for n in imports("streams/trainer.py"))


def test_metrics_sit_below_connectors_and_streams():
    assert not any(n.startswith("rlstream") for n in imports("metrics.py"))
    for path in [*ROOT.glob("connectors/*.py"), *ROOT.glob("streams/*.py")]:
        names = imports(str(path.relative_to(ROOT)))
        assert not any(n.startswith("rlstream.ops") for n in names), path.name


def test_no_second_sampler_registry_or_config_copy():
    assert not (ROOT / "trainers" / "samplers.py").exists()
    assert not (ROOT / "streams" / "config.py").exists()
