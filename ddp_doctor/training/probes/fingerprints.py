"""Fingerprints the probes take: of the samples in a batch (to tell whether two ranks drew the same
data) and of a model's tensors (to tell whether replicas drifted). Cheap by construction: a batch's
rows are read through a strided sample, tensor sums are copied back once per device."""
from __future__ import annotations

import hashlib
from typing import Any

ROW_ELEMENTS = 1024      # elements of a sample that its fingerprint reads, at most


def _leaves(batch: Any, out: list[Any], depth: int = 0) -> None:
    import torch
    if depth > 4:
        return
    if isinstance(batch, torch.Tensor):
        out.append(batch)
    elif isinstance(batch, dict) or hasattr(batch, "items") and callable(batch.items):
        for k in sorted(batch.keys(), key=str):
            _leaves(batch[k], out, depth + 1)
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            _leaves(b, out, depth + 1)


def sample_hashes(batch: Any, n: int | None) -> list[str] | None:
    """One short fingerprint per sample of a collated batch (rows of every CPU tensor whose first
    dimension is the batch size), or None when the batch does not split that way."""
    import torch
    leaves: list[Any] = []
    _leaves(batch, leaves)
    rows = []
    for t in leaves:
        if t.device.type != "cpu" or t.dim() == 0 or t.is_complex() or (n is not None and t.shape[0] != n):
            continue
        n = t.shape[0]
        x = t.detach().reshape(n, -1)
        if x.shape[1] > ROW_ELEMENTS:  # an image batch: a strided sample of each row is enough
            x = x[:, :: -(-x.shape[1] // ROW_ELEMENTS)]
        x = x.to(torch.float64)
        w = torch.arange(1, x.shape[1] + 1, dtype=torch.float64)
        rows.append(torch.stack([x.sum(1), (x * w).sum(1)], 1))
    if not rows or not n:
        return None
    sig = torch.cat(rows, 1).tolist()
    return [hashlib.blake2b(repr(r).encode(), digest_size=6).hexdigest() for r in sig]


def as_indices(idx: Any) -> list[int] | None:
    try:
        if isinstance(idx, (list, tuple)):
            return [int(i) for i in idx]
        return [int(idx)]
    except (TypeError, ValueError):
        return None  # an IterableDataset's placeholder, or keys that are not integers


def tensor_sums(entries: list[tuple[str, Any, str]]) -> dict[str, Any]:
    """Per tensor: float64 sum and sum of absolute values, computed on the tensor's device and
    copied back once per device (one synchronisation, not one per tensor)."""
    import torch
    names, kinds, by_device = [], [], {}
    for name, t, kind in entries:
        if t.is_complex() or t.numel() == 0:
            continue
        names.append(name)
        kinds.append(kind)
        d = t.detach()
        by_device.setdefault(d.device, []).append((len(names) - 1, d.sum(dtype=torch.float64),
                                                  d.abs().sum(dtype=torch.float64)
                                                  if d.dtype != torch.bool else d.sum(dtype=torch.float64)))
    sums = [0.0] * len(names)
    abss = [0.0] * len(names)
    for _, items in by_device.items():
        vals = torch.stack([torch.stack([s, a]) for _, s, a in items]).cpu().tolist()
        for (j, _, _), (s, a) in zip(items, vals):
            sums[j], abss[j] = s, a
    return {"names": names, "kinds": kinds, "sum": sums, "abs": abss}
