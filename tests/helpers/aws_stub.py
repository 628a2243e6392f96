"""A loopback HTTP server standing in for an AWS endpoint where moto lacks what a test needs (a
quota, an error code, a throttle): unchanged boto3 talks to it through its endpoint variables."""
from __future__ import annotations

import http.server
import threading
from typing import Any, Callable


class Stub:
    """A loopback HTTP server answering with `respond(handler, body) -> (status, headers, body)`."""

    def __init__(self, respond: Callable[[Any, bytes], tuple[int, dict[str, str], bytes]]) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # answers boto3's Expect: 100-continue at once

            def _handle(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                stub.requests.append((self.command, self.path, dict(self.headers)))
                status, headers, out = respond(self, body)
                self.send_response(status)
                for k, v in {**headers, "Content-Length": str(len(out))}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_HEAD = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
