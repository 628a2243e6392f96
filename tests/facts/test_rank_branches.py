"""rank_branches: which rank-conditional branches enclose a line of a training script.

Each script is written the way real ones are (plain torchrun loops, mp.spawn workers, HF Trainer
callbacks, Accelerate, Lightning modules). Lines are found by a `# <tag>` comment at their end, so
the scripts read naturally and stay easy to edit.
"""
from __future__ import annotations

import os
import sys
import textwrap
import threading
import time

import pytest

from ddp_doctor.facts.rank_branches import RankBranch, rank_branches, rank_branches_of_file


def _script(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def at(source: str, tag: str) -> int:
    """The 1-based line that ends with `# tag`."""
    hits = [i for i, text in enumerate(source.splitlines(), 1) if text.rstrip().endswith(f"# {tag}")]
    assert len(hits) == 1, (tag, hits)
    return hits[0]


def branches(source: str, tag: str) -> list[RankBranch]:
    return rank_branches(source, at(source, tag))


# --- plain torchrun loops ---------------------------------------------------------------------

TORCHRUN = _script("""
    import os
    import torch
    import torch.distributed as dist

    def train(model, loader, epochs):
        dist.init_process_group("nccl")
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                loss = model(batch).sum()
                loss.backward()
                if dist.get_rank() == 0:  # if-rank0
                    dist.all_reduce(loss)  # in-body
                    print("loss", loss.item())
                else:
                    dist.barrier()  # in-else
                dist.all_reduce(loss)  # after-if
                if step % 10 == 0:
                    dist.barrier()  # step-mod
    """)


def test_the_body_of_an_if_on_get_rank_is_taken_when_true() -> None:
    assert branches(TORCHRUN, "in-body") == [
        RankBranch(line=at(TORCHRUN, "if-rank0"), condition="dist.get_rank() == 0", taken_when="true",
                   reads="get_rank()")]


def test_the_else_branch_is_taken_when_false() -> None:
    assert branches(TORCHRUN, "in-else") == [
        RankBranch(at(TORCHRUN, "if-rank0"), "dist.get_rank() == 0", "false", "get_rank()")]


def test_a_line_after_the_if_block_at_the_same_level_is_not_conditional() -> None:
    assert branches(TORCHRUN, "after-if") == []


def test_the_if_line_itself_is_not_inside_the_branch() -> None:
    assert branches(TORCHRUN, "if-rank0") == []


def test_step_modulo_is_not_rank_conditional() -> None:
    assert branches(TORCHRUN, "step-mod") == []


@pytest.mark.parametrize("condition,reads", [
    ("torch.distributed.get_rank() == 0", "get_rank()"),
    ("get_rank() != 0", "get_rank()"),
    ("dist.get_rank(group=pg) in (0, 1)", "get_rank()"),
    ("comm.Get_rank() == 0", "Get_rank()"),
    ("dist.get_global_rank(pg, 0) == me", "get_global_rank()"),
    ("utils.get_local_rank() == 0", "get_local_rank()"),
    ("trainer.is_world_process_zero()", "is_world_process_zero()"),
    ("is_main_process()", "is_main_process()"),
    ("not is_rank_zero()", "is_rank_zero()"),
    ("rank_zero_only.rank == 0", "rank"),
    ("args.local_rank in [-1, 0]", "local_rank"),
    ("self.global_rank == 0", "global_rank"),
    ("accelerator.is_main_process", "is_main_process"),
    ("accelerator.is_local_main_process", "is_local_main_process"),
    ("state.process_index == 0", "process_index"),
    ("accelerator.local_process_index == 0", "local_process_index"),
    ("cfg.node_rank > 0", "node_rank"),
    ("rank_id == 0", "rank_id"),
    ("self.trainer.strategy.rank0_only", "rank0_only"),
    ("LOCAL_RANK == 0", "LOCAL_RANK"),
    ("RANK == 0", "RANK"),
    ("localRank == 0", "localRank"),
    ('os.environ["RANK"] == "0"', "RANK"),
    ('os.environ.get("LOCAL_RANK", "0") == "0"', "LOCAL_RANK"),
    ('int(os.getenv("RANK", 0)) == 0', "RANK"),
    ('int(os.environ["SLURM_PROCID"]) == 0', "SLURM_PROCID"),
    ('os.environ["OMPI_COMM_WORLD_RANK"] == "0"', "OMPI_COMM_WORLD_RANK"),
    ('os.environ.get("SMDATAPARALLEL_RANK") == "0"', "SMDATAPARALLEL_RANK"),
    ("step % 2 == 0 or dist.get_rank() == 1", "get_rank()"),
    ("rank == 0 and epoch > 0", "rank"),
])
def test_what_counts_as_reading_the_rank(condition: str, reads: str) -> None:
    source = _script(f"""
        def log(step, epoch, trainer, state, args, cfg, accelerator, comm, pg, me, rank_id):
            if {condition}:  # test
                dist.all_reduce(x)  # body
        """)
    assert branches(source, "body") == [RankBranch(at(source, "test"), condition, "true", reads)]


@pytest.mark.parametrize("condition", [
    "world_size > 1",
    "dist.get_world_size() > 1",
    "epoch == 0",
    "step % 10 == 0",
    "torch.cuda.is_available()",
    "dist.is_initialized()",
    '"RANK" in os.environ',  # launched by torchrun: the same on every rank
    "self.lora_rank > 0",  # a LoRA adapter's rank
    "torch.linalg.matrix_rank(w) < n",
    "len(ranks) > 1",
    "src_rank == 0",  # the sender's rank: every process knows it alike
    "rank_metadata is None",
])
def test_conditions_that_do_not_read_the_rank(condition: str) -> None:
    source = _script(f"""
        def step_fn(self, step, epoch, world_size, w, n, ranks, src_rank, rank_metadata):
            if {condition}:
                dist.all_reduce(x)  # body
        """)
    assert branches(source, "body") == []


def test_an_elif_chain_reports_every_rank_reading_test_innermost_first() -> None:
    source = _script("""
        rank = dist.get_rank()
        if rank == 0:  # first
            dist.broadcast(t, 0)
        elif rank == 1:  # second
            dist.all_reduce(t)  # elif-body
        elif epoch > 3:  # third
            dist.barrier()  # third-body
        else:
            dist.all_gather(out, t)  # else-body
        """)
    first, second = at(source, "first"), at(source, "second")
    assert branches(source, "elif-body") == [RankBranch(second, "rank == 1", "true", "rank"),
                                             RankBranch(first, "rank == 0", "false", "rank")]
    # The epoch test is not the rank's: only the two rank tests before it are reported.
    assert branches(source, "third-body") == [RankBranch(second, "rank == 1", "false", "rank"),
                                              RankBranch(first, "rank == 0", "false", "rank")]
    assert branches(source, "else-body") == branches(source, "third-body")


def test_nested_branches_come_innermost_first() -> None:
    source = _script("""
        local_rank = int(os.environ["LOCAL_RANK"])
        for epoch in range(3):
            if local_rank == 0:  # outer
                if epoch % 2 == 0:
                    if dist.get_rank() % 8 == 0:  # inner
                        dist.barrier()  # deep
        """)
    assert branches(source, "deep") == [
        RankBranch(at(source, "inner"), "dist.get_rank() % 8 == 0", "true", "get_rank()"),
        RankBranch(at(source, "outer"), "local_rank == 0", "true", "local_rank")]


# --- variables computed from the rank --------------------------------------------------------

def test_a_variable_computed_from_the_rank_transitively() -> None:
    source = _script("""
        import os
        ddp_rank = int(os.environ["RANK"])
        master_process = ddp_rank == 0
        seed_offset = ddp_rank

        def evaluate():
            leader = master_process and not eval_only
            if leader:  # test
                dist.all_reduce(metric)  # body
        """)
    assert branches(source, "body") == [RankBranch(at(source, "test"), "leader", "true", "leader")]


def test_tuple_and_augmented_assignments() -> None:
    source = _script("""
        def run():
            me, ws = dist.get_rank(), dist.get_world_size()
            turn = 0
            turn += me
            if ws > 1:
                dist.barrier()  # world-size
            if turn % 2:  # aug
                dist.all_reduce(t)  # aug-body
            if me == 0:  # tuple
                dist.broadcast(t, 0)  # tuple-body
        """)
    assert branches(source, "world-size") == []
    assert branches(source, "aug-body") == [RankBranch(at(source, "aug"), "turn % 2", "true", "turn")]
    assert branches(source, "tuple-body") == [RankBranch(at(source, "tuple"), "me == 0", "true", "me")]


def test_a_global_set_in_one_function_and_read_in_another() -> None:
    source = _script("""
        is_leader = False

        def setup():
            global is_leader
            dist.init_process_group("nccl")
            is_leader = dist.get_rank() == 0

        def save(model):
            if is_leader:  # test
                dist.barrier()  # body
        """)
    assert branches(source, "body") == [RankBranch(at(source, "test"), "is_leader", "true", "is_leader")]


def test_a_parameter_shadows_a_module_variable_of_the_same_name() -> None:
    source = _script("""
        leader = dist.get_rank() == 0

        def save(model, leader):
            if leader:
                dist.barrier()  # body
        """)
    assert branches(source, "body") == []


def test_a_device_built_from_the_local_rank_is_not_the_rank() -> None:
    source = _script("""
        local_rank = int(os.environ["LOCAL_RANK"])
        device = torch.device("cuda", local_rank)
        model = DDP(model.to(device), device_ids=[local_rank])
        if device.type == "cuda":
            dist.barrier()  # device
        if model.training:
            dist.barrier()  # model
        """)
    assert branches(source, "device") == []
    assert branches(source, "model") == []


def test_an_attribute_set_from_the_rank_in_init_is_read_in_another_method() -> None:
    source = _script("""
        class Trainer:
            def __init__(self, accelerator):
                self.is_main = accelerator.is_main_process
                self.every = 10

            def step(self, i):
                if i % self.every == 0:
                    dist.barrier()  # every
                if self.is_main:  # test
                    dist.all_reduce(self.loss)  # body
        """)
    assert branches(source, "every") == []
    assert branches(source, "body") == [RankBranch(at(source, "test"), "self.is_main", "true", "is_main")]


# --- spawn workers ------------------------------------------------------------------------------

def test_a_spawned_worker_named_rank() -> None:
    source = _script("""
        import torch.multiprocessing as mp

        def worker(rank, world_size):
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            if rank == 0:  # test
                dist.send(t, dst=1)  # body
            if world_size > 2:
                dist.barrier()  # ws

        if __name__ == "__main__":
            mp.spawn(worker, args=(4,), nprocs=4)
        """)
    assert branches(source, "body") == [RankBranch(at(source, "test"), "rank == 0", "true", "rank")]
    assert branches(source, "ws") == []


def test_the_first_parameter_of_a_spawned_function_is_the_rank_whatever_its_name() -> None:
    source = _script("""
        def main_worker(gpu, ngpus_per_node, args):
            if gpu == 0:  # test
                dist.barrier()  # body

        def main_other(gpu, args):
            if gpu == 0:
                dist.barrier()  # not-spawned

        torch.multiprocessing.spawn(main_worker, nprocs=8, args=(8, args))
        """)
    assert branches(source, "body") == [RankBranch(at(source, "test"), "gpu == 0", "true", "gpu")]
    assert branches(source, "not-spawned") == []


# --- HF Trainer callbacks, Accelerate, Lightning ----------------------------------------------

def test_hf_trainer_callback() -> None:
    source = _script("""
        from transformers import TrainerCallback

        class SyncCallback(TrainerCallback):
            def on_epoch_end(self, args, state, control, **kwargs):
                if state.is_world_process_zero:  # test
                    torch.distributed.all_reduce(self.metric)  # body
                return control
        """)
    assert branches(source, "body") == [
        RankBranch(at(source, "test"), "state.is_world_process_zero", "true", "is_world_process_zero")]


def test_lightning_module_on_global_zero() -> None:
    source = _script("""
        import lightning as L

        class LitModel(L.LightningModule):
            def on_validation_epoch_end(self):
                if self.trainer.is_global_zero:  # test
                    self.all_gather(self.preds)  # body
                self.log("val", 1.0, sync_dist=True)  # after
        """)
    assert branches(source, "body") == [
        RankBranch(at(source, "test"), "self.trainer.is_global_zero", "true", "is_global_zero")]
    assert branches(source, "after") == []


def test_rank_zero_only_decorator() -> None:
    source = _script("""
        from lightning.pytorch.utilities import rank_zero_only

        class LitModel(L.LightningModule):
            @rank_zero_only  # deco
            def save_samples(self, batch):
                self.trainer.strategy.barrier()  # body

            def plain(self):
                self.trainer.strategy.barrier()  # plain
        """)
    assert branches(source, "body") == [RankBranch(at(source, "deco"), "@rank_zero_only", "true", "rank_zero_only")]
    assert branches(source, "plain") == []


def test_accelerate_main_process_decorator_and_early_return() -> None:
    source = _script("""
        accelerator = Accelerator()

        @accelerator.on_main_process  # deco
        def push(model):
            accelerator.wait_for_everyone()  # deco-body

        def evaluate(model):
            if not accelerator.is_main_process:  # guard
                return None
            accelerator.reduce(loss)  # after-guard
        """)
    assert branches(source, "deco-body") == [
        RankBranch(at(source, "deco"), "@accelerator.on_main_process", "true", "on_main_process")]
    assert branches(source, "after-guard") == [
        RankBranch(at(source, "guard"), "not accelerator.is_main_process", "false", "is_main_process")]


# --- early exits, loops, conditional expressions -------------------------------------------------

def test_an_early_return_guards_the_rest_of_the_function() -> None:
    source = _script("""
        def save_checkpoint(model, path):
            if dist.get_rank() != 0:  # guard
                return
            torch.save(model.state_dict(), path)
            for shard in shards:
                dist.barrier()  # in-loop

        def load(model):
            dist.barrier()  # other-function
        """)
    guard = RankBranch(at(source, "guard"), "dist.get_rank() != 0", "false", "get_rank()")
    assert branches(source, "in-loop") == [guard]
    assert branches(source, "other-function") == []


def test_continue_raise_and_an_else_that_exits() -> None:
    source = _script("""
        for step, batch in enumerate(loader):
            if rank != 0:  # skip
                continue
            dist.all_reduce(batch)  # after-continue
        if local_rank < 0:  # raise
            raise RuntimeError("not distributed")
        dist.barrier()  # after-raise
        if global_rank == 0:  # keep
            pass
        else:
            sys.exit(0)
        dist.barrier()  # after-exit
        """)
    assert branches(source, "after-continue") == [RankBranch(at(source, "skip"), "rank != 0", "false", "rank")]
    assert branches(source, "after-raise") == [RankBranch(at(source, "raise"), "local_rank < 0", "false", "local_rank")]
    assert branches(source, "after-exit") == [
        RankBranch(at(source, "keep"), "global_rank == 0", "true", "global_rank"),
        RankBranch(at(source, "raise"), "local_rank < 0", "false", "local_rank")]


def test_a_guard_after_the_line_does_not_count() -> None:
    source = _script("""
        def step(rank):
            dist.all_reduce(t)  # before
            if rank != 0:
                return
        """)
    assert branches(source, "before") == []


def test_a_conditional_expression() -> None:
    source = _script("""
        rank = dist.get_rank()
        out = dist.all_reduce(t) if rank == 0 else None  # one-line
        res = (
            dist.broadcast(t, 0)  # multi-body
            if rank % 2 == 0  # multi-test
            else dist.barrier()  # multi-else
        )
        flag = "a" if epoch else "b"  # not-rank
        """)
    assert branches(source, "one-line") == [RankBranch(at(source, "one-line"), "rank == 0", "true", "rank")]
    test = at(source, "multi-test")
    assert branches(source, "multi-body") == [RankBranch(test, "rank % 2 == 0", "true", "rank")]
    assert branches(source, "multi-else") == [RankBranch(test, "rank % 2 == 0", "false", "rank")]
    assert branches(source, "multi-test") == []
    assert branches(source, "not-rank") == []


def test_a_while_loop_on_the_rank() -> None:
    source = _script("""
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        while local_rank != 0 and not os.path.exists(marker):  # test
            time.sleep(1)  # body
        dist.barrier()  # after
        while step < total:
            dist.barrier()  # plain-loop
        """)
    assert branches(source, "body") == [
        RankBranch(at(source, "test"), "local_rank != 0 and not os.path.exists(marker)", "true", "local_rank")]
    assert branches(source, "after") == []
    assert branches(source, "plain-loop") == []


def test_a_comprehension_filter() -> None:
    source = _script("""
        handles = [dist.broadcast(p, 0, async_op=True) for p in params if dist.get_rank() == 0]  # comp
        """)
    assert branches(source, "comp") == [RankBranch(1, "dist.get_rank() == 0", "true", "get_rank()")]


# --- scopes: nested functions, closures, lambdas, classes -----------------------------------------

def test_a_branch_outside_a_nested_function_does_not_count_but_closures_resolve() -> None:
    source = _script("""
        def train():
            leader = dist.get_rank() == 0
            if leader:
                def hook(grad):
                    dist.all_reduce(grad)  # in-hook
                    return grad
            def report():
                if leader:  # closure
                    dist.barrier()  # closure-body
            sync = lambda t: dist.all_reduce(t) if leader else t  # lambda
        """)
    assert branches(source, "in-hook") == []
    assert branches(source, "closure-body") == [RankBranch(at(source, "closure"), "leader", "true", "leader")]
    assert branches(source, "lambda") == [RankBranch(at(source, "lambda"), "leader", "true", "leader")]


def test_a_lambda_on_a_line_under_a_branch_keeps_the_branch_but_its_own_lines_do_not() -> None:
    source = _script("""
        def sync(params, rank):
            if rank == 0:  # test
                handles = list(map(lambda p: dist.broadcast(p, 0, async_op=True), params))  # one-line
                later = (lambda p:
                         dist.broadcast(p, 0))  # own-line
        """)
    assert branches(source, "one-line") == [RankBranch(at(source, "test"), "rank == 0", "true", "rank")]
    assert branches(source, "own-line") == []


def test_a_middle_line_of_a_multi_line_call_and_a_multi_line_condition() -> None:
    source = _script("""
        if (dist.get_rank() == 0  # test
                and args.save_every > 0):
            dist.all_reduce(
                tensor,  # middle
                op=dist.ReduceOp.SUM,
            )
        """)
    assert branches(source, "middle") == [
        RankBranch(at(source, "test"), "dist.get_rank() == 0 and args.save_every > 0", "true", "get_rank()")]


def test_a_long_condition_is_cut() -> None:
    cond = "dist.get_rank() == 0 and " + " and ".join(f"flag_{i}" for i in range(40))
    source = f"if {cond}:\n    dist.barrier()\n"
    (found,) = rank_branches(source, 2)
    assert len(found.condition) == 120 and found.condition.endswith("...")
    assert found.condition.startswith("dist.get_rank() == 0 and flag_0 and")


# --- bad input ------------------------------------------------------------------------------------

def test_unparsable_source_and_lines_out_of_range() -> None:
    assert rank_branches("if dist.get_rank() == 0:\n    dist.barrier(\n", 2) == []
    ok = "if dist.get_rank() == 0:\n    dist.barrier()\n"
    assert rank_branches(ok, 2) != []
    for line in (0, -1, 3, 10_000):
        assert rank_branches(ok, line) == []
    assert rank_branches("", 1) == []
    assert rank_branches("x = 1\0\n", 1) == []


def test_nesting_too_deep_for_ast_gives_nothing() -> None:
    source = "if dist.get_rank() == 0:\n    x = " + "+".join(["a"] * 50_000) + "\n"
    assert rank_branches(source, 2) == []


def test_a_big_file_is_fast() -> None:
    block = _script("""
        def step_{i}(model, batch, rank):
            loss = model(batch)
            if rank == 0 and loss.item() > 0:
                dist.all_reduce(loss)
            for k in range(3):
                loss = loss + k
            return loss

        """)
    source = "import torch.distributed as dist\n\n" + "".join(block.format(i=i) for i in range(700))
    assert len(source.splitlines()) > 5000
    start = time.process_time()  # CPU time: other work on the machine does not count
    line = len(source.splitlines()) - 4  # the last dist.all_reduce(loss)
    found = rank_branches(source + "\n# fresh copy\n", line)
    assert time.process_time() - start < 1.0
    assert found == [RankBranch(line - 1, "rank == 0 and loss.item() > 0", "true", "rank")]


def test_a_file(tmp_path) -> None:
    path = tmp_path / "train.py"
    path.write_text("import torch.distributed as dist\nif dist.get_rank() == 0:\n    dist.barrier()\n")
    assert rank_branches_of_file(str(path), 3) == [RankBranch(2, "dist.get_rank() == 0", "true", "get_rank()")]
    assert rank_branches_of_file(str(path), 3, max_bytes=10) == []  # too big: not read
    path.write_bytes(b"\xef\xbb\xbfimport os\nif os.environ['RANK'] == '0':\n    x = '\xff'\n")  # BOM, bad byte
    assert rank_branches_of_file(str(path), 3) == [RankBranch(2, "os.environ['RANK'] == '0'", "true", "RANK")]


def test_a_directory_or_a_missing_file(tmp_path) -> None:
    assert rank_branches_of_file(str(tmp_path), 1) == []
    assert rank_branches_of_file(str(tmp_path / "missing.py"), 1) == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_never_opened(tmp_path) -> None:
    fifo = tmp_path / "train.py"
    os.mkfifo(fifo)
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(rank_branches_of_file(str(fifo), 1)), daemon=True)
    worker.start()
    worker.join(timeout=5)
    if worker.is_alive():  # unblock the reader before failing, so the test run does not hang
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("rank_branches_of_file blocked on a FIFO")
    assert result == [[]]


@pytest.mark.skipif(sys.version_info < (3, 10), reason="match statements are Python 3.10+")
def test_a_match_on_the_rank() -> None:
    source = _script("""
        match dist.get_rank():
            case 0:  # zero
                dist.send(t, dst=1)  # zero-body
            case r if r > 4:  # guarded
                dist.barrier()  # guarded-body
        match mode:
            case "train":
                dist.barrier()  # mode
        """)
    assert branches(source, "zero-body") == [
        RankBranch(at(source, "zero"), "match dist.get_rank(): case 0", "true", "get_rank()")]
    assert branches(source, "guarded-body") == [
        RankBranch(at(source, "guarded"), "match dist.get_rank(): case r if r > 4", "true", "get_rank()")]
    assert branches(source, "mode") == []
