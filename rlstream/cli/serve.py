"""`rlstream serve`: the HTTP API and web view over runs."""

from __future__ import annotations

from pathlib import Path

import typer

from rlstream.cli.app import (
    app,
    console,
)


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (loopback by default)."),
    port: int = typer.Option(8765, min=1, max=65535, help="TCP port."),
    out: Path = typer.Option(Path("runs"), help="Where the runs live (one directory each)."),
    no_auth: bool = typer.Option(False, help="No bearer token (allowed on loopback only)."),
) -> None:
    """Run control over HTTP: submit, list, follow (server-sent events), stop and resume runs,
    fetch their reports, publish prompts; a web view at /. Needs RLSTREAM_API_TOKEN (bearer)
    unless --no-auth.
    Runs use a running stack, or one started here for the server's lifetime."""
    import os
    import shutil
    import signal
    import sys

    import uvicorn

    from rlstream.ops.api.runs import Runs
    from rlstream.ops.api.server import make_app
    from rlstream.ops.launcher.datapath import SERVE_ENDPOINTS, SERVE_STACK, stack_or_endpoints

    token = os.environ.get("RLSTREAM_API_TOKEN") or None
    loopback = host in ("127.0.0.1", "localhost", "::1")
    if token is None and not no_auth:
        raise typer.BadParameter("set RLSTREAM_API_TOKEN (clients send it as a bearer token), "
                                 "or --no-auth on loopback")  # fmt: skip
    if no_auth and not loopback:
        raise typer.BadParameter(f"--no-auth: only on loopback, not on {host!r}")
    out = out.resolve()
    # uvicorn re-raises a SIGTERM once it has shut down: as SystemExit, the stack it started
    # and the endpoints file below are cleaned up on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with stack_or_endpoints(out / SERVE_STACK) as (stack, embedded):
        runs = Runs(out, dict(os.environ) | stack.as_env())
        if embedded:  # `rlstream export --runs OUT` finds this server's runs while it is up
            stack.write(out / SERVE_ENDPOINTS)
            (out / SERVE_ENDPOINTS / "pid").write_text(str(os.getpid()))
        where = "started for this server" if embedded else "running"
        console.print(
            f"rlstream serve on http://{host}:{port} (web view: /, API docs: /docs); "
            f"runs under {out}; stack {where} (broker {stack.kafka_bootstrap})"
        )
        try:
            uvicorn.run(make_app(runs, token if not no_auth else None, stack), host=host,
                        port=port, log_level="warning")  # fmt: skip
        finally:
            shutil.rmtree(out / SERVE_ENDPOINTS, ignore_errors=True)
