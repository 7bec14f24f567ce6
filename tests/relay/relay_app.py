"""The app a relay worker process imports (``conveyor worker tests.relay.relay_app:app --queues outbox``): its
database is the CLI's --db, its broker and exchange come from the environment."""

from __future__ import annotations

import os

from conveyor import App
from conveyor.relay import Relay

app = App()
relay = Relay(
    app,
    os.environ.get("RELAY_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
    exchange=os.environ.get("RELAY_EXCHANGE", ""),
    confirm_timeout=float(os.environ.get("RELAY_CONFIRM_TIMEOUT", "10")),
    # Short leases: the jobs a killed relay held come back within seconds.
    visibility_timeout=2,
    backoff=[0.2],
)
