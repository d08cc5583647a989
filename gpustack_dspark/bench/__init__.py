"""The benchmark library of `gpustack-dspark bench` and `sweep` (talks to replicas or GPUStack
over HTTP only): load and figures (`load`), request bodies (`workloads`), extraction
tasks with a known truth and their field scores (`extraction`), a run (`runner`), its
forms (`report`), the sweep's grid and recommendation (`sweep`). Imports nothing of the
devstack. The repository's experiments that use it are in `tests/bench/`, outside the wheel."""
