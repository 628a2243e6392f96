"""The script starts a child process (with a secret on its command line) and never waits for it:
it outlives the script (DDP816, an error naming its pid, its redacted command line and the line
that started it); ddp-doctor ends it."""
import subprocess
import sys

subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "--password=hunter2"])
print("script done", flush=True)
