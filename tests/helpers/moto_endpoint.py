"""moto's server on loopback, for the tests that talk to AWS through unchanged boto3 (the endpoint
goes in AWS_ENDPOINT_URL). Needs moto's server extra: callers importorskip it first."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def moto_endpoint() -> Iterator[str]:
    """moto's server on a free loopback port, its URL yielded, stopped afterwards."""
    from moto import server as moto_server
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)  # moto logs each request
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
