"""The script ends while a non-daemon thread it started ("metrics-uploader") waits on queue.get()
forever: Python's exit waits for that thread, so the rank never exits (DDP806, an error naming the
thread, where it is blocked and the line that started it)."""
import queue
import threading

uploads: queue.Queue = queue.Queue()


def worker():
    while True:
        item = uploads.get()  # blocks here: nothing puts a sentinel
        print("uploaded", item, flush=True)


uploader = threading.Thread(target=worker, name="metrics-uploader")
uploader.start()
print("script done", flush=True)
