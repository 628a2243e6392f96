"""One process that forks a copy of itself and leaves it running (a bare os.fork(), no exec): the
copy holds everything the process had when it forked. Its pid is written to $LEFTOVER_DIR/fork.pid.
The script itself ends well."""
import os
import signal

pid = os.fork()
if pid == 0:
    signal.pause()  # the copy stays behind until a signal ends it (ddp-doctor's cleanup, or the test's)
    os._exit(0)
with open(os.path.join(os.environ["LEFTOVER_DIR"], "fork.pid"), "w") as f:
    f.write(str(pid))
