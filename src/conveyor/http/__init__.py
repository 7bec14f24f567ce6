"""``conveyor serve``: the HTTP API, an ASGI application (Starlette) run by uvicorn.

A presenter over the producer API (``App.prepare`` / ``admit`` / ``insert_prepared`` through the
group commit, ``App.publish``) and the operator API (``app.admin``); it holds no rule of its own
and never touches the storage seam. Installed by ``pip install 'conveyor[http]'``; see docs/http.md.
"""

from __future__ import annotations

from conveyor.http._api import ServiceConfig, create_app

__all__ = ["ServiceConfig", "create_app"]
