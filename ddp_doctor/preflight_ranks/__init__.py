"""Running a preflight: one rank's stages (local checks, bounded rendezvous, process group, group
and cross-rank checks), and the local launch of ranks when no launcher is around."""
