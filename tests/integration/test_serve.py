"""`rlstream serve` over real HTTP (httpx against the running server, which runs its submitted
runs as child processes on the session's stack): auth, validation, a run followed to the end
through server-sent events, its artifacts, a clean stop and a resume, and publishing prompts.
The submitted runs are tracked in a real `mlflow server` started here on loopback. The web view
is driven in a real headless browser (Debian's chromium through playwright)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration
TOKEN = "serve-it-token"
SMALL = {
    "rl": {"steps": 4, "prompts_per_step": 8, "group_size": 4},
    "pretrain": {"max_steps": 40, "batch": 32, "warmup_steps": 20},
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


def _browser(playwright):
    chromium = shutil.which("chromium")
    assert chromium, "the web view test needs Debian's chromium: scripts/test.sh installs it"
    return playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])


def test_the_web_view_shows_a_live_run_its_report_and_its_rollouts(server, submitted):
    """Sign in through the form, watch a run's figures change in the DOM while it runs, then its
    final figures equal the API's, its curves have points, its report shows; the runs page lists
    it; the review page's filters select what the JSON API selects. Screenshots go to
    $RLSTREAM_TEST_ARTIFACTS (default: test-artifacts/)."""
    from playwright.sync_api import sync_playwright

    client, _ = server
    artifacts = Path(os.environ.get("RLSTREAM_TEST_ARTIFACTS", "test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    base = str(client.base_url).rstrip("/")
    with sync_playwright() as playwright:
        browser = _browser(playwright)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{base}/ui/runs/api-it")
        assert "/login" in page.url  # no cookie yet
        page.fill("#token", "not-the-token")
        page.click("#sign-in")
        assert page.inner_text("#login-error") == "wrong token"
        page.fill("#token", TOKEN)
        page.click("#sign-in")
        assert page.url == f"{base}/ui/runs/api-it"
        seen, deadline = [], time.monotonic() + 300
        while page.get_attribute("body", "data-ended") != "true":
            assert time.monotonic() < deadline, f"the page never saw the run end: {seen[-3:]}"
            seen.append((page.inner_text("#state"), page.inner_text("#phase"),
                         page.inner_text("#rl-step")))  # fmt: skip
            time.sleep(0.25)
        live = [(phase, step) for state, phase, step in seen if state == "running"]
        assert {"pretrain", "rl"} & {phase for phase, _ in live}, seen
        steps = [int(step) for _, step in live if step]
        assert len(set(steps)) >= 2 and steps == sorted(steps), seen  # it moved, forward
        status = client.get("/runs/api-it").json()
        assert page.inner_text("#state") == "finished" == status["state"]
        assert page.inner_text("#rl-step") == str(status["rl_step"]) == "4"
        assert page.inner_text("#accuracy") == f"{100 * status['accuracy']:.1f}%"
        assert page.inner_text("#idle-share") == f"{status['idle_share']:.3f}"
        for chart in ("accuracy", "reward", "rl-loss", "lag", "rate", "interactions", "cpu",
                      "memory"):  # fmt: skip
            assert int(page.get_attribute(f"#chart-{chart}", "data-points")) >= 2, chart
            assert page.locator(f"#chart-{chart} canvas").count() == 1, chart
        for chart in ("interactions", "cpu", "memory"):  # one series per task / process
            series = page.locator(f"#chart-{chart} .u-legend .u-series").count() - 1
            assert series >= (2 if chart == "interactions" else 5), (chart, series)
        assert "rlstream run api-it" in page.inner_text("#report")
        assert page.locator("#report img[src='/runs/api-it/curves.png']").count() == 1
        page.screenshot(path=artifacts / "web-run.png", full_page=True)

        page.goto(f"{base}/")
        row = page.locator("#runs tr[data-run='api-it']")
        assert row.locator("td.state").inner_text() == "finished"
        page.goto(f"{base}/ui/runs/api-it/rollouts")
        total = int(page.inner_text("#total"))
        summary = client.get("/runs/api-it/summary").json()
        assert total >= summary["experience_published"] > 0
        task = page.locator("#filters select[name=task] option").nth(1).get_attribute("value")
        page.select_option("#filters select[name=task]", task)
        page.fill("#filters input[name=max_reward]", "0.5")
        page.click("#filters button")
        # a GET form: read the rows of the filtered page, not of the one it is leaving
        page.wait_for_url(re.compile(r"[?&]max_reward=0\.5"))
        cells = page.locator("#rollouts tbody td.task").all_inner_texts()
        rewards = [float(r) for r in page.locator("#rollouts tbody td.reward").all_inner_texts()]
        assert cells and set(cells) == {task} and max(rewards) <= 0.5
        matched = int(page.inner_text("#matched"))
        assert matched == len(cells) or len(cells) == 100 < matched

        def api(**params) -> dict:
            return client.get("/runs/api-it/rollouts", params={"task": task, **params}).json()

        assert api(max_reward=0.5)["matched"] == matched
        low, high, every = api(max_reward=0.5), api(min_reward=0.51), api()
        assert low["matched"] + high["matched"] == every["matched"] > 0  # rewards are 0 or 1
        assert all(r["task"] == task and r["reward"] >= 0.51 for r in high["rows"])
        page.screenshot(path=artifacts / "web-rollouts.png", full_page=True)
        assert not errors, errors  # no script error on any page
        browser.close()
    assert client.get("/ui/runs/api-it/rollouts", params={"min_step": "x"}).status_code == 422


@pytest.fixture(scope="module")
def submitted(server, mlflow_url) -> str:
    """One run submitted over HTTP and tracked in MLflow; the web view test watches it live,
    the API tests read its results."""
    client, _ = server
    body = {"run_id": "api-it", **SMALL, "tracking": {"mlflow_uri": mlflow_url}}
    response = client.post("/runs", json=body)
    assert response.status_code == 201, response.text
    assert response.json()["state"] in ("submitted", "running")
    return "api-it"


def test_a_submitted_run_is_followed_to_its_end_and_its_results_fetched(server, submitted):
    client, _ = server
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


def test_a_runs_policy_downloads_from_the_api_and_exports_from_the_servers_directory(
    server, submitted, tmp_path
):
    """The newest policy version as a zip that plain transformers loads, and `rlstream export
    --runs` pointed at the server's run directory finds the same run."""
    import zipfile

    from transformers import AutoModelForCausalLM

    client, out = server
    _events(client, "api-it")  # to its end
    response = client.get("/runs/api-it/policy")
    assert response.status_code == 200 and response.headers["content-type"] == "application/zip"
    (tmp_path / "policy.zip").write_bytes(response.content)
    with zipfile.ZipFile(tmp_path / "policy.zip") as archive:
        archive.extractall(tmp_path / "unzipped")
    (directory,) = (tmp_path / "unzipped").iterdir()
    assert AutoModelForCausalLM.from_pretrained(directory).config.model_type == "gpt2"
    newest = json.loads((directory / "rlstream.json").read_text())["version"]
    assert client.get("/runs/api-it/policy", params={"version": 10**6}).status_code == 404
    page = client.get("/ui/runs/api-it").text
    assert 'href="/runs/api-it/policy"' in page
    exported = tmp_path / "exported"
    result = subprocess.run([sys.executable, "-m", "rlstream.cli", "export", "api-it", "--out",
                             str(exported), "--runs", str(out)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads((exported / "rlstream.json").read_text())["version"] == newest


def test_export_finds_a_live_servers_own_stack(tmp_path):
    """A server with no running stack starts its own (OUT/_stack) and says where it is, so
    `rlstream export --runs OUT` reads that stack instead of starting a second one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSTREAM_")}
    env |= {"RLSTREAM_HOME": str(tmp_path / "home"), "RLSTREAM_API_TOKEN": TOKEN}
    out, port = tmp_path / "served", _free_port()
    cmd = [sys.executable, "-m", "rlstream.cli", "serve", "--port", str(port), "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    try:
        _wait_until_up(proc, f"http://127.0.0.1:{port}/openapi.json", 90)
        assert (out / "_serve" / "endpoints.json").is_file()
        args = ["export", "nothing-yet", "--out", str(tmp_path / "x"), "--runs", str(out)]
        result = subprocess.run([sys.executable, "-m", "rlstream.cli", *args], env=env,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert result.returncode == 2 and "no policy versions" in result.stderr, result.stderr
        assert not (out / "nothing-yet").exists()  # no second stack started for the copy
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert not (out / "_serve").exists()


def test_delete_stops_a_run_cleanly_and_resume_continues_it(server, mlflow_url):
    client, out = server
    body = {"run_id": "api-stop", **SMALL, "rl": {**SMALL["rl"], "steps": 8},
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
    assert summary["completed"] and summary["rl_steps"] == 8
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


def test_the_runs_are_tracked_in_mlflow_with_a_model_version_per_policy_version(
    server, mlflow_url, tmp_path
):
    """Params, per-step metrics, artifacts, and one registered model version per published
    policy version whose source (a Hugging Face directory in the object store) loads with plain
    transformers; the stopped-and-resumed run is one MLflow run."""
    import asyncio

    from transformers import AutoModelForCausalLM

    from rlstream.connectors.endpoints import Endpoints
    from rlstream.connectors.objectstore import ObjectStore
    from rlstream.ops.launcher.figures import _run_rows
    from rlstream.streams.policystore import download_policy

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
    exported = download_policy(ObjectStore(endpoints), last.source, tmp_path / "version")
    model = AutoModelForCausalLM.from_pretrained(exported)  # plain transformers
    assert model.config.model_type == "gpt2"  # preset:tiny
    assert json.loads((exported / "rlstream.json").read_text())["version"] == int(
        last.tags["rlstream.policy_version"]
    )
    _, resumed = _mlflow_run(mlflow_url, "api-stop")
    assert len(resumed) == 1 and resumed[0].info.status == "FINISHED"
