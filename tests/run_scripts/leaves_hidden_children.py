"""A correct 2-rank job whose rank 1 leaves two processes running: a daemon that double-forks,
calls setsid and execs /bin/sleep with an empty environment (no tree, session, group or mark of
ddp-doctor's leads to it), and a plain child with `--password=<secret>` on its command line. Each
one's pid is written to $LEFTOVER_DIR (daemon.pid, secret.pid) before rank 1 ends."""
import os
import subprocess
import sys

import torch.distributed as dist

dist.init_process_group("gloo")
d = os.environ["LEFTOVER_DIR"]
if dist.get_rank() == 1:
    r, w = os.pipe()
    if os.fork() == 0:  # the daemon: fork, setsid, fork, exec with nothing of the rank's environment
        os.close(r)
        os.setsid()
        if os.fork():
            os._exit(0)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        os.execve("/bin/sleep", ["sleep", "600"], {})
    os.close(w)
    with os.fdopen(r) as f:
        daemon = f.read()  # bounded: the grandchild writes its pid, then exec closes the pipe
    os.wait()  # the first child, which exited at once
    with open(os.path.join(d, "daemon.pid"), "w") as f:
        f.write(daemon)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "--password=hunter2secret"])
    with open(os.path.join(d, "secret.pid"), "w") as f:
        f.write(str(child.pid))
dist.barrier()
dist.destroy_process_group()
