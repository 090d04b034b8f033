"""An HTTP server that hangs up as uvicorn's idle close does, deterministically.

uvicorn (and so vLLM and SGLang) closes a connection idle for 5 s; a request sent on
it in that instant meets a closed socket and no reply, although the server is fine.
:class:`HangUpOnce` answers every request, except that on its first connection it
reads the second request and hangs up without a word. It answers ``/metrics`` with
vLLM gauges, ``/chat/completions`` with a completion, and anything else with
``{"count": 7}`` (a ``/tokenize`` reply).
"""

from __future__ import annotations

import json
import socket
import threading

METRICS = (
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="m"} 3.0\n'
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
)


COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
}


class HangUpOnce:
    """Answers every request; on its first connection, hangs up on the second one."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections), daemon=True).start()

    @staticmethod
    def _read_request(conn: socket.socket, buffer: bytes) -> tuple[bytes, bytes] | None:
        while b"\r\n\r\n" not in buffer:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            buffer += chunk
        head, rest = buffer.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            rest += conn.recv(65536)
        return head, rest[length:]

    def _serve(self, conn: socket.socket, number: int) -> None:
        with conn:
            buffer, answered = b"", 0
            while True:
                got = self._read_request(conn, buffer)
                if got is None:
                    return
                head, buffer = got
                self.requests += 1
                if number == 1 and answered == 1:
                    return  # read the request, then hang up: the idle-close race
                path = head.split(b" ")[1]
                if path.endswith(b"/metrics"):
                    body, kind = METRICS.encode(), b"text/plain"
                elif path.endswith(b"/chat/completions"):
                    body, kind = json.dumps(COMPLETION).encode(), b"application/json"
                else:
                    body, kind = json.dumps({"count": 7}).encode(), b"application/json"
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: "
                    + kind
                    + b"\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                answered += 1

    def close(self) -> None:
        self.sock.close()
