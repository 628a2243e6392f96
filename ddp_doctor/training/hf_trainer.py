"""A real Hugging Face Trainer DDP entrypoint that follows SageMaker's conventions.

Run it as one process, under torchrun, under ``ddp-doctor run`` or as a SageMaker entry point::

    python -m ddp_doctor.training.hf_trainer
    torchrun --standalone --nproc-per-node 2 -m ddp_doctor.training.hf_trainer --max-steps 10
    ddp-doctor run --nproc-per-node 2 -m ddp_doctor.training.hf_trainer

SageMaker conventions:

* hyperparameters arrive as command-line arguments (``--epochs 3 --learning-rate 5e-4``); both the
  dashed and the underscored spelling are accepted (``--max-steps`` / ``--max_steps``), and unknown
  arguments are reported and ignored, as SageMaker passes every hyperparameter of the estimator;
* training data come from the ``train`` channel (``$SM_CHANNEL_TRAIN``, or ``--train-dir``); without
  one a deterministic synthetic data set is made in code;
* the model is saved to ``$SM_MODEL_DIR`` (``--model-dir``, default ``./model``), by rank 0 only;
* metrics go to ``$SM_OUTPUT_DATA_DIR/metrics.json`` (``--output-data-dir``, default ``./output``).

Data format of the train channel: JSON lines, in every ``*.jsonl`` / ``*.json`` file of the directory
(sorted by name; a path to one file works too), one example a line::

    {"input_ids": [5, 17, 42, 8], "label": 1}

``input_ids`` are token ids (non-negative ints), truncated or padded with 0 to ``--seq-len``;
``label`` is a class index. The vocabulary and the number of labels grow to fit the data.

The model is a tiny BERT sequence classifier built from a config, so nothing is downloaded from a model
hub (``HF_HUB_OFFLINE=1`` is fine). On machines without CUDA the Trainer runs on CPU over gloo.
The Trainer initialises the process group itself when a launcher set LOCAL_RANK.

``ddp_doctor.training.DoctorCallback`` is added to the Trainer's callbacks (``--no-doctor-callback``
leaves it out): it checks sampler sharding, parameter consistency and data-loading stragglers while
the job trains.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

PAD_ID = 0


def _env_default(name: str, fallback: str | None) -> str | None:
    value = os.environ.get(name)
    return value if value else fallback


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ddp_doctor.training.hf_trainer",
        description="Tiny Hugging Face Trainer DDP job (SageMaker conventions; CPU/gloo or GPU/nccl).")

    def add(name: str, **kw: Any) -> None:
        # SageMaker users write hyperparameters both ways: --max-steps and --max_steps.
        names = [name]
        if "-" in name[2:]:
            names.append("--" + name[2:].replace("-", "_"))
        p.add_argument(*names, **kw)

    add("--epochs", type=float, default=1.0, help="training epochs (used when --max-steps <= 0)")
    add("--per-device-train-batch-size", type=int, default=8)
    add("--learning-rate", type=float, default=5e-4)
    add("--max-steps", type=int, default=10, help="optimizer steps; <= 0 trains for --epochs")
    add("--seed", type=int, default=42)
    add("--model-dir", default=_env_default("SM_MODEL_DIR", "./model"),
        help="where rank 0 saves the model (default $SM_MODEL_DIR or ./model)")
    add("--output-data-dir", default=_env_default("SM_OUTPUT_DATA_DIR", "./output"),
        help="where metrics.json goes (default $SM_OUTPUT_DATA_DIR or ./output)")
    add("--train-dir", default=_env_default("SM_CHANNEL_TRAIN", None),
        help="JSON-lines training data (default $SM_CHANNEL_TRAIN; synthetic data when unset)")
    add("--num-samples", type=int, default=256, help="size of the synthetic data set")
    add("--seq-len", type=int, default=16, help="tokens per example (truncate / pad)")
    add("--vocab-size", type=int, default=128, help="minimum vocabulary size of the tiny model")
    add("--logging-steps", type=int, default=5)
    add("--eval-strategy", choices=("no", "epoch", "steps"), default="no",
        help="evaluate on a held-out synthetic set every epoch or every --eval-steps (default: no)")
    add("--eval-steps", type=int, default=5)
    add("--ddp-timeout", type=int, default=600, help="process group timeout, seconds (Trainer default 1800)")
    add("--no-doctor-callback", action="store_true", help="do not add ddp_doctor's TrainerCallback")
    return p


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    return build_parser().parse_known_args(argv)


class TokenDataset(torch.utils.data.Dataset):
    """Map-style data set of fixed-length token sequences with a class label."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor):
        self.input_ids, self.attention_mask, self.labels = input_ids, attention_mask, labels

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[i], "attention_mask": self.attention_mask[i],
                "labels": self.labels[i]}

    @property
    def vocab_needed(self) -> int:
        return int(self.input_ids.max().item()) + 1 if len(self) else 1

    @property
    def num_labels(self) -> int:
        return max(2, int(self.labels.max().item()) + 1) if len(self) else 2


def synthetic_dataset(num_samples: int, seq_len: int, vocab_size: int, seed: int) -> TokenDataset:
    """Deterministic and learnable: the label is whether the first token is in the upper half."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (num_samples, seq_len), generator=g)
    labels = (ids[:, 0] >= vocab_size // 2).long()
    return TokenDataset(ids, torch.ones_like(ids), labels)


def _data_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"training data not found: {path} (SM_CHANNEL_TRAIN / --train-dir)")
    files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in (".jsonl", ".json"))
    if not files:
        raise FileNotFoundError(f"no *.jsonl or *.json files in {path} (SM_CHANNEL_TRAIN / --train-dir)")
    return files


def load_jsonl_dataset(path: str | os.PathLike[str], seq_len: int) -> TokenDataset:
    """Read {"input_ids": [...], "label": n} lines; truncate/pad input_ids to seq_len."""
    rows_ids: list[list[int]] = []
    rows_mask: list[list[int]] = []
    labels: list[int] = []
    for f in _data_files(Path(path)):
        with open(f, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                where = f"{f}:{lineno}"
                try:
                    row = json.loads(line)
                    ids = [int(t) for t in row["input_ids"]][:seq_len]
                    label = int(row["label"])
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(f'{where}: expected {{"input_ids": [ints], "label": int}}: {e}') from e
                if not ids or min(ids) < 0 or label < 0:
                    raise ValueError(f"{where}: input_ids must be non-empty, ids and label non-negative")
                pad = seq_len - len(ids)
                rows_ids.append(ids + [PAD_ID] * pad)
                rows_mask.append([1] * len(ids) + [0] * pad)
                labels.append(label)
    if not labels:
        raise ValueError(f"no examples in {path}")
    return TokenDataset(torch.tensor(rows_ids), torch.tensor(rows_mask), torch.tensor(labels))


def build_model(vocab_size: int, num_labels: int, seq_len: int) -> Any:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=max(64, seq_len),
                        num_labels=num_labels, pad_token_id=PAD_ID)
    model = BertForSequenceClassification(config)
    # Its forward takes **kwargs, so the Trainer assumes the loss is normalised by num_items_in_batch summed
    # over ranks and multiplies it by the world size (average_tokens_across_devices). This classifier
    # takes a plain mean, so without this the logged loss, and the gradients, are world_size times too
    # large (2 x ln 2 = 1.386 instead of 0.693 on two ranks). `accepts_loss_kwargs = False` is the flag
    # transformers' own models use to say so.
    model.accepts_loss_kwargs = False
    return model


def doctor_callbacks(disabled: bool) -> list[Any]:
    if disabled:
        return []
    try:
        from ddp_doctor.training.callback import DoctorCallback
    except ImportError:  # transformers without ddp-doctor's callback module: train without it
        return []
    return [DoctorCallback()]


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def main(argv: Sequence[str] | None = None) -> int:
    args, unknown = parse_args(argv)
    rank0_env = os.environ.get("RANK", "0") == "0"
    if unknown and rank0_env:
        print(f"hf_trainer: ignoring unknown arguments {unknown}", file=sys.stderr)

    from transformers import Trainer, TrainingArguments, set_seed

    started = time.monotonic()
    set_seed(args.seed)
    if args.train_dir:
        train = load_jsonl_dataset(args.train_dir, args.seq_len)
        source = f"{args.train_dir}"
    else:
        train = synthetic_dataset(args.num_samples, args.seq_len, args.vocab_size, args.seed)
        source = "synthetic"
    model = build_model(max(args.vocab_size, train.vocab_needed), train.num_labels, args.seq_len)

    cuda = torch.cuda.is_available()
    # Launched by torchrun / ddp-doctor run / SageMaker: the Trainer (through accelerate) creates the
    # process group. On CPU name gloo explicitly (accelerate would pick mpi where torch has it); in a
    # single process leave the backend unset, or accelerate tries to initialise a group without a launcher.
    launched = int(os.environ.get("LOCAL_RANK", "-1")) != -1 or int(os.environ.get("WORLD_SIZE", "1")) > 1
    output_dir = Path(args.output_data_dir)
    training_args = TrainingArguments(
        output_dir=str(output_dir),
        num_train_epochs=args.epochs,
        max_steps=args.max_steps if args.max_steps > 0 else -1,
        per_device_train_batch_size=args.per_device_train_batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
        logging_steps=max(1, args.logging_steps),
        save_strategy="no",
        eval_strategy=args.eval_strategy,
        eval_steps=max(1, args.eval_steps),
        per_device_eval_batch_size=args.per_device_train_batch_size,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=not cuda,
        ddp_backend="gloo" if launched and not cuda else None,  # None: nccl on GPUs
        ddp_timeout=args.ddp_timeout,
        ddp_find_unused_parameters=False,  # every parameter is used; True costs a graph traversal a step
    )
    held_out = (synthetic_dataset(max(16, args.num_samples // 4), args.seq_len, args.vocab_size, args.seed + 1)
                if args.eval_strategy != "no" else None)
    trainer = Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=held_out,
                      callbacks=doctor_callbacks(args.no_doctor_callback))
    result = trainer.train()
    trainer.save_model(args.model_dir)  # rank 0 writes; every rank must call it

    rank, world_size = _world()
    loss = float(result.training_loss)
    metrics = {
        "train_loss": loss,
        "global_step": int(result.global_step),
        "world_size": world_size,
        "train_samples": len(train),
        "data": source,
        "seconds": round(time.monotonic() - started, 3),
        **{k: v for k, v in result.metrics.items() if isinstance(v, (int, float))},
        "evaluations": sum(1 for entry in trainer.state.log_history if "eval_loss" in entry),
    }
    is_main = trainer.is_world_process_zero()
    if is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        with open(output_dir / "metrics.json", "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2, sort_keys=True)
    _teardown()  # every rank reaches this barrier before rank 0 says it is done
    if is_main:
        print(f"hf_trainer: done train_loss={loss:.4f} steps={result.global_step} world_size={world_size} "
              f"data={source} model_dir={args.model_dir} seconds={metrics['seconds']}", flush=True)
    if not math.isfinite(loss):
        print(f"hf_trainer: rank {rank}: training loss is not finite ({loss})", file=sys.stderr)
        return 1
    return 0


def _teardown() -> None:
    """Destroy the process group the Trainer created (it leaves it up), after a last barrier."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    # The process group is destroyed and every file is written: end without interpreter teardown,
    # where torch 2.13's gloo sometimes aborts or hangs after a correct destroy_process_group
    # (docs/facts.md, "The gloo teardown abort").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
