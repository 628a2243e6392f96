"""The in-training probes: recorders patched around torch.distributed, DataLoader and DDP while the
real job runs, the fingerprints they take, and how they start in child interpreters and under
framework callbacks.

- recorder.py: `Recorder`, the record of one process, and this process's current recorder;
- install.py: `install(out_dir)` puts the wrappers in place; `install_in_child` for sitecustomize;
- patching.py: `wrap_in_place` and `record_quietly`, what every wrapper is built with;
- dist_wrappers.py, loader_wrappers.py, trainer_wrapper.py: the wrappers, by what they wrap;
- call_sites.py: the user's file:line of a recorded call, and whether a library made it;
- children.py: forks, and child interpreters (`child_env`, `site/sitecustomize.py`);
- record_exchange.py: records handed between ranks through the process group's store;
- session.py: `ProbeSession`, the probes driven by a framework callback;
- fingerprints.py, import_hooks.py: sample/parameter fingerprints; post-import hooks.

The rules over the records are in ddp_doctor/checks/training_probes.py.
"""
