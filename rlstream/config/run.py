"""The whole run: evaluation, checkpoints, the loop's processes, tracking, and `Config`, which
nests every section; `load_config` builds one from defaults, a file and `--set` overrides."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rlstream.config.checks import ConfigError, at_least
from rlstream.config.files import from_dict, merge, nested, parse_overrides, read_file, to_dict
from rlstream.config.model import DataConfig, ModelConfig
from rlstream.config.selection import AUTO_FEATURES, SelectionConfig
from rlstream.config.training import PretrainConfig, RLConfig


@dataclass
class EvalConfig:
    prompts: int = 256
    """held-out prompts evaluated (never trained on)"""
    samples: int = 8
    """samples per prompt for pass@1"""
    interval: int = 25
    """RL steps between held-out evaluations"""

    def __post_init__(self):
        at_least("eval", "prompts", self.prompts, 1)
        at_least("eval", "samples", self.samples, 0)
        at_least("eval", "interval", self.interval, 1)


@dataclass
class CheckpointConfig:
    every: int = 10
    """steps between checkpoints (streaming: RL steps; consumer offsets are committed right
    after each)"""
    keep_last: int = 3
    """checkpoints retained"""
    keep_policies: int = 8
    """streaming: the newest policy versions kept in the object store (followers load the
    newest; older ones are deleted as new ones are published, so the store stays bounded)"""
    keep_policy_every: int = 100
    """streaming: every N-th policy version is kept for good besides the newest and version 0
    (`rlstream export --version`, the MLflow registry); 0 keeps none of them"""

    def __post_init__(self):
        at_least("checkpoint", "every", self.every, 1)
        at_least("checkpoint", "keep_last", self.keep_last, 1)
        at_least("checkpoint", "keep_policies", self.keep_policies, 1)
        at_least("checkpoint", "keep_policy_every", self.keep_policy_every, 0)


@dataclass
class LoopConfig:
    """The streaming loop's transport and processes (ignored in-process)."""

    rollout_workers: str = "2"
    """rollout worker processes: N, or auto:MIN-MAX (started at MIN, one added while the
    rollout requests' backlog stays above autoscale_lag messages a worker, one retired while it
    stays below; MAX at most the request topic's partitions)"""
    autoscale_lag: int = 8
    """auto workers: the request backlog (messages not yet committed by the rollout workers'
    group, as KEDA's Kafka scaler counts it) one worker is meant to carry"""
    autoscale_up_s: float = 10.0
    """auto workers: how long the backlog must call for more workers before one is added"""
    autoscale_down_s: float = 30.0
    """auto workers: how long it must call for fewer before one is retired (SIGTERM: it leaves
    its consumer group, whose requests go to the others in a rebalance)"""
    trainer_ranks: int = 1
    """data-parallel trainer processes (torch.distributed: gloo on CPU, NCCL on GPU): rank 0
    reads experience and shares each batch out by whole groups, gradients are averaged across
    the ranks, rank 0 alone publishes versions and checkpoints; a rank that dies restarts the
    group from the last checkpoint. With model.backend=deepspeed, ZeRO partitions the optimizer
    state across the ranks (rank 0 gathers every partition into its checkpoints)"""
    target_in_flight: int = 96
    """rollout requests in flight (issued, not yet trained on): the scheduler's pacing bound"""
    publish_every: int = 1
    """RL steps between policy versions published to the rollout workers"""
    weight_sync: str = "s3"
    """how policy versions reach the rollout workers: s3 (through the object store), or an
    absolute directory every process of the run sees (a shared volume): written there, loaded
    in place (the versions kept for good and the last still go to the store)"""
    fork_server: bool = True
    """fork the trainer ranks, the scheduler and the rollout workers from one process that has
    imported torch and transformers (Linux), so the libraries' pages are shared rather than
    held by each (docs/benchmarks.md: 0.8 GB less for the default run); false: each process
    starts and imports on its own"""
    session_timeout_ms: int = 6000
    """consumer-group session timeout"""
    max_restarts: int = 5
    """restarts of one process within restart_window_s before the supervisor gives up on it"""
    restart_window_s: float = 600.0
    """the window max_restarts counts in (a process that crashes rarely is always restarted)"""
    s3_retry_s: float = 120.0
    """how long the loop's processes retry an unavailable S3 server before failing"""
    durable_stack: bool = False
    """the embedded stack's broker keeps its log in the stack's S3 server, so a stopped run can
    be resumed (`--resume` finds its topics) and broker memory stays flat; false (the default):
    in memory, lost when the run ends. The durable log costs throughput on this broker: every
    record is two S3 writes, and every fetch lists the partition's whole log, so each fetch
    costs more as the run goes on (docs/benchmarks.md: 2.5x slower from the start on 2
    cores, falling)"""

    def __post_init__(self):
        self.rollout_workers = str(self.rollout_workers)
        self.worker_range  # noqa: B018  (checked here: a bad value is one line at load)
        if self.weight_sync != "s3" and not Path(self.weight_sync).is_absolute():
            raise ConfigError(
                f"loop.weight_sync: {self.weight_sync!r}; s3, or an absolute directory every "
                "process of the run sees, e.g. /shared/policies"
            )
        at_least("loop", "autoscale_lag", self.autoscale_lag, 1)
        at_least("loop", "autoscale_up_s", self.autoscale_up_s, 0)
        at_least("loop", "autoscale_down_s", self.autoscale_down_s, 0)
        at_least("loop", "trainer_ranks", self.trainer_ranks, 1)
        at_least("loop", "target_in_flight", self.target_in_flight, 1)
        at_least("loop", "publish_every", self.publish_every, 1)
        at_least("loop", "max_restarts", self.max_restarts, 0)
        at_least("loop", "restart_window_s", self.restart_window_s, 1)
        at_least("loop", "s3_retry_s", self.s3_retry_s, 0)

    @property
    def worker_range(self) -> tuple[int, int]:
        """(MIN, MAX) rollout workers: (N, N) for a fixed N."""
        return worker_range(self.rollout_workers)

    @property
    def autoscaled(self) -> bool:
        return self.worker_range[0] != self.worker_range[1]


def worker_range(spec: str) -> tuple[int, int]:
    """`N` or `auto:MIN-MAX` as (MIN, MAX); ConfigError naming the field and the fix."""
    from rlstream.schemas import get

    most = get("rollout_requests").partitions  # a worker beyond them would get no partition
    text = str(spec).strip()
    low = high = None
    if text.isdigit():
        low = high = int(text)
    elif text.startswith("auto:") and text[5:].replace("-", "", 1).isdigit() and "-" in text:
        low, high = (int(v) for v in text[5:].split("-"))
    if low is None or not 1 <= low <= high or (high > most and low != high):
        raise ConfigError(
            f"loop.rollout_workers: {spec!r}; a number of workers (1 or more), or auto:MIN-MAX "
            f"with 1 <= MIN <= MAX <= {most} (the rollout request topic's partitions), "
            "e.g. auto:1-4"
        )
    return low, high


@dataclass
class EnvConfig:
    """How episodes run, for prompts that name an environment (`rlstream.trainers.environments`)."""

    max_turns: int = 4
    """policy turns per episode at most"""
    step_timeout_s: float = 10.0
    """longest one reset or step of an environment may take; over it the episode fails"""
    turn_tokens: int = 0
    """new tokens per policy turn at most (0: rl.max_new_tokens); an episode's whole budget is
    the model's context"""
    options: str = ""
    """a JSON object every environment of the run is made with, e.g. {"tool": false}"""
    max_failed_groups: int = 32
    """the run stops (exit 1, the reason in its report) after this many groups in a row had an
    episode whose environment failed: a broken environment ends the run instead of feeding it
    nothing forever (0: never stops)"""
    servers: str = ""
    """a JSON object naming OpenEnv servers that play environments in the workers' stead, e.g.
    {"world": "http://10.0.0.5:8000"}: prompts that name `world` play their episodes there
    (`rlstream env serve world` on that machine), with no change to the dataset"""

    def __post_init__(self):
        at_least("env", "max_turns", self.max_turns, 1)
        at_least("env", "max_failed_groups", self.max_failed_groups, 0)
        at_least("env", "step_timeout_s", self.step_timeout_s, 0.001)
        at_least("env", "turn_tokens", self.turn_tokens, 0)
        try:
            ok = isinstance(json.loads(self.options or "{}"), dict)
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"env.options: {self.options!r} is not a JSON object; "
                              'write e.g. {"tool": false}')  # fmt: skip
        try:
            servers = json.loads(self.servers or "{}")
        except ValueError:
            servers = None
        schemes = ("http://", "https://", "ws://", "wss://")
        if not isinstance(servers, dict) or not all(
            isinstance(a, str) and a.startswith(schemes) for a in servers.values()
        ):
            raise ConfigError(f"env.servers: {self.servers!r} is not a JSON object of "
                              'environment names to server addresses; write e.g. '
                              '{"world": "http://10.0.0.5:8000"}')  # fmt: skip

    def option(self, name: str, default=None):
        return json.loads(self.options or "{}").get(name, default)

    def server_of(self, name: str) -> str:
        """The OpenEnv server that plays environment `name` (env.servers), else `name`."""
        return json.loads(self.servers or "{}").get(name, name)


@dataclass
class SandboxConfig:
    """Where code runs: the `code` verifier's tests and the `python` environment's tool calls
    (`rlstream.sandbox`). Every execution gets these limits."""

    workers: int = 2
    """sandbox servers per process: executions at once"""
    wall_s: float = 2.0
    """wall-clock limit of one execution"""
    cpu_s: float = 1.0
    """CPU-time limit of one execution"""
    memory_mb: int = 512
    """address-space limit of one execution"""
    output_kb: int = 64
    """the most one execution may write (stdout, stderr, any file)"""
    processes: int = 16
    """processes one execution may have at once (namespaces isolation)"""
    isolation: str = "auto"
    """namespaces (root: own PID, network and mount namespaces, an unprivileged uid), rlimits
    (limits, scrubbed environment and own directory only), or auto (namespaces where possible)"""

    def __post_init__(self):
        at_least("sandbox", "workers", self.workers, 1)
        at_least("sandbox", "wall_s", self.wall_s, 0.01)
        at_least("sandbox", "cpu_s", self.cpu_s, 0.01)
        at_least("sandbox", "memory_mb", self.memory_mb, 64)
        at_least("sandbox", "output_kb", self.output_kb, 1)
        at_least("sandbox", "processes", self.processes, 1)
        if self.isolation not in ("auto", "namespaces", "rlimits"):
            raise ConfigError(f"sandbox.isolation: {self.isolation!r} is not one of auto, "
                              "namespaces, rlimits")  # fmt: skip


@dataclass
class TrackingConfig:
    """Experiment tracking (optional)."""

    mlflow_uri: str | None = None
    """an MLflow tracking server (http://host:port) or store; unset: $MLFLOW_TRACKING_URI when
    set, else no tracking"""
    experiment: str = "rlstream"
    """the MLflow experiment runs are logged under"""
    model_name: str = "rlstream-policy"
    """the registered model every published policy version becomes a version of"""


@dataclass
class Config:
    run_id: str = "run"
    """names the run's rows on every topic, its consumer groups and object-store prefixes"""
    seed: int = 0
    """seed of splits, corpus, init and sampling"""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def ppm_feature_spec(self) -> str:
        """selection.ppm_features, `auto` resolved by the data's answer format."""
        spec = self.selection.ppm_features
        return AUTO_FEATURES[self.data.format] if spec == "auto" else spec

    def group(self, role: str) -> str:
        """The consumer group (faust app id) of a role in this run."""
        return f"rlstream-{self.run_id}-{role}"

    def threads(self, streaming: bool) -> int:
        return self.model.threads or (1 if streaming else 2)

    def write(self, path: Path) -> Path:
        """The effective config as JSON (what every process of a run reads)."""
        path.write_text(json.dumps(to_dict(self), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, path: Path) -> Config:
        return load_config(path)


# --- reading, overriding, showing ------------------------------------------------------------


def load_config(
    path: str | Path | None = None,
    overrides: list[str] = (),
    options: dict | None = None,
    cls=Config,
    base=None,
):
    """Defaults (or `base`, e.g. a benchmark's preset) < the YAML/JSON file < `options`
    (dotted name -> value, e.g. a command's own flags; None = not given) < `--set` overrides."""
    data = merge(to_dict(base) if base is not None else {}, read_file(path) if path else {})
    data = merge(data, nested(options or {}))
    data = merge(data, parse_overrides(list(overrides), cls))
    if cls is Config and base is None:
        data = format_defaults(data)
    return from_dict(cls, data)


FORMAT_DEFAULTS = {"cot": {"model": {"block_size": 96}, "rl": {"max_new_tokens": 64}}}
"""Settings whose default follows data.format: a worked solution (the longest built-in one,
countdown's, is 50 characters, the prompt up to 13) does not fit the 32-token context and
8-token completions of bare answers."""


def format_defaults(data: dict) -> dict:
    """`data` (a config as nested dicts) with FORMAT_DEFAULTS for its data.format filled in
    where no layer (file, flag, --set) gave the setting."""
    section = data.get("data", {})  # anything but a mapping: from_dict says what is wrong
    fmt = section.get("format", DataConfig.format) if isinstance(section, dict) else None
    return merge(FORMAT_DEFAULTS.get(fmt, {}), data)
