"""A local webhook receiver: a real HTTP server in a thread that records what it is sent, and can be
told to answer 500 or to hang."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """``mode``: ``ok`` (204), ``error`` (500 every time), ``hang`` (never answers until closed),
    ``redirect`` (302 to itself; a GET, which no delivery may send, is answered 200)."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.received: list[dict[str, Any]] = []
        self.hits = 0
        self.gets = 0
        self._closing = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                receiver.hits += 1
                if receiver.mode == "hang":
                    receiver._closing.wait(60)
                    return
                if receiver.mode == "error":
                    self.send_response(500)
                    self.end_headers()
                    return
                if receiver.mode == "redirect":
                    self.send_response(302)
                    self.send_header("Location", self.path)
                    self.end_headers()
                    return
                receiver.received.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def do_GET(self) -> None:
                receiver.gets += 1
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self.received):
            assert time.monotonic() < deadline, f"webhook did not receive it; got {self.received}"
            time.sleep(0.02)

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()
