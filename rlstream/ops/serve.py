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
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rlstream.config import Config, ConfigError, format_defaults, from_dict
from rlstream.ops.loop import LIVE_FILE

SERVE_FILE = "serve.json"  # per run: the child's pid and command, written by the server
COOKIE = "rlstream_token"  # the web view's copy of the token (GET requests only)


class RunNotFound(KeyError):
    pass


class RunConflict(ValueError):
    pass


@dataclass
class Runs:
    """The runs under `out`: submitted, started, stopped and resumed as child processes."""

    out: Path
    env: dict[str, str]

    def __post_init__(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self._children: dict[int, subprocess.Popen] = {}

    def submit(self, body: dict) -> dict:
        """Validate a config (ConfigError names the field) and start it as a run."""
        if not isinstance(body, dict):
            raise ConfigError("the body must be a JSON object: the run's config")
        body = dict(body)
        body.setdefault("run_id", datetime.now(UTC).strftime("run-%Y%m%d-%H%M%S-%f"))
        cfg = from_dict(Config, format_defaults(body))  # the shape --config reads
        if not cfg.run_id.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"run_id: {cfg.run_id!r} must be letters, digits, - and _")
        run_dir = self.out / cfg.run_id
        if run_dir.exists():
            raise RunConflict(f"run {cfg.run_id!r} exists; resume it or choose another run_id")
        run_dir.mkdir(parents=True)
        config = cfg.write(run_dir / "submitted.json")
        self._start(cfg.run_id, ["--config", str(config), "--run-id", cfg.run_id])
        return self.status(cfg.run_id)

    def resume(self, run_id: str) -> dict:
        state = self.status(run_id)["state"]
        if state in ("running", "finished"):
            raise RunConflict(f"run {run_id!r} is {state}; only a stopped or failed run resumes")
        self._start(run_id, ["--resume", run_id])
        return self.status(run_id)

    def stop(self, run_id: str) -> dict:
        """SIGINT to the run's process group: `rlstream run` stops every child, exits 130."""
        info = self._serve_info(run_id)
        if self._alive(info):
            os.killpg(info["pid"], signal.SIGINT)
            deadline = time.monotonic() + 20
            while self._alive(info) and time.monotonic() < deadline:
                time.sleep(0.2)
        return self.status(run_id)

    def all(self) -> list[dict]:
        dirs = sorted(p for p in self.out.iterdir() if (p / SERVE_FILE).exists())
        return [self.status(p.name) for p in dirs]

    def status(self, run_id: str) -> dict:
        info = self._serve_info(run_id)
        run_dir = self.out / run_id
        live = _read_json(run_dir / LIVE_FILE) or {}
        summary = _read_json(run_dir / "summary.json")
        if self._alive(info):
            state = "running" if live else "submitted"
        elif summary is not None:  # each start removes it: it is this start's
            state = "finished" if summary.get("completed") else "failed"
        else:  # Ctrl-C (130), or a server that no longer knows the exit code
            state = "stopped" if info.get("exit_code") in (130, None) else "failed"
        figures = {k: v for k, v in live.items() if k not in ("evals", "trace")}
        if summary is not None:
            figures["idle_share"] = summary.get("trainer_idle_share")
            figures["final_accuracy"] = summary.get("final_accuracy")
        return {"run_id": run_id, "state": state, "started_at": info.get("started_at"),
                "starts": info.get("starts", 1), **figures}  # fmt: skip

    def path(self, run_id: str, name: str) -> Path:
        self._serve_info(run_id)
        return self.out / run_id / name

    # --- the child processes ------------------------------------------------------------------
    def _start(self, run_id: str, args: list[str]) -> None:
        run_dir = self.out / run_id
        summary = run_dir / "summary.json"
        summary.unlink(missing_ok=True)
        command = [sys.executable, "-m", "rlstream.cli", "run", *args, "--out", str(self.out),
                   "--summary", str(summary)]  # fmt: skip
        log = open(run_dir / "serve.log", "ab")  # noqa: SIM115 (the child owns it from here)
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.env, start_new_session=True,
        )  # fmt: skip
        log.close()
        previous = _read_json(run_dir / SERVE_FILE) or {}
        info = {"pid": proc.pid, "command": command, "started_at": time.time(),
                "starts": previous.get("starts", 0) + 1}  # fmt: skip
        (run_dir / SERVE_FILE).write_text(json.dumps(info))
        self._children[proc.pid] = proc

    def _serve_info(self, run_id: str) -> dict:
        info = _read_json(self.out / run_id / SERVE_FILE)
        if info is None:
            raise RunNotFound(run_id)
        proc = self._children.get(info["pid"])
        if proc is not None and proc.poll() is not None and "exit_code" not in info:
            info["exit_code"] = proc.returncode  # reap it and remember how it ended
            (self.out / run_id / SERVE_FILE).write_text(json.dumps(info))
        return info

    def _alive(self, info: dict) -> bool:
        """The run's process is still going (for runs a previous server started: a live pid
        whose command line is that run's)."""
        import psutil

        if "exit_code" in info:
            return False
        proc = self._children.get(info["pid"])
        if proc is not None:
            return proc.poll() is None
        try:
            return psutil.Process(info["pid"]).cmdline() == info["command"]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def authorized_by(request, token: str | None) -> bool:
    """The request carries the token: as a bearer header, or for a GET as the web view's cookie
    (a cookie alone never changes a run, so another site cannot forge a change)."""
    if token is None:
        return True
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        given = request.cookies.get(COOKIE, "") if request.method in ("GET", "HEAD") else ""
    return bool(given) and secrets.compare_digest(given, token)


def authorized_dependency(token: str | None):
    from fastapi import Depends, HTTPException, Request
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

    bearer = HTTPBearer(auto_error=False)  # declares the scheme in the OpenAPI docs

    def authorized(request: Request, _: HTTPAuthorizationCredentials | None = Depends(bearer)):
        if not authorized_by(request, token):
            raise HTTPException(401, "missing or wrong bearer token (RLSTREAM_API_TOKEN)",
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip

    return authorized


def make_app(runs: Runs, token: str | None, endpoints=None):
    """The FastAPI app over `runs`; token None: no auth (loopback only, checked by the CLI)."""
    from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
    from fastapi.responses import FileResponse, PlainTextResponse, StreamingResponse

    from rlstream.ops.webview import add_web_routes

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
        return _read_json(artifact(run_id, "summary.json")) or {}

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

    @api.post("/datasets/{name}/prompts")
    async def publish_prompts(name: str, request: Request) -> dict:
        from rlstream.ops.publish import publish_rows, verifier_check
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


async def live_events(runs: Runs, run_id: str, poll_s: float = 0.5):
    """Server-sent events: the live figures whenever live.json changes; `event: end` with the
    summary once the run is no longer going."""
    live, seen = runs.path(run_id, LIVE_FILE), None
    while True:
        status = await asyncio.to_thread(runs.status, run_id)
        stamp = live.stat().st_mtime if live.exists() else None
        if stamp != seen and stamp is not None:
            seen = stamp
            yield f"data: {json.dumps(_read_json(live) or {}, default=str)}\n\n"
        if status["state"] not in ("running", "submitted"):
            yield f"event: end\ndata: {json.dumps(status, default=str)}\n\n"
            return
        await asyncio.sleep(poll_s)
