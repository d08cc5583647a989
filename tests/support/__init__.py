"""Test stand-ins and helpers for this repository's tests and experiments.

They live here, outside `gpustack_dspark/`, so the wheel a GPUStack server installs carries
none of them (a unit test lists the wheel's files): `stand_in_replica` (tiny OpenAI-compatible
servers in place of vLLM), `stand_in_instances` (GPUStack instances pointed at them),
`stand_in_kube_api` (a Kubernetes API for the node-label sync), and `dspark_test_faults`
(faults injected into a real server process through the devstack's sitecustomize).
"""
