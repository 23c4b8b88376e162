"""`rlstream env`: environments (multi-turn episodes) on their own."""

from __future__ import annotations

import typer

from rlstream.cli.app import app, console

env_app = typer.Typer(help="Environments: serve one over OpenEnv's protocol, list them.")
app.add_typer(env_app, name="env")


@env_app.command("serve")
def serve(
    name: str = typer.Argument(..., help="An environment: calculator, or package.module:Class."),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (loopback by default)."),
    port: int = typer.Option(8000, min=1, max=65535, help="TCP port."),
    options: str = typer.Option("", help='env.options for it, a JSON object: {"tool": false}'),
    max_sessions: int = typer.Option(64, min=1, help="Concurrent episodes (WebSocket sessions)."),
) -> None:
    """Serve an rlstream environment as an OpenEnv server (openenv-core's FastAPI app): any
    OpenEnv client plays episodes with it, and a run on another machine trains against it with
    prompts whose `environment` is this server's address."""
    import uvicorn

    from rlstream.config import EnvConfig
    from rlstream.trainers.environments.base import environment_class
    from rlstream.trainers.environments.openenv import openenv_app

    environment_class(name)  # an unknown or unimportable one: one line, before listening
    try:
        app_ = openenv_app(name, EnvConfig(options=options), max_sessions)
    except ImportError:
        raise typer.BadParameter("needs openenv-core: pip install 'rlstream[openenv]'") from None
    console.print(f"environment {name} over OpenEnv on http://{host}:{port} "
                  f"(WebSocket /ws, API docs /docs)")  # fmt: skip
    uvicorn.run(app_, host=host, port=port, log_level="warning")


@env_app.command("list")
def list_() -> None:
    """The registered environments (your own are named by import path or address)."""
    from rlstream.trainers.environments.base import ENVIRONMENTS

    for name in ENVIRONMENTS.names():
        console.print(name)
