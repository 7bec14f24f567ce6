"""The Conveyor demo: a producer enqueues a few hundred jobs, a worker drains them, some land in the DLQ.

Run it with ``./scripts/demo.sh`` (which sets everything up), or by hand::

    python -m examples.demo produce          # enqueue 300 jobs
    conveyor worker examples.demo:app --burst --processes 2
    conveyor stats
"""

from __future__ import annotations

import random
import sys
import time

from conveyor import App, Message, Retry

app = App()  # $CONVEYOR_DATABASE_URL, else the embedded SQLite file conveyor.db


@app.task(queue="emails", max_attempts=3, backoff=[0.2, 0.5])
def send_welcome_email(user_id: int, address: str) -> dict[str, object]:
    """Pretend to send an email; the mail server is flaky for one user in ten (a transient error)."""
    time.sleep(random.uniform(0.001, 0.005))
    if user_id % 10 == 3:
        raise ConnectionError(f"SMTP server refused the connection for {address}")
    return {"sent_to": address}


@app.task(queue="images", max_attempts=4, backoff=[0.1])
def resize_image(image_id: int, width: int) -> dict[str, int]:
    """Pretend to resize; a bad width is a permanent error (ValueError: dead-lettered at once)."""
    if width <= 0:
        raise ValueError(f"width must be positive, got {width}")
    if image_id % 25 == 0:
        raise Retry(delay=0.1, reason="thumbnail cache warming up")
    return {"image_id": image_id, "width": width}


def produce(n: int = 300) -> None:
    """Enqueue ``n`` jobs in two batches (one round trip each)."""
    emails = [
        Message(send_welcome_email.name, {"user_id": i, "address": f"user{i}@example.com"}) for i in range(n // 2)
    ]
    images = [
        Message(resize_image.name, {"image_id": i, "width": -1 if i % 20 == 7 else 320}) for i in range(n - n // 2)
    ]
    jobs = app.send_many(emails) + app.send_many(images)
    print(f"enqueued {len(jobs)} jobs on {app.database_url}")


if __name__ == "__main__":
    if sys.argv[1:] == ["produce"]:
        produce()
    else:
        print(__doc__)
