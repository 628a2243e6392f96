"""DDP834: a rank variable read from the environment of a process started without a launcher."""
import os

local_rank = int(os.environ["LOCAL_RANK"])
