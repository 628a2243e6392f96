"""Launching and watching processes: what `ddp-doctor preflight`'s local launch, `ddp-doctor run`
(its parent, its launcher and each rank) and the pytest plugin share.

    stop_signals  SIGTERM/SIGINT/SIGHUP taken by a parent that must report them (SignalCatcher)
    tree          a child that dies with its parent, orphans adopted, a launched tree ended whole
    launch_dir    the files the preflight's ranks leave for their parent, merged into one report
    store         the bounded client of torch's TCPStore
    progress      whether progress lines print, and the words they share
"""
