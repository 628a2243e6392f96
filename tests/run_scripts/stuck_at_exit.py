"""The script ends, but a non-daemon thread keeps the process from exiting."""
import threading
import time

threading.Thread(target=time.sleep, args=(600,)).start()
print("script done", flush=True)
