"""From findings to a report and out: merge and root cause, text rendering, redaction, and the
sinks (JSON file, SageMaker failure file, torchelastic error file, S3)."""
