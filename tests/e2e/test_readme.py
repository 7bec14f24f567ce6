"""The README runs as written (issue 14): every ```python and ```bash block, in order, the way a reader
follows it — one throwaway PostgreSQL database stands in for ``postgresql://app@db/app``.

- A python block whose first line names a file (``# myproject/tasks.py``) is written to that file in a
  temporary directory (the reader's project); other python blocks are executed. Names a block uses but
  leaves to the reader (``app``, ``url``, ``mail_server_busy``, ...) are given by the block's ``Spec``.
  A ``print(...)  # "text"`` line must print ``text``.
- A bash block runs command by command with ``$CONVEYOR_DATABASE_URL`` set to the throwaway database and
  the project directory as the working directory; each must exit 0. ``conveyor worker`` without
  ``--burst`` runs in the background until the end, and must then stop cleanly on SIGTERM.
- Every block must match exactly one ``Spec`` (by a line only it has): a new block fails this test until
  it is given a way to run (or a reason why it cannot).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from conveyor import App
from conveyor.backends.base import JobsListParams, SchedulesUpsertParams
from conveyor.testing import drain, run_job

from ._support import REPO, child_env, wait_until

README = REPO / "README.md"
#: The README's placeholder database; every occurrence becomes the test's throwaway database.
PLACEHOLDER_URL = "postgresql://app@db/app"
_FENCE = re.compile(r"^```(python|bash)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_FILE_BLOCK = re.compile(r"\A# ([\w/]+\.py)\n")
_PRINTED = re.compile(r"print\(.*\)\s+# \"(.*)\"$")


@dataclass
class Reader:
    """What a reader has while following the README: a project directory, a database, an App."""

    url: str
    workdir: Path
    app: App
    background: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return child_env(
            {
                "CONVEYOR_DATABASE_URL": self.url,
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                "COLUMNS": "200",
            }
        )

    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(statement)  # type: ignore[call-overload]
            return cur.fetchall() if cur.description else []

    def live(self, queue: str) -> list[Any]:
        return self.app.backend.jobs_list(JobsListParams(queue=queue))


Hook = Callable[[Reader, dict[str, Any]], None]


@dataclass(frozen=True)
class Spec:
    """How to run the one README block that contains ``marker``."""

    marker: str
    kind: str = "run"  # run | skip | pipeline
    reason: str = ""
    given: Callable[[Reader], dict[str, Any]] = lambda reader: {}
    before: Callable[[Reader], None] = lambda reader: None
    after: Hook = lambda reader, names: None


# -- what the README leaves to the reader ------------------------------------------------------


def _app_and_url(reader: Reader) -> dict[str, Any]:
    return {"app": reader.app, "url": reader.url, "DB": reader.url}


def _topic_tasks(reader: Reader) -> dict[str, Any]:
    @reader.app.task(name="bill", queue="billing")
    def bill(order: int) -> None: ...

    @reader.app.task(name="ship", queue="eu-shipping")
    def ship(order: int) -> None: ...

    return {"app": reader.app, "bill": bill, "ship": ship}


def _store_declared_schedules(reader: Reader, names: dict[str, Any]) -> None:
    """What a worker does when it starts: store the App's declared schedules."""
    reader.app.backend.schedules_upsert(SchedulesUpsertParams(list(reader.app.schedules.values())))


def _charge_once(reader: Reader, names: dict[str, Any]) -> None:
    """Run the handler twice for the same order: the effect happens once."""
    for _ in range(2):
        assert run_job(reader.app, names["charge"], {"order": 7}).state == "completed"
    assert reader.sql("SELECT order_id FROM charges") == [(7,)]


def _run_the_tests(reader: Reader, names: dict[str, Any]) -> None:
    """The testing-kit block defines tests around your own code; give it some, and run them."""
    app: App = names["app"]

    @app.task(queue="emails")
    def send_welcome(to: str) -> None: ...

    @app.task(queue="flaky")
    def flaky_task(x: int) -> None:
        raise RuntimeError("flaky")

    def signup(email: str) -> None:
        send_welcome.delay(to=email)

    names.update(send_welcome=send_welcome, flaky_task=flaky_task, signup=signup)
    tests = [fn for name, fn in names.items() if name.startswith("test_")]
    assert len(tests) == 2
    for test in tests:
        test()


SPECS = [
    Spec("./scripts/demo.sh", "skip", "the set-up path itself: .ci/run runs it on a clean clone before the tests"),
    Spec("conveyor serve --port 8000", "skip", "a server: tests/http/test_readme_service.py runs this block"),
    Spec("export TOKEN=cvy_", "skip", "curl against a server: tests/http/test_readme_service.py runs this block"),
    Spec(
        "# myproject/tasks.py",
        given=lambda reader: {"prelude": "def mail_server_busy() -> bool:\n    return False\n"},
    ),
    Spec(f"conveyor migrate --db {PLACEHOLDER_URL}"),
    Spec("from myproject.tasks import send_welcome"),
    Spec(
        'conn.execute("INSERT INTO orders',
        given=_app_and_url,
        before=lambda reader: _create(reader, "orders (id integer PRIMARY KEY)"),
        after=lambda reader, names: _assert(
            reader.sql("SELECT id FROM orders") == [(7,)] and len(reader.live("default")) == 1
        ),
    ),
    Spec('app.queue("payments"', given=_app_and_url),
    Spec(
        'if ctx.once(f"charge:{order}"',
        given=_app_and_url,
        before=lambda reader: _create(reader, "charges (order_id integer)"),
        after=_charge_once,
    ),
    Spec(
        'ordering_key="account-42"',
        given=_app_and_url,
        after=lambda reader, names: _assert([j.ordering_key for j in reader.live("ledger")] == ["account-42"] * 2),
    ),
    Spec('@app.periodic("*/5 * * * *"', given=_app_and_url, after=_store_declared_schedules),
    Spec(
        "conveyor schedules pause refresh-report",
        after=lambda reader, names: _assert(
            {s.name: s.paused for s in reader.app.backend.schedules_list()}
            == {"refresh-report": True, "nightly-export": False}
        ),
    ),
    Spec(
        'app.subscribe("orders", "billing", bill)',
        given=_topic_tasks,
        after=lambda reader, names: _assert(len(reader.live("billing")) == len(reader.live("eu-shipping")) == 1),
    ),
    Spec(
        "conveyor topics subscribe orders audit",
        after=lambda reader, names: _assert(len(reader.live("billing")) == 2 and reader.live("eu-shipping")),
    ),
    Spec(
        'relay.publish("order.shipped"',
        given=_app_and_url,
        before=lambda reader: _create(reader, "shipments (order_id integer)"),
        after=lambda reader, names: _assert(
            reader.sql("SELECT order_id FROM shipments") == [(7,)]
            and [(j.task, j.ordering_key) for j in reader.live("outbox")] == [("conveyor.relay", "order-7")]
        ),
    ),
    Spec("conveyor contract --app myproject.tasks:app"),
    Spec("conveyor export --out history/", "pipeline", "Spark: see test_readme_pipeline_block_runs_as_written"),
    Spec("from conveyor.testing import assert_enqueued", after=_run_the_tests),
]


def _assert(condition: object) -> None:
    assert condition


def _create(reader: Reader, table: str) -> None:
    """The reader's own business table."""
    reader.sql(f"CREATE TABLE {table}")


# -- reading and running blocks ----------------------------------------------------------------


def readme_blocks() -> list[tuple[str, str, int]]:
    """Every ```python and ```bash block of the README: (language, code, first line number)."""
    text = README.read_text()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 2) for m in _FENCE.finditer(text)]


def spec_of(code: str) -> Spec:
    matching = [s for s in SPECS if s.marker in code]
    assert len(matching) == 1, f"README block needs exactly one Spec, found {len(matching)}:\n{code}"
    return matching[0]


def _commands(code: str) -> list[str]:
    """A bash block's commands (backslash-continued lines joined)."""
    return [c for c in code.replace("\\\n", " ").splitlines() if c.strip() and not c.lstrip().startswith("#")]


def run_bash(reader: Reader, code: str, line: int) -> None:
    for command in _commands(code):
        if command.startswith("conveyor worker") and "--burst" not in command:
            log = reader.workdir / f"worker-{len(reader.background)}.log"
            with log.open("w") as out:
                proc = subprocess.Popen(
                    ["bash", "-c", f"exec {command}"],
                    cwd=reader.workdir,
                    env=reader.env(),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            reader.background.append((proc, log))
            wanted = int(m.group(1)) if (m := re.search(r"--processes (\d+)", command)) else 1

            def ready(proc: subprocess.Popen[bytes] = proc, wanted: int = wanted) -> bool | None:
                """Every worker process listens for new jobs (or the worker has exited)."""
                return proc.poll() is not None or _listeners(reader) >= wanted or None

            wait_until(ready, timeout=90, what=f"README line {line}: {command}")
            assert proc.poll() is None, f"README line {line}: {command} exited:\n{log.read_text()}"
            continue
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=reader.workdir,
            env=reader.env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"README line {line}: {command}\n{done.stdout}{done.stderr}"


def _listeners(reader: Reader) -> int:
    dbname = reader.url.rsplit("/", 1)[1]
    rows = reader.sql(
        f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{dbname}' AND query LIKE '%LISTEN conveyor_jobs%'"
    )
    return int(rows[0][0])


def run_python(reader: Reader, spec: Spec, code: str, line: int) -> None:
    given = spec.given(reader)
    file = _FILE_BLOCK.match(code)
    if file:
        path = reader.workdir / file.group(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(reader.workdir).parents[:-1]:
            (reader.workdir / parent / "__init__.py").touch()
        path.write_text(given.get("prelude", "") + code)
        return
    names: dict[str, Any] = {"__name__": f"readme_line_{line}", **given}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"README.md:{line}", "exec"), names)
    expected = [m.group(1) for m in map(_PRINTED.search, code.splitlines()) if m]
    assert out.getvalue().splitlines() == expected, f"README line {line} printed {out.getvalue()!r}"
    spec.after(reader, names)


@contextlib.contextmanager
def _importable(workdir: Path) -> Iterator[None]:
    sys.path.insert(0, str(workdir))
    before = set(sys.modules)
    try:
        yield
    finally:
        sys.path.remove(str(workdir))
        for name in set(sys.modules) - before:
            module = sys.modules.pop(name)
            app = getattr(module, "app", None)
            if isinstance(app, App):
                app.close()


def test_every_readme_block_has_a_way_to_run() -> None:
    blocks = readme_blocks()
    assert len(blocks) >= 10
    used = [spec_of(code) for _, code, _ in blocks]
    assert sorted(s.marker for s in used) == sorted(s.marker for s in SPECS), "a Spec matches no README block"


def test_readme_runs_as_written(postgres_database: str, tmp_path: Path) -> None:
    reader = Reader(postgres_database, tmp_path, App(postgres_database))
    try:
        ran = []
        with _importable(tmp_path):
            for language, code, line in readme_blocks():
                spec = spec_of(code)
                if spec.kind != "run":
                    continue
                ran.append(spec)
                code = code.replace(PLACEHOLDER_URL, reader.url)
                spec.before(reader)
                if language == "bash":
                    run_bash(reader, code, line)
                    spec.after(reader, {})
                else:
                    run_python(reader, spec, code, line)
        assert ran == [s for s in SPECS if s.kind == "run"]
        assert reader.background, "the README's worker did not run"
        for proc, log in reader.background:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=90) == 0, log.read_text()
    finally:
        for proc, _ in reader.background:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.app.close()


def test_readme_pipeline_block_runs_as_written(tmp_path: Path) -> None:
    """The data-pipeline commands, with the business tables they name written first."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    url = f"sqlite:///{tmp_path}/conveyor.db"
    reader = Reader(url, tmp_path, App(url))
    try:
        # Some history to report on, and order 1 waiting in the queue.
        @reader.app.task(name="send_welcome", queue="emails")
        def send_welcome(user_id: int, email: str = "") -> None: ...

        for n in range(5):
            send_welcome.delay(user_id=100 + n)
        assert drain(reader.app, ["emails"]).completed == 5
        time.sleep(5.5)  # export leaves rows that finished in the last 5 s for its next run
        job = reader.app.send("billing.charge", {"order": 1}, queue="billing", idempotency_key="1")
        pq.write_table(
            pa.table({"order_id": ["1", "2"], "status": ["pending", "pending"]}), tmp_path / "orders.parquet"
        )
        pq.write_table(pa.table({"user_id": [1, 2, 3], "email": ["a@x", "b@x", "c@x"]}), tmp_path / "users.parquet")
        # The project the block's --app names, declaring a queue's SLA as "A first app" would.
        (tmp_path / "myproject").mkdir()
        (tmp_path / "myproject" / "__init__.py").write_text("")
        (tmp_path / "myproject" / "tasks.py").write_text(
            "from datetime import timedelta\nfrom conveyor import App\n\n"
            "app = App()\napp.queue('emails', sla=timedelta(seconds=60))\n"
        )
        [(_, code, line)] = [b for b in readme_blocks() if spec_of(b[1]).kind == "pipeline"]
        run_bash(reader, code, line)
        assert (tmp_path / "report" / "report.html").is_file()
        emails = reader.live("emails")
        assert sorted(json.loads(j.payload)["user_id"] for j in emails) == [1, 2, 3]
        # Order 2 was lost (pending in the business table, unknown to the queue): requeued with its key.
        assert [j.idempotency_key for j in reader.live("billing") if j.id != job.id] == ["2"]
    finally:
        reader.app.close()
