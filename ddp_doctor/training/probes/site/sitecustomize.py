"""Put on PYTHONPATH by `ddp-doctor run` so that Python processes the training script starts
(torch.multiprocessing.spawn ranks, subprocesses) record the in-training probes too, the way
coverage.py measures subprocesses. Then the next sitecustomize on sys.path, if any, runs as usual."""
import os
import sys


def _probes() -> None:
    if not os.environ.get("DDP_DOCTOR_PROBE_DIR"):
        return
    try:
        from ddp_doctor.training.probes.install import install_in_child
        install_in_child()
    except Exception:  # noqa: BLE001 - never break the interpreter's start
        pass


def _chain() -> None:
    """Python imports one sitecustomize: load the one this file shadows."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import importlib
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - the other sitecustomize's error is not ours to raise
        pass
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules.setdefault("sitecustomize", ours)


_probes()
_chain()
