"""The alert loop of ``conveyor serve`` and the webhooks it notifies.

The loop evaluates the rules every ``interval`` seconds through ``app.admin.evaluate_alerts`` and hands
each state change to :class:`Webhooks`, which posts it to every configured URL with retries, each
delivery in its own task on its own small thread pool: a webhook that hangs or fails delays only its
own deliveries, never the evaluation nor the HTTP API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.message import Message
from typing import IO, Any
from urllib.parse import urlsplit

from conveyor._admin import Admin
from conveyor._alerts import AlertRules, check_webhook
from conveyor._errors import BackendUnavailable
from conveyor.backends.base import AlertState
from conveyor.worker._service import Service

log = logging.getLogger("conveyor.alerts")

#: Deliveries waiting or under way past which new ones are dropped (and logged): a dead receiver must
#: not grow memory without bound.
MAX_PENDING = 1000


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook's answer is its status: a redirect is a failed try, not followed. (urllib re-sends a
    redirected POST as a GET without its body, and that GET's 2xx counted as delivered.)"""

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: Message, newurl: str
    ) -> urllib.request.Request | None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _one_line(text: str) -> str:
    """``text`` for one log line: newlines and other control characters escaped (a queue name may hold
    them, and would otherwise forge log lines)."""
    return text if text.isprintable() else repr(text)[1:-1]


def _where(url: str) -> str:
    """A webhook as logged: scheme, host and port only (a path or query may hold a secret)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def alert_json(alert: AlertState) -> dict[str, Any]:
    """The body a webhook receives (also what ``GET /v1/alerts`` lists)."""
    return {
        "source": "conveyor",
        "rule": alert.rule,
        "queue": alert.queue,
        "state": alert.state,
        "since": alert.since.isoformat(),
        "value": alert.value,
        "threshold": alert.threshold,
        "message": alert.message,
    }


@dataclass
class Delivery:
    """What became of one notification to one URL (kept for the last few, for ``/readyz``-style checks
    and tests)."""

    url: str
    alert: AlertState
    attempts: int = 0
    status: int | None = None
    error: str | None = None
    delivered: bool = False


@dataclass
class Webhooks:
    """POSTs alert changes as JSON to ``urls``: up to ``attempts`` tries per URL, ``timeout`` seconds
    each (connect and every read), exponential backoff with jitter from ``backoff`` seconds between
    tries. A 2xx answer delivers; anything else (an error status, a refused connection, a timeout) is
    retried, then logged as lost. Raises ConfigurationError for a bad URL when made."""

    urls: Sequence[str]
    attempts: int = 5
    timeout: float = 5.0
    backoff: float = 1.0
    recent: list[Delivery] = field(default_factory=list)
    _pool: ThreadPoolExecutor = field(init=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        self.urls = [check_webhook(u) for u in self.urls]
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="conveyor-webhook")

    def notify(self, alert: AlertState) -> None:
        """Start delivering ``alert`` to every URL (returns at once; call on the event loop)."""
        for url in self.urls:
            if len(self._tasks) >= MAX_PENDING:
                log.error(
                    "dropping the %s %s notification to %s: %d deliveries pending",
                    alert.rule,
                    alert.state,
                    _where(url),
                    len(self._tasks),
                )
                continue
            task = asyncio.create_task(self._deliver(Delivery(url, alert)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _deliver(self, delivery: Delivery) -> None:
        body = json.dumps(alert_json(delivery.alert), allow_nan=False, default=str).encode()
        loop = asyncio.get_running_loop()
        for attempt in range(1, self.attempts + 1):
            delivery.attempts = attempt
            try:
                delivery.status = await asyncio.wait_for(
                    loop.run_in_executor(self._pool, self._post, delivery.url, body), self.timeout * 3
                )
                delivery.error = None
            except Exception as exc:  # every way a receiver can fail is a failed try, retried
                delivery.status, delivery.error = None, f"{type(exc).__name__}: {exc}"
            if delivery.status is not None and 200 <= delivery.status < 300:
                delivery.delivered = True
                break
            if attempt < self.attempts:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1) * random.uniform(0.5, 1.0))
        else:
            log.error(
                "webhook %s: the %s %s notification was not delivered after %d tries (%s)",
                _where(delivery.url),
                delivery.alert.rule,
                delivery.alert.state,
                self.attempts,
                delivery.error or f"status {delivery.status}",
            )
        self.recent.append(delivery)
        del self.recent[:-100]

    def _post(self, url: str, body: bytes) -> int:
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json", "User-Agent": "conveyor"}
        )
        try:
            with _OPENER.open(request, timeout=self.timeout) as response:
                response.read(65536)
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` seconds for deliveries under way (on shutdown), then give up on them."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in list(self._tasks):
            task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


class AlertLoop(Service):
    """Evaluates the alert rules every ``interval`` seconds and notifies each change. A round that
    fails (the database is away, or damaged until it is repaired) is logged and the next one tries
    again: alerts must not stop the service."""

    name = "alerts"
    run_first = True
    max_failures = 1_000_000
    ends_on_damage = False

    def __init__(self, admin: Admin, rules: AlertRules, webhooks: Webhooks | None, interval: float = 15.0) -> None:
        super().__init__()
        self.admin = admin
        self.rules = rules
        self.webhooks = webhooks
        self.interval = interval

    async def run_once(self) -> int:
        """One evaluation; return how many alerts changed state."""
        try:
            changed = await asyncio.to_thread(self.admin.evaluate_alerts, self.rules)
        except BackendUnavailable as exc:
            # An outage is expected here, and lasts many rounds: one line each, not a traceback.
            log.warning("alerts not evaluated: %s", _one_line(str(exc)))
            return 0
        for alert in changed:
            log.warning("alert %s: %s", alert.state, _one_line(alert.message))
            if self.webhooks is not None:
                self.webhooks.notify(alert)
        return len(changed)
