"""One process that works until the test stops it (bounded at 120 s, then it ends well)."""
import time

deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    time.sleep(0.02)
