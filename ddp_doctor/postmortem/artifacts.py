"""What the post-mortem has read (Artifacts) and where each line of a text goes (Source, route,
feed): a rank's output, or the launcher's own lines. inputs.py reads small files line by line
through feed, large_text.py scans large ones and reads their edges and windows through it."""
from __future__ import annotations

from dataclasses import dataclass, field

from ddp_doctor.postmortem.launcher_text import ErrorFile, LauncherText
from ddp_doctor.postmortem.log_lines import Line, split_prefix
from ddp_doctor.postmortem.rank_text import RankText


@dataclass
class Artifacts:
    """Everything read. `texts`: global rank -> its output; `local_texts`: (node, local rank) ->
    output whose global rank no line named yet; `local_to_rank`: what the lines with both
    prefixes said; `error_files` by global rank or by (node, local rank)."""

    texts: dict[int, RankText] = field(default_factory=dict)
    local_texts: dict[tuple[str, int], RankText] = field(default_factory=dict)
    local_to_rank: dict[tuple[str, int], int] = field(default_factory=dict)
    launcher: LauncherText = field(default_factory=LauncherText)
    error_files: dict[object, ErrorFile] = field(default_factory=dict)
    ledgers: dict[int, dict] = field(default_factory=dict)
    read: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    mtimes: dict[str, float] = field(default_factory=dict)
    seq: int = 0
    backends: dict[str, int] = field(default_factory=dict)  # "nccl"/"gloo" -> ranks' lines that name it
    job: str | None = None  # the run id of torchrun's trees read
    jobs_left: list[str] = field(default_factory=list)  # other run ids among the inputs, not read
    consoles_left: list[str] = field(default_factory=list)  # consoles of other jobs, not read (console_jobs.py)
    consoles_read: list[str] = field(default_factory=list)  # the consoles read, when some were left out
    attempts: int = 1  # torchelastic's attempts of the job (restarts + 1); the last one was read
    nccl_lines: list[str] = field(default_factory=list)  # NCCL's INFO/WARN lines (its set-up: the network)
    scanned: list[tuple[str, bool]] = field(default_factory=list)  # large consoles scanned: (path, srun-labelled)
    lone: list[str] = field(default_factory=list)  # consoles of one process (no rank prefix, no launcher summary)
    stage: str | None = None  # what the analysis is doing now ("reading logs/rank1.log"): an interrupted one says it

    def backend(self) -> str | None:
        """The backend the ranks' lines name most (NCCL's INFO lines, gloo's transport errors)."""
        return max(self.backends, key=lambda b: self.backends[b]) if self.backends else None

    def rank_text(self, rank: int) -> RankText:
        return self.texts.setdefault(rank, RankText())

    def printed_in_scanned(self, rank: int) -> bool:
        """Whether a large console (scanned, not read line by line) holds a line of `rank`: the
        scan sees only its edges and its errors, so a rank absent from them is looked for by its
        prefixes before it is said to have printed nothing."""
        import mmap
        tokens = [f"[rank{rank}]:".encode(), f",{rank}]<std".encode(), f"mpirank:{rank},".encode()]
        for path, labelled in self.scanned:
            try:
                with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    for token in tokens + ([f"\n{rank}: ".encode()] if labelled else []):
                        if mm.find(token) >= 0:
                            return True
            except (OSError, ValueError):
                continue
        return False


@dataclass
class Source:
    """One text file as it is read: whose lines without a rank prefix are."""

    path: str
    node: str  # torchrun's run directory for a file of its tree, else the file
    kind: str  # "local" (torchrun's tree), "rank" (a rank's own file), "console"
    own_local: int | None = None
    own_rank: int | None = None
    labelled: bool = False
    host: str | None = None  # a file named after its host (a SageMaker host's stream: algo-2.log)
    texts: dict[tuple, RankText] = field(default_factory=dict)  # this file's share of each rank's output

    def text(self, key: tuple) -> RankText:
        return self.texts.setdefault(key, RankText())


def route(art: Artifacts, src: Source, raw: str) -> tuple[tuple | None, Line]:
    """Whose line it is: ("rank", R), ("local", node, L), or None for the launcher's own line."""
    line = split_prefix(raw, srun_labelled=src.labelled)
    local = line.local_rank if line.local_rank is not None else src.own_local
    if line.rank is not None:
        if local is not None:
            art.local_to_rank[(src.node, local)] = line.rank
        return ("rank", line.rank), line
    if local is not None:
        return ("local", src.node, local), line
    if src.own_rank is not None:
        return ("rank", src.own_rank), line
    return None, line


def feed(art: Artifacts, src: Source, raw: str, seq: int) -> tuple | None:
    """One line read in order: to its rank's output, or to the launcher's lines of a console."""
    key, line = route(art, src, raw)
    if "NCCL" in line.text:
        note_nccl_line(art, line.text)
    if key is not None:  # the ranks' lines name their backend (a launcher's command line names any)
        if "NCCL" in line.text:
            art.backends["nccl"] = art.backends.get("nccl", 0) + 1
        elif "gloo" in line.text:
            art.backends["gloo"] = art.backends.get("gloo", 0) + 1
    if key is None:
        if src.kind == "console":
            art.launcher.feed(line.text)
            src.text(LOOSE).feed(line.text, seq)  # a lone process's, if no line of the file names a rank
        return None
    t = src.text(key)
    if line.host or src.host:
        t.hosts.add(line.host or src.host)
    t.feed(line.text, seq)
    return key


MAX_NCCL_LINES = 4000
# a console's lines without a rank prefix: the launcher's, or those of a lone process (`python
# train.py`, a torch.multiprocessing.spawn parent) when no line of the file names a rank
LOOSE = ("loose",)


def note_nccl_line(art: Artifacts, text: str) -> None:
    """Keep NCCL's own set-up lines (which network it chose, its plugin's warnings), bounded."""
    if ("NCCL INFO" in text or "NCCL WARN" in text) and len(art.nccl_lines) < MAX_NCCL_LINES:
        art.nccl_lines.append(text)
