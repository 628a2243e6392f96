"""Leaves a marker file: proves whether the script ran at all."""
import os
import sys

with open(os.path.join(os.environ["MARKER_DIR"], f"ran-{os.environ.get('RANK', '0')}"), "w") as f:
    f.write(" ".join(sys.argv))
print("script ran", sys.argv[1:])
