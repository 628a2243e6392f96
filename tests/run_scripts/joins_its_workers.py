"""The correct pattern: the script stops and joins the non-daemon thread it started (a sentinel on
its queue) and waits for its child process before it ends: the rank exits at once, no finding."""
import queue
import subprocess
import sys
import threading

uploads: queue.Queue = queue.Queue()


def worker():
    while (item := uploads.get()) is not None:
        print("uploaded", item, flush=True)


uploader = threading.Thread(target=worker, name="metrics-uploader")
uploader.start()
child = subprocess.Popen([sys.executable, "-c", "pass", "--password=hunter2"])
uploads.put("loss=0.1")
uploads.put(None)  # the sentinel: the thread ends
uploader.join(timeout=60)
child.wait(timeout=60)
print("script done", flush=True)
