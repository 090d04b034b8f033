"""A JSON-over-HTTP server on 127.0.0.1 for tests that talk to model servers.

Real sockets, no monkeypatching: ``answer(path, body, headers)`` returns
``(status, payload)`` and the server sends it back as JSON.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[str, Any, Mapping[str, str]], tuple[int, Any]]


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that writes no access log and answers with one helper."""

    def send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: forty clients connecting at once on a
    # loaded machine overflowed it, the kernel dropped their SYNs, and the retries'
    # backoff (1, 2, 4, 8, 16 s) could outlast a test's wait (a CI run saw it)
    request_queue_size = 128


def serve_in_thread(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A server on a free port of 127.0.0.1, serving from a daemon thread."""
    httpd = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


class Serving:
    """``handler`` served on a free port of 127.0.0.1 until :meth:`close`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = serve_in_thread(handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class JsonServer(Serving):
    """Serves POSTs with ``answer`` until :meth:`close`."""

    def __init__(self, answer: Answer) -> None:
        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, payload = answer(self.path, body, dict(self.headers))
                self.send(status, json.dumps(payload).encode(), "application/json")

        super().__init__(Handler)
