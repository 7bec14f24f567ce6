"""The README's service blocks run as written: the quick start's two commands, then every curl line, against
a live `conveyor serve` on the embedded default (SQLite) in a fresh directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
from tests.http.conftest import REPO, free_port

from conveyor import App

README = (REPO / "README.md").read_text()
_BASH = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _block(marker: str) -> list[str]:
    (code,) = [m.group(1) for m in _BASH.finditer(README) if marker in m.group(1)]
    lines = code.replace("\\\n", " ").splitlines()
    return [line.split("  #")[0].strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_readme_service_blocks_run_as_written(tmp_path: Path) -> None:
    port = str(free_port())
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("CONVEYOR_DATABASE_URL", None)
    (tmp_path / "service_app.py").write_text(
        "from conveyor import App\napp = App()\napp.queue('ingest', max_depth=1)\n"
    )
    create, serve = _block("conveyor serve --port 8000")
    made = subprocess.run(["bash", "-c", create], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    token = made.stdout.strip()
    assert token.startswith("cvy_") and "shown this once" in made.stderr
    # --app adds a high-water mark on 'ingest' so that the README's 429 line meets one.
    serving = serve.replace("8000", port).replace("conveyor serve", "conveyor --app service_app:app serve")
    server = subprocess.Popen(
        ["bash", "-c", f"exec {serving}"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.1)
        with App(f"sqlite:///{tmp_path}/conveyor.db") as app:
            app.send("t", queue="ingest")  # the queue is at its mark

            @app.task(name="img", queue="images", max_attempts=1)
            def img() -> None:
                raise ValueError("width")

            from conveyor.testing import drain

            img.delay()
            assert drain(app, ["images"]).dead == 1
        outputs: list[str] = []
        job_id = ""
        for command in _block("export TOKEN=cvy_"):
            if command.startswith("export"):
                continue
            command = command.replace("8000", port).replace("0190...", job_id)
            done = subprocess.run(
                ["bash", "-c", command], cwd=tmp_path, env={**env, "TOKEN": token}, capture_output=True, text=True
            )
            assert done.returncode == 0, done.stderr
            outputs.append(done.stdout)
            if not job_id:
                job_id = httpx.Response(200, content=done.stdout).json()["id"]
        sent, status, full, replayed = outputs
        assert '"duplicate":false' in sent
        assert '"state":"pending"' in status and '"task":"send_welcome"' in status
        assert full.startswith("HTTP/1.1 429") and "retry-after:" in full.lower()
        assert '"replayed":[{' in replayed
    finally:
        server.terminate()
        server.wait(timeout=30)
