"""Runs a training script as `python SCRIPT` would, inside torchelastic's @record: on an uncaught
exception the rank writes its error file (TORCHELASTIC_ERROR_FILE, error.json in torchrun's log
tree), as an entrypoint decorated with @record does."""
import runpy
import sys

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
