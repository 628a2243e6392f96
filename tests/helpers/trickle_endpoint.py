"""A loopback AWS endpoint that answers a byte at a time, for the tests of a whole call's deadline:
botocore's read timeout is a wait for the next byte, so an answer that trickles in never trips
it. Unchanged boto3 reaches it through AWS_ENDPOINT_URL (or endpoint_url) and fake credentials."""
from __future__ import annotations

import http.server
import os
import threading
from typing import Any, Callable

# (status, headers, body, slow): a slow answer trickles, the others go at once
Answer = tuple[int, dict[str, str], bytes, bool]


def slow_ok(method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
    """Every request answered 200 slowly (with a body that is no real answer: it never ends in time)."""
    return 200, {"Content-Type": "application/xml", "ETag": '"0"'}, b"<trickle>" + b"." * 200 + b"</trickle>", True


class TrickleEndpoint:
    """Answers each request with `respond(method, path, headers, body)`. A slow answer sends its
    headers at once and then its body one byte every `every` seconds (an answer without a body
    is sent whole that way, headers included), until it is done or close() is called.
    `requests` holds (method, path, headers) of each request; `trickling` is set once a slow
    answer has begun (the caller is waiting inside its call)."""

    def __init__(self, respond: Callable[[str, str, dict[str, str], bytes], Answer] = slow_ok,
                 every: float = 1.0) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.trickling = threading.Event()
        self.closed = threading.Event()
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # answers boto3's Expect: 100-continue at once

            def _handle(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                endpoint.requests.append((self.command, self.path, dict(self.headers)))
                status, headers, out, slow = respond(self.command, self.path, dict(self.headers), body)
                head = [f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}"]
                head += [f"{k}: {v}" for k, v in {**headers, "Content-Length": str(len(out))}.items()]
                raw_head = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
                if not slow:
                    self.wfile.write(raw_head + out)
                    return
                endpoint.trickling.set()
                if out:
                    self.wfile.write(raw_head)
                for byte in out or raw_head:
                    if endpoint.closed.wait(every):
                        self.close_connection = True
                        return
                    try:
                        self.wfile.write(bytes([byte]))
                    except OSError:
                        return

            do_GET = do_POST = do_PUT = do_HEAD = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        """boto3 pointed here with fake credentials, nothing of the user's AWS configuration."""
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "AKIAFAKEFAKEFAKE1234",
                "AWS_SECRET_ACCESS_KEY": "fake-secret-for-tests", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull}

    def close(self) -> None:
        """Ends every answer still trickling, then the server."""
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()


def in_thread(fn: Callable[[], Any], name: str = "test-bounded-call") -> tuple[threading.Thread, dict[str, Any]]:
    """fn() started in a daemon thread; the dict gets its value ("value") or exception ("error")."""
    got: dict[str, Any] = {}

    def target() -> None:
        try:
            got["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            got["error"] = e

    t = threading.Thread(target=target, name=name, daemon=True)
    t.start()
    return t, got
