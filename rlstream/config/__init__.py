"""Every setting of a run, nested by concern, each default defined once.

    cfg = Config()                                         # the defaults
    cfg = load_config("run.yaml", ["rl.lr=3e-5"])          # a YAML/JSON file, then --set
    print(show(cfg))                                       # the effective config as YAML

The in-process loop (`rlstream train`), the streaming loop (`rlstream run`) and the benchmarks
all read the same `Config`, so "the same settings" is true by construction. A section is a
small dataclass whose every field has a one-line docstring (`rlstream config show --help`);
`__post_init__` rejects bad values with a `ConfigError` naming the field and what it accepts.
"""

from rlstream.config.checks import ConfigError
from rlstream.config.files import (
    describe,
    from_dict,
    leaf_names,
    nested,
    parse_overrides,
    show,
    to_dict,
    with_values,
)
from rlstream.config.model import DataConfig, ModelConfig
from rlstream.config.run import (
    CheckpointConfig,
    Config,
    EnvConfig,
    EvalConfig,
    LoopConfig,
    SandboxConfig,
    TrackingConfig,
    format_defaults,
    load_config,
)
from rlstream.config.selection import SelectionConfig
from rlstream.config.training import PretrainConfig, RLConfig

__all__ = [
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EnvConfig",
    "SandboxConfig",
    "EvalConfig",
    "LoopConfig",
    "ModelConfig",
    "PretrainConfig",
    "RLConfig",
    "SelectionConfig",
    "TrackingConfig",
    "describe",
    "format_defaults",
    "from_dict",
    "leaf_names",
    "load_config",
    "nested",
    "parse_overrides",
    "show",
    "to_dict",
    "with_values",
]
