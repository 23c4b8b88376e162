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


def test_the_learning_floor_imports_nothing_above_it():
    """The trainers (environments among them: the episode engine samples with the model, and
    the trainers' loops play episodes) and the sandbox below them import the floors below,
    never the loop's processes, ops or the command line."""
    above = ("rlstream.streams", "rlstream.ops", "rlstream.cli")
    for folder in ("trainers", "sandbox"):
        for path in ROOT.glob(f"{folder}/**/*.py"):
            names = imports(str(path.relative_to(ROOT)))
            assert not any(n.startswith(above) for n in names), path


def test_no_second_sampler_registry_or_config_copy():
    assert not (ROOT / "trainers" / "samplers.py").exists()
    assert not (ROOT / "streams" / "config.py").exists()


def module_graph() -> dict[str, set[str]]:
    """rlstream's modules (package faces left out) -> the rlstream modules each imports, at
    module level or inside a function (a lazy import still ties the two)."""
    mods = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts)
        if path.name == "__init__.py":
            continue
        mods[name] = path
    graph = {}
    for name, path in mods.items():
        targets = set()
        for imported in imports(str(path.relative_to(ROOT))):
            while imported and imported not in mods:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def test_no_import_circles():
    graph = module_graph()
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(trail[trail.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_the_config_imports_nothing_above_it():
    """Sampler names are checked against the registry's declared names, a task mix and a
    reward function through SETTING_CHECKS: no module of the config imports a layer above it,
    not even inside a function."""
    above = ("rlstream.trainers", "rlstream.streams", "rlstream.ops", "rlstream.cli",
             "rlstream.connectors")  # fmt: skip
    for path in ROOT.glob("config/*.py"):
        names = imports(str(path.relative_to(ROOT)))
        assert not any(n.startswith(above) for n in names), path.name


def test_the_command_line_imports_only_light_modules_at_start():
    """Each command imports what it runs inside its body; at module level the CLI package
    reads nothing below connectors but the config and the stack's plumbing."""
    for path in ROOT.glob("cli/*.py"):
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        lines = [ast.unparse(n) for n in top]
        heavy = [s for s in lines if any(w in s for w in ("torch", "trainers", "streams"))]
        assert not heavy, (path.name, heavy)
