"""Registries: a duplicate is an error; declared names are known before their modules load."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlstream.registry import SELECTION_SAMPLERS, Registry


def test_a_duplicate_name_is_an_error_and_an_unknown_one_lists_the_known():
    reg = Registry("widget")
    reg.register("a")(int)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(str)
    with pytest.raises(ValueError, match="known: a"):
        reg.lookup("b")


def test_a_declared_name_resolves_to_what_its_module_registers():
    reg = Registry("widget")
    reg.declare("od", "collections:OrderedDict")
    assert reg.names() == ["od"]
    from collections import OrderedDict

    assert reg.lookup("od") is OrderedDict
    reg2 = Registry("widget")
    reg2.declare("x", "collections:OrderedDict")
    with pytest.raises(ValueError, match="already registered"):
        reg2.register("x")(dict)  # not the declared object


def test_every_declared_sampler_is_the_class_its_module_registers():
    for name in SELECTION_SAMPLERS.names():
        assert SELECTION_SAMPLERS.lookup(name).name == name


def test_checking_a_config_imports_no_sampler_and_no_torch():
    script = (
        "import sys\n"
        "from rlstream.config import Config\n"
        "Config()\n"
        "print([m for m in sys.modules if m.startswith('rlstream.trainers.selection')"
        " or m == 'torch'])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
