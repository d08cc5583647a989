"""The vLLM seam (worker/vllm_seam/): its table checked against the installed vLLM 0.32's
sources (the worker venv; read, not imported), a lifted name caught by name, the two-engine
manager's 0.33 guard, and the lossy verification methods refused by dspark-serve.

The 0.33 check needs the 0.33.0 wheel (336 MB), so it is a command, not a test:
`make check-vllm-seam` (downloads it once into ~/.cache/gpustack-dspark/)."""

import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpustack_dspark.knobs import KnobError, parse_knob_args
from gpustack_dspark.translate import plan_launch, refuse_lossy_verification
from gpustack_dspark.worker.drafting import engines
from gpustack_dspark.worker.vllm_seam import names, sources

REPO = Path(__file__).resolve().parents[2]
WORKER_VENV = Path(os.environ.get("DSPARK_WORKER_VENV", REPO / ".venv-worker"))


def _installed_sources() -> Path:
    found = sorted(WORKER_VENV.glob("lib/python3*/site-packages/vllm/__init__.py"))
    assert found, f"no vLLM in {WORKER_VENV}: run `make setup` (the worker venv, vLLM 0.32 for CPU)"
    return found[-1].parents[1]


@pytest.fixture(scope="module")
def installed():
    return sources.SourceTree(_installed_sources())


def test_every_name_and_signature_the_seam_uses_is_in_the_installed_0_32(installed):
    assert installed.version().startswith("0.32.")
    assert sources.check_tree(installed, "0.32") == []


def test_a_lifted_name_fails_naming_it(installed):
    lifted = [replace(names.by_name("Scheduler"), members=("schedule", "update_draft_token_idz")),
              replace(names.by_name("build_and_serve"), params=("engine_client", "sock")),
              names.Internal("make_arg_parser", "vllm.entrypoints.common.cli_args")]  # 0.33's place
    assert sources.check_tree(installed, "0.32", lifted) == [
        "vllm.v1.core.sched.scheduler.Scheduler.update_draft_token_idz is missing",
        "vllm.entrypoints.openai.api_server.build_and_serve takes ['engine_client', 'listen_address', 'sock', "
        "'args', 'peer_loads'], expected it to start with ['engine_client', 'sock']",
        "vllm.entrypoints.common.cli_args.make_arg_parser is missing",
    ]
    # 0.33's rows read against 0.32: the moved names and the guard's attribute, each by name.
    assert sources.check_tree(installed, "0.33") == [
        "vllm.entrypoints.common.cli_args.make_arg_parser is missing",
        "vllm.entrypoints.common.cli_args.validate_parsed_serve_args is missing",
        "vllm.entrypoints.common.startup.cli_env_setup is missing",
        "vllm.v1.structured_output.StructuredOutputManager.backend_name is missing",
    ]


def test_the_command_exits_1_naming_what_is_missing_and_2_for_a_path_that_is_no_vllm(tmp_path, capsys):
    assert sources.main([str(_installed_sources())]) == 0
    assert sources.main(["--series", "0.33", str(_installed_sources())]) == 1
    assert "cli_env_setup is missing" in capsys.readouterr().out
    assert sources.main([str(tmp_path)]) == 2


def test_series():
    assert names.series_of("0.32.0+cpu") == "0.32" and names.series_of("0.33.4") == "0.33"
    assert names.series_of("0.31.0") is None and names.series_of("0.34.0") is None


def test_the_two_engine_manager_leaves_0_33_s_one_backend_guard_nothing_to_refuse():
    class Manager033:  # vLLM 0.33's guard, as in StructuredOutputManager.grammar_init
        def __init__(self):
            self.backend, self.backend_name = None, "xgrammar"

        def grammar_init(self, request):
            backend = request.sampling_params.structured_outputs._backend
            if self.backend_name is not None and backend != self.backend_name:
                raise ValueError(f"engine already uses {self.backend_name!r}, request resolved to {backend!r}")

    manager = Manager033()
    engines.install(manager)
    manager.backend = object()  # the primary engine is built
    request = SimpleNamespace(structured_output_request=object(), sampling_params=SimpleNamespace(
        structured_outputs=SimpleNamespace(_backend="guidance")))
    manager.grammar_init(request)  # a guidance request on an xgrammar-first engine: served
    assert manager.backend_name is None


@pytest.mark.parametrize("argv", [
    ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3,"rejection_sample_method":"fly"}'],
    ['--speculative-config={"method":"ngram","rejection_sample_method":"synthetic"}'],
    ["--speculative-config.rejection_sample_method=fly"],
    ["-sc", '{"rejection_sample_method":"fly"}'],
])
def test_lossy_verification_is_refused_with_one_line(argv):
    with pytest.raises(KnobError) as e:
        plan_launch("m", parse_knob_args([])[0], argv)
    assert "\n" not in str(e.value) and str(e.value).startswith("--speculative-config rejection_sample_method: '")
    assert "allowed: standard|block" in str(e.value)


def test_exact_verification_passes():
    refuse_lossy_verification(["--speculative-config", '{"method":"ngram","rejection_sample_method":"block"}'])
    refuse_lossy_verification(["--speculative-config", "not json"])  # vLLM's parser words that one


def test_the_cuda_image_takes_the_vllm_version_as_a_build_argument_defaulting_to_the_pin():
    from gpustack_dspark.versions import SUPPORTED_VLLM_VERSION

    text = (REPO / "backend_images" / "cuda" / "Containerfile").read_text()
    assert f"ARG VLLM_VERSION={SUPPORTED_VLLM_VERSION}\n" in text
    assert "vllm-openai:v${VLLM_VERSION}" in text and names.series_of(SUPPORTED_VLLM_VERSION)


def test_the_drafting_config_is_one_contract_between_the_launcher_and_the_engine():
    from gpustack_dspark.translate import DraftingConfig

    written = DraftingConfig(mode="forced", threshold=0.3, length=8, budget=True, engines=("xgrammar", "llguidance"))
    spec = SimpleNamespace(num_speculative_tokens=4, method="ngram")
    read = DraftingConfig.from_vllm({DraftingConfig.KEY: written.as_json()}, spec)
    assert read == replace(written, base_method="ngram")
    assert DraftingConfig.from_vllm(None, spec) == DraftingConfig(length=4, base_method="ngram")
