"""The App the dashboard tests run `conveyor serve` and workers with.

``dash.work`` (queue ``drain``) sleeps a little so that a drain takes a few of the dashboard's polls;
``dash.hold`` (queue ``slow``) sleeps as long as it is told, so that a test sees it in flight;
``dash.boom`` (queue ``fragile``) raises ValueError with the message it is given, which is permanent:
the job is dead-lettered at once, with that message (``<NUL>`` in it becomes a NUL character) and a
traceback.
"""

from __future__ import annotations

import time

from conveyor import App

app = App()

#: Seconds each ``dash.work`` job takes.
WORK_SECONDS = 0.02


@app.task(name="dash.work", queue="drain")
def work(n: int) -> int:
    time.sleep(WORK_SECONDS)
    return n


@app.task(name="dash.hold", queue="slow")
def hold(seconds: float) -> None:
    time.sleep(seconds)


@app.task(name="dash.boom", queue="fragile", max_attempts=1)
def boom(message: str) -> None:
    # A payload cannot hold NUL (PostgreSQL cannot store it); an error message can: "<NUL>" becomes one.
    raise ValueError(message.replace("<NUL>", "\x00"))
