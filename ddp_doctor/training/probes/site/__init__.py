"""Directory put on PYTHONPATH for child interpreters; see sitecustomize.py."""
