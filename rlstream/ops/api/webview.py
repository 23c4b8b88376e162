"""The web view of `rlstream serve`: the runs, one run's live figures and curves, its report, and
a review page of its rollouts (prompt, completion, reward, the verifier's details).

    GET /login, POST /login      a form that takes the API token and keeps it in an HttpOnly,
                                 SameSite=Strict cookie (a browser cannot send a bearer header)
    GET /                        the runs (refreshes itself)
    GET /ui/runs/{id}            live figures and curves from the run's server-sent events,
                                 its report once it is done
    GET /ui/runs/{id}/rollouts   sampled rollouts, filtered by task, reward, correctness, step
    GET /runs/{id}/rollouts      the same rows as JSON (API)

Pages are server-rendered (Jinja2); the run page's curves are drawn by uPlot (vendored from npm,
MIT, `web/static/uPlot.LICENSE`) in one small script. The cookie authenticates only GET requests:
everything that changes a run still needs the bearer header, so another site cannot forge one.
"""

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, quote

from rlstream.connectors.endpoints import Endpoints

WEB = Path(__file__).parent / "web"


@dataclass(frozen=True)
class ReviewFilter:
    task: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    correct: bool | None = None
    min_step: int | None = None
    max_step: int | None = None
    limit: int = 100

    def keep(self, row: dict) -> bool:
        step = row["step"]
        return (
            (self.task is None or row["task"] == self.task)
            and (self.min_reward is None or row["reward"] >= self.min_reward)
            and (self.max_reward is None or row["reward"] <= self.max_reward)
            and (self.correct is None or row["correct"] == self.correct)
            and (self.min_step is None or (step is not None and step >= self.min_step))
            and (self.max_step is None or (step is not None and step <= self.max_step))
        )


def join_rollouts(rollouts: list[dict], rewards: list[dict], versions: list[dict]) -> list[dict]:
    """Completions joined with their rewards by (request_id, sample_idx), newest first.

    The first copy of a redelivered completion or reward wins, as in the assembler. `step` is
    the RL step whose policy version wrote the completion (None before the first RL version)."""
    step_of = {r["version"]: r["step"] for r in versions if r["phase"] != "done"}
    scored: dict[tuple[str, int], dict] = {}
    for r in rewards:
        scored.setdefault((r["request_id"], r["sample_idx"]), r)
    rows, seen = [], set()
    for r in rollouts:
        key = (r["request_id"], r["sample_idx"])
        if key in seen or key not in scored:
            continue
        seen.add(key)
        reward = scored[key]
        rows.append({
            "step": step_of.get(r["policy_version"]),
            "policy_version": r["policy_version"],
            "task": r["task"],
            "prompt_id": r["prompt_id"],
            "request_id": r["request_id"],
            "sample_idx": r["sample_idx"],
            "prompt": r["prompt_text"],
            "completion": r["completion"],
            "answer": r.get("answer"),
            "finish_reason": r.get("finish_reason"),
            "reward": reward["reward"],
            "correct": reward["correct"],
            "verifier": r.get("verifier") or r["task"],  # the family that checked it
            "scored_by": reward["verifier"],
            "details": reward.get("details"),
            "segments": turn_segments(r["completion"], r.get("env_spans")),
            "turns": r.get("turns"),
            "stop_reason": r.get("stop_reason"),
            "env_error": r.get("env_error"),
        })  # fmt: skip
    rows.sort(key=lambda r: (-r["policy_version"], r["request_id"], r["sample_idx"]))
    return rows


def turn_segments(text: str, spans: list[int] | None) -> list[tuple[str, bool]] | None:
    """An episode's transcript as (text, written by the environment) pieces, from its
    [start, end) character spans; None for a single-turn completion.

    >>> turn_segments("?2*3\n6\n6\n", [5, 7])
    [('?2*3\n', False), ('6\n', True), ('6\n', False)]
    """
    if not spans:
        return None
    pieces, at = [], 0
    for start, end in zip(spans[::2], spans[1::2], strict=True):
        if start > at:
            pieces.append((text[at:start], False))
        pieces.append((text[start:end], True))
        at = end
    if at < len(text):
        pieces.append((text[at:], False))
    return pieces


class RolloutReview:
    """A run's scored rollouts, read from rl.rollouts, rl.rewards and rl.policy_versions. Kept per
    run: a finished run is read once, a live one again when its copy is `ttl_s` old."""

    def __init__(self, endpoints: Endpoints, ttl_s: float = 10.0):
        self.endpoints, self.ttl_s = endpoints, ttl_s
        self._cache: dict[str, tuple[float, bool, list[dict]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def rows(self, run_id: str, final: bool) -> list[dict]:
        from rlstream.connectors.reading import read_run_rows
        from rlstream.schemas import get

        async with self._locks.setdefault(run_id, asyncio.Lock()):
            cached = self._cache.get(run_id)
            if cached and (cached[1] or time.monotonic() - cached[0] < self.ttl_s):
                return cached[2]
            topics = [get(name).topic for name in ("rollouts", "rewards", "policy_versions")]
            read = [read_run_rows(self.endpoints, topic, run_id) for topic in topics]
            rows = join_rollouts(*await asyncio.gather(*read))
            self._cache[run_id] = (time.monotonic(), final, rows)
            return rows

    async def select(self, run_id: str, final: bool, f: ReviewFilter) -> dict:
        rows = await self.rows(run_id, final)
        kept = [r for r in rows if f.keep(r)]
        return {
            "run_id": run_id,
            "total": len(rows),
            "matched": len(kept),
            "tasks": sorted({r["task"] for r in rows}),
            "rows": kept[: f.limit],
        }


def render_report(markdown: str, run_id: str) -> str:
    """The run's report as HTML; its plot is served by the API."""
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    return html.replace('src="curves.png"', f'src="/runs/{quote(run_id)}/curves.png"')


def add_web_routes(app, runs, token: str | None, endpoints: Endpoints | None) -> None:
    """The pages and the rollouts API on `app` (make_app's), authenticated like the API."""
    import secrets

    from fastapi import APIRouter, Depends, HTTPException, Query, Request
    from fastapi.responses import HTMLResponse, RedirectResponse
    from fastapi.staticfiles import StaticFiles
    from fastapi.templating import Jinja2Templates

    from rlstream.ops.api.auth import COOKIE, authorized_by, authorized_dependency
    from rlstream.ops.api.runs import RunNotFound

    templates = Jinja2Templates(directory=WEB / "templates")
    review = RolloutReview(endpoints) if endpoints is not None else None
    app.mount("/static", StaticFiles(directory=WEB / "static"), name="static")

    def signed_in(request: Request) -> None:
        if not authorized_by(request, token):
            query = f"?{request.url.query}" if request.url.query else ""
            target = quote(request.url.path + query)
            raise HTTPException(303, "sign in", headers={"Location": f"/login?next={target}"})

    def status(run_id: str) -> dict:
        try:
            return runs.status(run_id)
        except RunNotFound:
            raise HTTPException(404, f"no run {run_id!r}") from None

    def page(request: Request, name: str, **context) -> HTMLResponse:
        return templates.TemplateResponse(request, name, {"auth": token is not None, **context})

    @app.get("/login", response_class=HTMLResponse, include_in_schema=False)
    def login_form(request: Request, next: str = "/", error: str | None = None):
        return page(request, "login.html", next=next, error=error)

    @app.post("/login", include_in_schema=False)
    async def login(request: Request):
        form = parse_qs((await request.body()).decode(errors="replace"))
        given = form.get("token", [""])[0]
        target = form.get("next", ["/"])[0]
        if not target.startswith("/") or target.startswith("//"):
            target = "/"  # only this server's pages
        if token is not None and not secrets.compare_digest(given, token):
            return RedirectResponse(f"/login?error=wrong+token&next={quote(target)}", 303)
        response = RedirectResponse(target, 303)
        if token is not None:
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
        return response

    @app.get("/logout", include_in_schema=False)
    def logout() -> RedirectResponse:
        response = RedirectResponse("/login", 303)
        response.delete_cookie(COOKIE, path="/")
        return response

    ui = APIRouter(dependencies=[Depends(signed_in)], include_in_schema=False)

    @ui.get("/", response_class=HTMLResponse)
    def index(request: Request):
        return page(request, "index.html", runs=runs.all())

    @ui.get("/ui/runs/{run_id}", response_class=HTMLResponse)
    def run_page(request: Request, run_id: str):
        run = status(run_id)
        report = runs.path(run_id, "report.md")
        html = render_report(report.read_text(), run_id) if report.exists() else None
        return page(request, "run.html", run=run, report=html)

    @ui.get("/ui/runs/{run_id}/report", response_class=HTMLResponse)
    def report_fragment(run_id: str) -> str:
        status(run_id)
        report = runs.path(run_id, "report.md")
        if not report.exists():
            raise HTTPException(404, f"run {run_id!r} has no report yet")
        return render_report(report.read_text(), run_id)

    async def reviewed(run_id: str, f: ReviewFilter) -> dict:
        run = status(run_id)
        if review is None:
            raise HTTPException(503, "this server has no stack to read rollouts from")
        final = run["state"] not in ("running", "submitted")
        return await review.select(run_id, final, f)

    def review_filter(
        task: str = "",
        min_reward: str = "",
        max_reward: str = "",
        correct: str = "",
        min_step: str = "",
        max_step: str = "",
        limit: int = Query(100, ge=1, le=2000),
    ) -> ReviewFilter:
        """The review's filters; an empty field (a form's blank input) filters nothing."""
        try:
            return ReviewFilter(
                task=task or None,
                min_reward=_parsed("min_reward", min_reward, float),
                max_reward=_parsed("max_reward", max_reward, float),
                correct=_parsed("correct", correct, _boolean),
                min_step=_parsed("min_step", min_step, int),
                max_step=_parsed("max_step", max_step, int),
                limit=limit,
            )
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None

    @ui.get("/ui/runs/{run_id}/rollouts", response_class=HTMLResponse)
    async def rollouts_page(
        request: Request, run_id: str, f: ReviewFilter = Depends(review_filter)
    ):
        found = await reviewed(run_id, f)
        return page(request, "rollouts.html", run=status(run_id), found=found, f=f)

    app.include_router(ui)

    api = APIRouter(dependencies=[Depends(authorized_dependency(token))])

    @api.get("/runs/{run_id}/rollouts")
    async def rollouts(run_id: str, f: ReviewFilter = Depends(review_filter)) -> dict:
        """Scored rollouts of the run, newest first, filtered (the review page's rows)."""
        return await reviewed(run_id, f)

    app.include_router(api)


def _boolean(value: str) -> bool:
    if value.lower() in ("true", "yes", "1"):
        return True
    if value.lower() in ("false", "no", "0"):
        return False
    raise ValueError(value)


def _parsed(name: str, value: str, kind):
    if not value.strip():
        return None
    try:
        return kind(value.strip())
    except ValueError:
        raise ValueError(f"{name}: {value!r} is not a {kind.__name__.lstrip('_')}") from None
