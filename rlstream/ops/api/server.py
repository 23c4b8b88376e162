"""`rlstream serve`: run control over HTTP (FastAPI on uvicorn).

    POST   /runs                      submit a run: its config as JSON (the shape `--config`
                                      reads), validated like `rlstream run` (422 names the field)
    GET    /runs, /runs/{id}          state (submitted / running / stopped / finished / failed)
                                      and the live figures (phase, steps, accuracy, reward, lag,
                                      processes), read from the run's live.json
    DELETE /runs/{id}                 a clean stop (SIGINT: every process stops; resumable)
    POST   /runs/{id}/resume          continue it from its checkpoints
    GET    /runs/{id}/summary|report|curves.png
    GET    /runs/{id}/events          server-sent events: the live figures as they change, then
                                      `event: end` with the summary
    POST   /datasets/{name}/prompts   JSON rows, validated and published like `rlstream publish`
    GET    /, /ui/runs/{id}[/rollouts] the web view (`webview.py`), and /runs/{id}/rollouts

Every route but /docs, /openapi.json, /login and /static needs `Authorization: Bearer
$RLSTREAM_API_TOKEN`; GET requests may carry it as the web view's sign-in cookie instead.
Each run is a supervised child process (`rlstream run` in its own session, so a stop reaches all
of its processes) writing under the server's run directory; a restarted server finds every run
there, still going or done, because all it knows is on disk (serve.json, live.json,
summary.json). Runs use the server's stack (a running one, or one it starts for its lifetime).
"""

import asyncio
import json
import shutil
import tempfile
from pathlib import Path

from rlstream.config import ConfigError
from rlstream.ops.api.auth import authorized_dependency
from rlstream.ops.api.runs import RunConflict, RunNotFound, Runs, read_json
from rlstream.ops.launcher.live import LIVE_FILE


def make_app(runs: Runs, token: str | None, endpoints=None):
    """The FastAPI app over `runs`; token None: no auth (loopback only, checked by the CLI)."""
    from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
    from fastapi.responses import FileResponse, PlainTextResponse, StreamingResponse
    from starlette.background import BackgroundTask

    from rlstream.ops.api.webview import add_web_routes

    app = FastAPI(title="rlstream", description=__doc__)
    add_web_routes(app, runs, token, endpoints)
    api = APIRouter(dependencies=[Depends(authorized_dependency(token))])

    def found(fn, *args):
        try:
            return fn(*args)
        except RunNotFound:
            raise HTTPException(404, f"no run {args[0]!r}") from None
        except RunConflict as exc:
            raise HTTPException(409, str(exc)) from None

    @api.post("/runs", status_code=201)
    async def submit(request: Request) -> dict:
        try:
            body = await request.json()
        except ValueError:
            raise HTTPException(422, "the body is not JSON") from None
        try:
            return await asyncio.to_thread(runs.submit, body)
        except ConfigError as exc:
            raise HTTPException(422, str(exc)) from None
        except RunConflict as exc:
            raise HTTPException(409, str(exc)) from None

    @api.get("/runs")
    def list_runs() -> list[dict]:
        return runs.all()

    @api.get("/runs/{run_id}")
    def run_status(run_id: str) -> dict:
        return found(runs.status, run_id)

    @api.delete("/runs/{run_id}")
    async def stop(run_id: str) -> dict:
        return await asyncio.to_thread(found, runs.stop, run_id)

    @api.post("/runs/{run_id}/resume")
    def resume(run_id: str) -> dict:
        return found(runs.resume, run_id)

    def artifact(run_id: str, name: str) -> Path:
        path = found(runs.path, run_id, name)
        if not path.exists():
            raise HTTPException(404, f"run {run_id!r} has no {name} yet")
        return path

    @api.get("/runs/{run_id}/summary")
    def summary(run_id: str) -> dict:
        return read_json(artifact(run_id, "summary.json")) or {}

    @api.get("/runs/{run_id}/report", response_class=PlainTextResponse)
    def report(run_id: str) -> str:
        return artifact(run_id, "report.md").read_text()

    @api.get("/runs/{run_id}/curves.png")
    def curves(run_id: str) -> FileResponse:
        return FileResponse(artifact(run_id, "curves.png"), media_type="image/png")

    @api.get("/runs/{run_id}/events")
    def events(run_id: str) -> StreamingResponse:
        found(runs.status, run_id)
        return StreamingResponse(live_events(runs, run_id), media_type="text/event-stream")

    @api.get("/runs/{run_id}/policy")
    async def policy(run_id: str, version: int | None = None) -> FileResponse:
        """A policy version (default: the newest) as a zip of its Hugging Face directory, which
        `AutoModelForCausalLM.from_pretrained` loads once unpacked."""
        found(runs.status, run_id)
        if endpoints is None:
            raise HTTPException(503, "this server has no stack to read policies from")
        try:
            archive = await asyncio.to_thread(policy_archive, endpoints, run_id, version)
        except LookupError as exc:
            raise HTTPException(404, str(exc)) from None
        return FileResponse(archive, media_type="application/zip", filename=archive.name,
                            background=BackgroundTask(shutil.rmtree, archive.parent))  # fmt: skip

    @api.post("/datasets/{name}/prompts")
    async def publish_prompts(name: str, request: Request) -> dict:
        from rlstream.ops.commands.publish import publish_rows, verifier_check
        from rlstream.schemas import get

        rows = await request.json()
        if not isinstance(rows, list):
            raise HTTPException(422, "the body must be a JSON list of prompt rows")
        if endpoints is None:
            raise HTTPException(503, "this server has no stack to publish to")
        prompts = get("prompts")
        report = await publish_rows(endpoints, rows, prompts, dataset=name,
                                    check=verifier_check(prompts), run_id="serve")  # fmt: skip
        return report.summary() | {"dataset": name, "bad": report.bad_rows}

    app.include_router(api)
    return app


def policy_archive(endpoints, run_id: str, version: int | None) -> Path:
    """The run's policy `version` (None: the newest) zipped in a fresh temporary directory; a
    LookupError says what the run has instead."""
    from rlstream.connectors.objectstore import ObjectStore
    from rlstream.streams.policystore import download_policy, stored_versions

    store = ObjectStore(endpoints)
    versions = stored_versions(store, run_id)
    if not versions:
        raise LookupError(f"run {run_id!r} has no policy versions in the object store yet")
    chosen = max(versions) if version is None else version
    if chosen not in versions:
        raise LookupError(f"run {run_id!r} has versions {', '.join(map(str, sorted(versions)))}")
    work = Path(tempfile.mkdtemp(prefix="rlstream-policy-"))
    name = f"{run_id}-policy-v{chosen:06d}"
    download_policy(store, versions[chosen], work / name)
    return Path(shutil.make_archive(str(work / name), "zip", work, name))


async def live_events(runs: Runs, run_id: str, poll_s: float = 0.5):
    """Server-sent events: the live figures whenever live.json changes; `event: end` with the
    summary once the run is no longer going."""
    live, seen = runs.path(run_id, LIVE_FILE), None
    while True:
        status = await asyncio.to_thread(runs.status, run_id)
        stamp = live.stat().st_mtime if live.exists() else None
        if stamp != seen and stamp is not None:
            seen = stamp
            yield f"data: {json.dumps(read_json(live) or {}, default=str)}\n\n"
        if status["state"] not in ("running", "submitted"):
            yield f"event: end\ndata: {json.dumps(status, default=str)}\n\n"
            return
        await asyncio.sleep(poll_s)
