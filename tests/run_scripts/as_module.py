"""Run with -m: checks __name__ and sys.argv as `python -m` sets them."""
import sys

if __name__ == "__main__":
    print("module main", sys.argv[0].endswith("as_module.py"), sys.argv[1:])
    sys.stderr.write("to stderr\n")
    sys.exit(5)
