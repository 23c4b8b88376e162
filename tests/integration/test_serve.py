"""`rlstream serve` over real HTTP (httpx against the running server, which runs its submitted
runs as child processes on the session's stack): auth, validation, a run followed to the end
through server-sent events, its artifacts, a clean stop and a resume, and publishing prompts.
The submitted runs are tracked in a real `mlflow server` started here on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

pytestmark = pytest.mark.integration
TOKEN = "serve-it-token"
SMALL = {
    "rl": {"steps": 4, "prompts_per_step": 8, "group_size": 4},
    "pretrain": {"max_steps": 40},
    "data": {"corpus_docs": 2000, "pool_size": 400},
    "eval": {"prompts": 32, "interval": 2},
    "loop": {"target_in_flight": 16},
    "checkpoint": {"every": 2},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(proc: subprocess.Popen, url: str, timeout_s: float) -> None:
    """Until `url` answers 200; a server that exits or never answers fails the fixture."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    output = proc.communicate()[0] if proc.stdout else ""
    raise AssertionError(f"{url} did not come up:\n{output}")


@pytest.fixture(scope="module")
def mlflow_url(tmp_path_factory):
    """A real MLflow tracking server (SQLite store, local artifacts) on a free loopback port."""
    home = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{home}/mlflow.db",
           "--artifacts-destination", str(home / "artifacts")]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=home)
    url = f"http://127.0.0.1:{port}"
    _wait_until_up(proc, f"{url}/health", 120)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(stack_home, tmp_path_factory):
    out = tmp_path_factory.mktemp("served")
    port = _free_port()
    env = os.environ | {"RLSTREAM_API_TOKEN": TOKEN}
    cmd = [sys.executable, "-m", "rlstream.cli", "serve", "--port", str(port), "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    _wait_until_up(proc, f"{url}/openapi.json", 60)
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    yield client, out
    client.close()
    proc.terminate()
    proc.wait(timeout=30)


def _events(client: httpx.Client, run_id: str) -> list[tuple[str, dict]]:
    """Every server-sent event of the run, to its `end`."""
    events, kind = [], "message"
    with client.stream("GET", f"/runs/{run_id}/events", timeout=600) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((kind, json.loads(line.removeprefix("data: "))))
                kind = "message"
    return events


def test_without_the_token_every_route_is_refused_but_the_docs(server):
    client, _ = server
    bare = httpx.Client(base_url=str(client.base_url), timeout=10)
    assert bare.get("/runs").status_code == 401
    assert bare.post("/runs", json={}).status_code == 401
    wrong = bare.get("/runs", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "bearer token" in wrong.json()["detail"]
    assert bare.get("/docs").status_code == 200
    assert "/runs/{run_id}/events" in bare.get("/openapi.json").json()["paths"]


def test_a_bad_config_is_a_422_naming_the_field(server):
    client, _ = server
    response = client.post("/runs", json={"rl": {"stpes": 3}})
    assert response.status_code == 422 and "rl.stpes" in response.json()["detail"]
    response = client.post("/runs", json={"rl": {"algo": "dpo"}})
    assert response.status_code == 422 and "rl.algo" in response.json()["detail"]
    assert client.get("/runs/no-such-run").status_code == 404


def test_a_submitted_run_is_followed_to_its_end_and_its_results_fetched(server, mlflow_url):
    client, _ = server
    body = {"run_id": "api-it", **SMALL, "tracking": {"mlflow_uri": mlflow_url}}
    response = client.post("/runs", json=body)
    assert response.status_code == 201, response.text
    assert response.json()["state"] in ("submitted", "running")
    events = _events(client, "api-it")
    live = [data for kind, data in events if kind == "message"]
    assert live and events[-1][0] == "end" and events[-1][1]["state"] == "finished"
    assert {"phase", "rl_step", "accuracy", "policy_lag", "processes"} <= set(live[-1])
    assert any(d["phase"] == "rl" for d in live) or live[-1]["rl_step"] == 4
    status = client.get("/runs/api-it").json()
    assert status["state"] == "finished" and status["rl_step"] == 4
    assert status["idle_share"] is not None
    summary = client.get("/runs/api-it/summary").json()
    assert summary["completed"] and summary["rl_steps"] == 4
    assert "# rlstream run api-it" in client.get("/runs/api-it/report").text
    png = client.get("/runs/api-it/curves.png")
    assert png.headers["content-type"] == "image/png" and png.content[:4] == b"\x89PNG"
    assert "api-it" in {r["run_id"] for r in client.get("/runs").json()}
    assert client.post("/runs", json={"run_id": "api-it"}).status_code == 409


def test_delete_stops_a_run_cleanly_and_resume_continues_it(server, mlflow_url):
    client, out = server
    body = {"run_id": "api-stop", **SMALL, "rl": {**SMALL["rl"], "steps": 12},
            "tracking": {"mlflow_uri": mlflow_url}}  # fmt: skip
    assert client.post("/runs", json=body).status_code == 201
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = client.get("/runs/api-stop").json()
        if status.get("phase") == "rl" and status.get("rl_step", 0) >= 2:
            break
        time.sleep(0.5)
    stopped = client.delete("/runs/api-stop").json()
    assert stopped["state"] == "stopped", stopped
    assert "--resume api-stop" in (out / "api-stop" / "serve.log").read_text()
    resumed = client.post("/runs/api-stop/resume")
    assert resumed.status_code == 200 and resumed.json()["starts"] == 2
    events = _events(client, "api-stop")
    assert events[-1][1]["state"] == "finished"
    summary = client.get("/runs/api-stop/summary").json()
    assert summary["completed"] and summary["rl_steps"] == 12
    assert summary["duplicates_trained"] == 0
    assert client.post("/runs/api-stop/resume").status_code == 409  # finished


def test_prompts_posted_to_a_dataset_are_validated_and_published(server):
    client, _ = server
    rows = [{"text": f"{a}+{a}=", "task": "numeric", "answer": str(2 * a)} for a in range(5)]
    rows += [{"text": "2+2=", "task": "algebra", "answer": "4"}, "not a row"]
    report = client.post("/datasets/posted/prompts", json=rows).json()
    assert report["rows_published"] == 5 and report["bad_rows"] == 2
    reasons = dict(report["bad"])
    assert "names no verifier" in reasons["row 5"] and "expected an object" in reasons["row 6"]


def _mlflow_run(url: str, name: str):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=url)
    experiment = client.get_experiment_by_name("rlstream")
    runs = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
    return client, runs


def test_the_runs_are_tracked_in_mlflow_with_a_model_version_per_policy_version(server, mlflow_url):
    """Params, per-step metrics, artifacts, and one registered model version per published
    policy version whose source (the checkpoint in the object store) loads as the policy; the
    stopped-and-resumed run is one MLflow run."""
    import asyncio

    from rlstream.connectors.endpoints import Endpoints
    from rlstream.connectors.objectstore import ObjectStore
    from rlstream.ops.loop import _run_rows
    from rlstream.trainers.policy import policy_from_bytes

    client, runs = _mlflow_run(mlflow_url, "api-it")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run = runs[0]
    assert run.data.params["rl.steps"] == "4" and run.data.params["data.dataset"]
    greedy = client.get_metric_history(run.info.run_id, "all/greedy")
    assert len({m.step for m in greedy}) >= 2
    assert run.data.metrics["summary/rl_steps"] == 4
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"report.md", "curves.png", "config.yaml", "summary.json"} <= artifacts
    endpoints = Endpoints.from_env()
    announced = asyncio.run(_run_rows(endpoints, "policy_versions", "api-it"))
    published = {r["version"] for r in announced if r["phase"] != "done"}
    versions = client.search_model_versions(
        "name='rlstream-policy' and tags.`rlstream.run_id`='api-it'"
    )
    assert {int(v.tags["rlstream.policy_version"]) for v in versions} == published
    last = max(versions, key=lambda v: int(v.tags["rlstream.policy_version"]))
    assert last.run_id == run.info.run_id and last.tags["rlstream.phase"] == "rl"
    name = last.source.split("/", 3)[3]  # s3://bucket/<name>
    policy = policy_from_bytes(ObjectStore(endpoints).get_bytes(name))
    assert policy.version == int(last.tags["rlstream.policy_version"])
    _, resumed = _mlflow_run(mlflow_url, "api-stop")
    assert len(resumed) == 1 and resumed[0].info.status == "FINISHED"
