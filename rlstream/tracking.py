"""MLflow tracking of a run (optional: `tracking.mlflow_uri`, `--mlflow URI`, or
$MLFLOW_TRACKING_URI).

One rlstream run is one MLflow run (named by the run id; a resumed run continues it, its MLflow
id is kept in `<run>/mlflow.json`): the effective config as params, every evaluation and
training figure as a metric at its step while the run goes, the summary's figures, the report,
plots, config and summary as artifacts, and each published policy version as a version of the
registered model `tracking.model_name`, whose source is the version's Hugging Face directory
in the object store (tagged with run, step and phase) — so the registry shows which step
produced which weights.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from rlstream.config import Config, to_dict

log = logging.getLogger(__name__)
MLFLOW_FILE = "mlflow.json"


def tracking_uri(cfg: Config) -> str | None:
    return cfg.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or None


def flat_params(data: dict, prefix: str = "") -> dict[str, str]:
    """Nested settings as dotted MLflow params.

    >>> flat_params({"rl": {"steps": 4, "lr": None}, "seed": 0})
    {'rl.steps': '4', 'rl.lr': 'None', 'seed': '0'}
    """
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out |= flat_params(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


class MlflowRun:
    """The MLflow side of one run; every call is a no-op when tracking is off."""

    def __init__(self, cfg: Config, out: Path | None):
        self.cfg, self.out = cfg, out
        self.uri = tracking_uri(cfg)
        self.run_id: str | None = None
        self.logged = 0  # eval rows already sent (a resumed run sends its history again)
        if self.uri is None:
            return
        import mlflow

        mlflow.set_tracking_uri(self.uri)
        self.client = mlflow.MlflowClient()
        saved = out / MLFLOW_FILE if out is not None else None
        if saved is not None and saved.exists():  # a resumed run continues its MLflow run
            self.run_id = json.loads(saved.read_text())["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        experiment = self.client.get_experiment_by_name(cfg.tracking.experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(cfg.tracking.experiment)
        )
        run = self.client.create_run(experiment_id, run_name=cfg.run_id,
                                     tags={"rlstream.run_id": cfg.run_id})  # fmt: skip
        self.run_id = run.info.run_id
        params = flat_params(to_dict(cfg))
        from mlflow.entities import Param

        items = [Param(k, v[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # the server takes at most 100 params a call
            self.client.log_batch(self.run_id, params=items[i : i + 100])
        self._save()
        log.info("tracking in MLflow at %s (run %s)", self.uri, self.run_id)

    def log_evals(self, rows: list[dict]) -> None:
        """Eval and training figures (eval_results rows) not sent yet, as metrics at their step."""
        if self.run_id is None or len(rows) <= self.logged:
            return
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(f"{r['task']}/{r['metric']}", float(r["value"]), now, int(r["step"]))
            for r in rows[self.logged :]
            if r.get("value") is not None
        ]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        self.logged = len(rows)

    def finish(self, summary: dict, artifacts: list[Path], versions: list[dict]) -> None:
        """The summary's figures, the artifacts, one model version per policy version, and the
        run's end state (FINISHED, or FAILED when the trainer did not complete)."""
        if self.run_id is None:
            return
        from mlflow.entities import Metric

        figures = [
            Metric(f"summary/{k}", float(v), 0, 0)
            for k, v in summary.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        ]
        self.client.log_batch(self.run_id, metrics=figures)
        for path in artifacts:
            if path.exists():
                self.client.log_artifact(self.run_id, str(path))
        self.client.log_dict(self.run_id, summary, "summary.json")
        self.register(versions)
        status = "FINISHED" if summary.get("completed") else "FAILED"
        self.client.set_terminated(self.run_id, status=status)

    def stopped(self) -> None:
        """Ctrl-C: the MLflow run is KILLED until `--resume` continues it."""
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status="KILLED")

    def register(self, versions: list[dict]) -> None:
        """policy_versions rows -> versions of the registered model (new ones only)."""
        from mlflow.exceptions import MlflowException

        name = self.cfg.tracking.model_name
        first = {}
        for row in versions:  # the trainer re-announces a version (its demand refresh)
            first.setdefault(row["version"], row)
        with contextlib.suppress(MlflowException):  # it exists: runs share it, tagged by run
            self.client.create_registered_model(name)
        query = f"name='{name}' and tags.`rlstream.run_id`='{self.cfg.run_id}'"
        known = {mv.tags.get("rlstream.policy_version")
                 for mv in self.client.search_model_versions(query)}  # fmt: skip
        for row in sorted(first.values(), key=lambda r: r["version"]):
            if str(row["version"]) in known or row["phase"] == "done":
                continue
            tags = {"rlstream.run_id": self.cfg.run_id, "rlstream.policy_version": row["version"],
                    "rlstream.step": row["step"], "rlstream.phase": row["phase"]}  # fmt: skip
            self.client.create_model_version(
                name, source=row["checkpoint_uri"], run_id=self.run_id,
                tags={k: str(v) for k, v in tags.items()},
            )  # fmt: skip

    def _save(self) -> None:
        if self.out is None:
            return
        payload = {"run_id": self.run_id}  # not the URI: it may hold a login
        (self.out / MLFLOW_FILE).write_text(json.dumps(payload))


def safely(tracker: MlflowRun | None, method: str, *args) -> None:
    """Call a tracker method; a tracking server that fails turns tracking off for the run with
    a warning, never stops training."""
    if tracker is None or tracker.run_id is None:
        return
    try:
        getattr(tracker, method)(*args)
    except Exception as exc:  # any failure of the user's tracking server or its client
        log.warning("MLflow tracking off for this run: %s failed (%s)", method, exc)
        tracker.run_id = None


def history_rows(history: list[dict]) -> list[dict]:
    """The in-process loop's history as eval_results-like rows (task = phase), RL figures at
    their RL step.

    >>> history_rows([{"phase": "rl", "step": 60, "rl_step": 2, "reward": 0.5, "tag": "x"}])
    [{'task': 'rl', 'metric': 'reward', 'value': 0.5, 'step': 2}]
    """
    rows = []
    for row in history:
        step = row.get("rl_step", row["step"]) if row.get("phase") == "rl" else row["step"]
        for key, value in row.items():
            if key in ("step", "rl_step", "phase") or isinstance(value, bool):
                continue
            if isinstance(value, int | float):
                rows.append({"task": row.get("phase", "run"), "metric": key, "value": value,
                             "step": step})  # fmt: skip
    return rows


def track_local(cfg: Config, out: Path | None, history: list[dict], summary: dict) -> None:
    """The in-process loop's run in MLflow (at its end): params, its history as metrics, the
    summary, and the curves and config when written. It publishes no policy versions."""
    tracker = open_tracker(cfg, out)
    artifacts = [out / "curves.png", out / "config.yaml"] if out is not None else []
    safely(tracker, "log_evals", history_rows(history))
    safely(tracker, "finish", summary | {"completed": True}, artifacts, [])


def open_tracker(cfg: Config, out: Path | None) -> MlflowRun | None:
    """The run's MLflow tracker, or None when tracking is off or the server cannot be reached
    (a warning says so; the run goes on)."""
    if tracking_uri(cfg) is None:
        return None
    try:
        return MlflowRun(cfg, out)
    except Exception as exc:  # as in `safely`: tracking must not stop a run
        log.warning("MLflow tracking off for this run: %s", exc)
        return None
