"""rlstream.config: defaults, files, --set overrides, errors that name the field, the docs."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import yaml

from rlstream.config import (
    Config,
    ConfigError,
    RLConfig,
    describe,
    load_config,
    show,
    to_dict,
    with_values,
)
from rlstream.config import leaf_names as all_leaves


def test_defaults_round_trip_through_show_as_yaml(tmp_path):
    cfg = Config()
    text = show(cfg)
    assert yaml.safe_load(text) == to_dict(cfg)
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert load_config(path) == cfg


def test_write_and_read_json_round_trip(tmp_path):
    cfg = load_config(None, ["rl.algo=ppo", "seed=3", "run_id=abc", "model.threads=1"])
    path = cfg.write(tmp_path / "config.json")
    assert json.loads(path.read_text())["rl"]["algo"] == "ppo"
    back = Config.read(path)
    assert back == cfg and back.rl.epochs == 10 and back.model.threads == 1
    assert back.group("trainer") == "rlstream-abc-trainer"


def test_set_takes_dotted_and_unique_bare_leaf_names():
    cfg = load_config(None, ["rl.steps=4", "corpus_docs=2000", "rl.hybrid=true", "rl.lr=3e-5"])
    assert cfg.rl.steps == 4 and isinstance(cfg.rl.steps, int)
    assert cfg.data.corpus_docs == 2000
    assert cfg.rl.hybrid is True and cfg.rl.lr == pytest.approx(3e-5)
    assert cfg.pretrain.lr == Config().pretrain.lr  # only the named lr changed
    assert load_config(None, ["model.threads=none"]).model.threads is None
    assert load_config(None, ["rl.steps=4", "rl.steps=5"]).rl.steps == 5  # the last one wins


def test_with_values_replaces_dotted_settings_and_leaves_the_original():
    base = Config()
    cfg = with_values(base, **{"rl.steps": 4, "data.tasks": "add"})
    assert cfg.rl.steps == 4 and cfg.data.tasks == "add"
    assert base.rl.steps == RLConfig().steps and base.data.tasks == "add,sub"
    with pytest.raises(ConfigError, match="rl.steps"):
        with_values(base, **{"rl.steps": 0})


def test_an_ambiguous_leaf_name_lists_the_choices():
    with pytest.raises(ConfigError, match="lr") as e:
        load_config(None, ["lr=1e-3"])
    msg = str(e.value)
    assert "ambiguous" in msg and "pretrain.lr" in msg and "rl.lr" in msg


@pytest.mark.parametrize("item", ["nope=1", "rl.nope=1"])
def test_an_unknown_name_is_named(item):
    name = item.split("=")[0]
    with pytest.raises(ConfigError, match="unknown setting") as e:
        load_config(None, [item])
    assert name in str(e.value)


def test_a_set_without_a_value_is_an_error():
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        load_config(None, ["rl.steps"])


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ("rl.algo=ppx", "rl.algo"),
        ("rl.steps=abc", "rl.steps"),
        ("rl.steps=1.5", "rl.steps"),
        ("rl.steps=0", "rl.steps"),
        ("rl.hybrid=maybe", "rl.hybrid"),
        ("selection.sampler=dapo", "selection.sampler"),
        ("selection.sampler=nope", "selection.sampler"),
        ("model.device=tpu", "model.device"),
        ("model.n_embd=33", "model.n_embd"),
        ("data.flaw_rate=2", "data.flaw_rate"),
        ("rl.group_size=1", "rl.group_size"),
        ("rl.reward_rules=/no/such/rules.json", "rl.reward_rules"),
        ('env.servers={"world": "10.0.0.5:8000"}', "env.servers"),
        ("env.servers=[1]", "env.servers"),
        ("loop.rollout_workers=auto:3-2", "loop.rollout_workers"),
        ("loop.rollout_workers=auto:1-9", "loop.rollout_workers"),
        ("loop.rollout_workers=some", "loop.rollout_workers"),
        ("loop.rollout_workers=0", "loop.rollout_workers"),
    ],
)
def test_bad_values_name_the_field(item, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, [item])
    assert field in str(e.value)
    assert isinstance(e.value, ValueError)


def test_dapo_is_not_a_loop_sampler_and_the_error_points_at_the_filter():
    with pytest.raises(ConfigError, match="rl.filter_zero_variance=true"):
        load_config(None, ["selection.sampler=dapo"])
    assert load_config(None, ["rl.filter_zero_variance=true"]).rl.filter_zero_variance is True


def test_the_default_sampler_is_ppm_and_uniform_can_be_chosen():
    assert Config().selection.sampler == "ppm"
    assert load_config(None, ["sampler=uniform"]).selection.sampler == "uniform"


def test_a_yaml_file_is_read_and_set_wins_over_it(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump({"seed": 7, "rl": {"steps": 12, "lr": 5e-5}, "data": {"tasks": "add"}})
    )
    cfg = load_config(path, ["rl.steps=3"])
    assert cfg.rl.steps == 3  # --set beats the file
    assert cfg.seed == 7 and cfg.rl.lr == pytest.approx(5e-5) and cfg.data.tasks == "add"
    assert cfg.rl.group_size == RLConfig().group_size  # not in the file: the default
    flags = load_config(path, ["rl.steps=3"], options={"rl.steps": 9, "seed": None})
    assert flags.rl.steps == 3 and flags.seed == 7  # flags < --set; None = not given
    assert load_config(path, [], options={"rl.steps": 9}).rl.steps == 9  # file < flags


def test_bad_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rl: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid yaml"):
        load_config(bad)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump({"rl": {"stpes": 3}}))
    with pytest.raises(ConfigError, match="rl.stpes"):
        load_config(unknown)
    typed = tmp_path / "typed.json"
    typed.write_text(json.dumps({"eval": {"prompts": "many"}}))
    with pytest.raises(ConfigError, match="eval.prompts"):
        load_config(typed)


def test_describe_documents_every_leaf():
    rows = describe(Config)
    names = [name for name, _, _ in rows]
    assert names == list(all_leaves(Config)) and len(names) == len(set(names))
    undocumented = [name for name, _, doc in rows if not doc.strip()]
    assert undocumented == [], f"settings without a docstring: {undocumented}"
    defaults = {name: default for name, default, _ in rows}
    assert defaults["rl.steps"] == repr(RLConfig().steps)
    assert defaults["selection.sampler"] == repr("ppm")
    sections = [f.name for f in fields(Config) if f.name not in ("run_id", "seed")]
    assert {n.split(".")[0] for n in names if "." in n} == set(sections)


def test_the_rl_learning_rate_follows_the_algorithm_unless_set():
    assert load_config(None, []).rl.learning_rate == pytest.approx(3e-4)  # grpo
    assert load_config(None, ["rl.algo=ppo"]).rl.learning_rate == pytest.approx(1e-4)
    assert load_config(None, ["rl.algo=ppo", "rl.lr=5e-5"]).rl.learning_rate == pytest.approx(5e-5)
    with pytest.raises(ConfigError, match="rl.lr: 0.0 must be > 0"):
        load_config(None, ["rl.lr=0"])


def test_update_epochs_and_minibatches_resolve_by_algo():
    ppo = load_config(None, ["rl.algo=ppo"]).rl
    grpo = load_config(None, ["rl.algo=grpo"]).rl
    assert (ppo.epochs, ppo.minibatches) == (10, 4)
    assert (grpo.epochs, grpo.minibatches) == (1, 1)
    explicit = load_config(None, ["rl.algo=ppo", "rl.update_epochs=3"]).rl
    assert explicit.epochs == 3 and explicit.minibatches == 4
    assert RLConfig(algo="ppo").epochs == 10 and RLConfig().epochs == 1
    # unset, they follow the algorithm even when it is switched on a built config
    switched = with_values(Config(), **{"rl.algo": "ppo"}).rl
    assert (switched.epochs, switched.minibatches) == (10, 4)


def test_config_show_prints_the_effective_config_and_errors_in_one_line(tmp_path):
    import subprocess
    import sys

    import yaml

    def show(*args):
        return subprocess.run([sys.executable, "-m", "rlstream.cli", "config", "show", *args],
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    path = tmp_path / "run.yaml"
    path.write_text("rl:\n  steps: 7\n")
    out = show("--config", str(path), "--set", "rl.lr=3e-5")
    assert out.returncode == 0, out.stderr
    shown = yaml.safe_load(out.stdout)
    assert shown == to_dict(load_config(path, ["rl.lr=3e-5"]))
    assert shown["rl"]["steps"] == 7 and shown["rl"]["lr"] == 3e-5
    described = show("--describe").stdout
    assert "data.tasks" in described and "[@dmin-dmax]" in described
    bad = show("--set", "rl.algo=ppx")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == ["error: rl.algo: 'ppx' is not one of grpo, ppo"]
