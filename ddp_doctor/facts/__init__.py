"""What a RankContext is built from: the launcher's variables, SageMaker's files and variables,
the host, NVML. Pure readers: they know nothing of checks, reports or the command line."""
