"""How each uvicorn worker process builds the service: from one JSON setting in the environment.

``conveyor serve --workers N`` has uvicorn start N processes that each import this module and
call :func:`from_environment`; the CLI writes what they need (database URL, ``--app``, the
service config) to ``CONVEYOR_SERVE`` first. No token or password is in it: the database URL is
the one the operator gave, in the process's own environment.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict
from typing import Any

from starlette.types import ASGIApp

from conveyor._app import App
from conveyor.http._api import ServiceConfig, create_app

ENV = "CONVEYOR_SERVE"

log = logging.getLogger("conveyor.http")

NO_AUTH_WARNING = (
    "WARNING: conveyor serve is running WITHOUT AUTHENTICATION (--insecure-no-auth): anyone who can reach "
    "this port can send jobs, read every job and payload, replay and purge dead letters, and make tokens. "
    "Use it only on a machine of your own."
)


def to_environment(database_url: str | None, app_path: str | None, config: ServiceConfig) -> None:
    """Write what a worker process needs to build the service to ``$CONVEYOR_SERVE``."""
    os.environ[ENV] = json.dumps({"database_url": database_url, "app_path": app_path, "config": asdict(config)})


def load(database_url: str | None, app_path: str | None) -> App:
    """The App the service works on: ``--app``'s (its queue policies apply: backpressure, dedup
    windows), else a plain App on the database URL."""
    if app_path:
        from conveyor.worker.supervisor import load_app

        app = load_app(app_path)
        if database_url:
            app.database_url = database_url
        return app
    return App(database_url)


def from_environment() -> ASGIApp:
    """The service as ``$CONVEYOR_SERVE`` describes it (uvicorn's factory in every worker)."""
    settings: dict[str, Any] = json.loads(os.environ[ENV])
    # JSON has no tuples: the list-valued settings come back as lists.
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in settings["config"].items()}
    config = ServiceConfig(**fields)
    if not config.auth:
        print(f"[pid {os.getpid()}] {NO_AUTH_WARNING}", file=sys.stderr, flush=True)
    return create_app(load(settings["database_url"], settings["app_path"]), config)
