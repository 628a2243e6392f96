"""Runs a training script under plain mpirun as a team's own launch script does: torch's variables
from Open MPI's (RANK from OMPI_COMM_WORLD_RANK, ...), MASTER_ADDR on this host, MASTER_PORT as
given; then the script as `python SCRIPT` would."""
import os
import runpy
import sys

os.environ.update(RANK=os.environ["OMPI_COMM_WORLD_RANK"], WORLD_SIZE=os.environ["OMPI_COMM_WORLD_SIZE"],
                  LOCAL_RANK=os.environ["OMPI_COMM_WORLD_LOCAL_RANK"], MASTER_ADDR="127.0.0.1")
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
