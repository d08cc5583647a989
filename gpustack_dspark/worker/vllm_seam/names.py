"""Every vLLM internal the worker uses, named once, with where it lives per supported series.

Why: the launcher follows vLLM's own `run_server` and the drafting layer subclasses vLLM's
scheduler and structured-output manager — none of it is a public interface, and vLLM moves
it between releases (0.33 moved the argument parser and `cli_env_setup`). This table is the
one place an upgrade edits: a row per name, its module per series, the members used, the
parameters relied on. `resolve.py` imports a row for the installed vLLM; `sources.py` checks
every row against a release's sources (installed, or a wheel/sdist) without running it.
Pure data: imports nothing.
"""

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

SUPPORTED_SERIES: Tuple[str, ...] = ("0.32", "0.33")
"""The vLLM release series the worker runs on (any patch release of each)."""


@dataclass(frozen=True)
class Internal:
    name: str
    """The object's name in its module (a function, a class or a module-level object)."""
    module: str
    """Where it lives in every supported series, unless `moved` says otherwise."""
    moved: Dict[str, str] = field(default_factory=dict)
    """series -> module, where a series keeps it elsewhere."""
    members: Tuple[str, ...] = ()
    """Class members used (methods, properties, class attributes, dataclass fields)."""
    instance: Tuple[str, ...] = ()
    """Instance attributes used (assigned as `self.<name>` in the class or a base class)."""
    params: Optional[Tuple[str, ...]] = None
    """The function's parameters must start with these, in order (None: not checked)."""
    member_params: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    """member -> the parameters it must start with (the methods we override or call)."""
    series: Tuple[str, ...] = SUPPORTED_SERIES
    """The series that have (and need) this name."""
    used_by: str = ""
    """Which of our modules uses it, and for what."""

    def module_in(self, series: str) -> str:
        return self.moved.get(series, self.module)

    def where(self, series: str) -> str:
        return f"{self.module_in(series)}.{self.name}"


SCHED = "vllm.v1.core.sched.scheduler"
SO = "vllm.v1.structured_output"

INTERNALS: Tuple[Internal, ...] = (
    # --- the launcher (worker/launch.py): vLLM's run_server, step by step -----------------
    Internal("make_arg_parser", "vllm.entrypoints.launchers.cli_args", {"0.33": "vllm.entrypoints.common.cli_args"},
             params=("parser",), used_by="launch.parse_with_vllm: vLLM's own serve arguments"),
    Internal("validate_parsed_serve_args", "vllm.entrypoints.launchers.cli_args",
             {"0.33": "vllm.entrypoints.common.cli_args"}, params=("args",),
             used_by="launch.parse_with_vllm: vLLM's own checks"),
    Internal("FlexibleArgumentParser", "vllm.utils.argparse_utils", used_by="launch.parse_with_vllm"),
    Internal("cli_env_setup", "vllm.entrypoints.serve.utils.api_utils", {"0.33": "vllm.entrypoints.common.startup"},
             params=(), used_by="launch.run_vllm: the environment vLLM's CLI sets up"),
    Internal("configure_logging_from_args", "vllm.logger", params=("args",), used_by="launch.run_vllm"),
    Internal("SpeculativeConfig", "vllm.config.speculative", members=("rejection_sample_method",),
             used_by="launch.check_speculative_config: the keys vLLM accepts"),
    Internal("setup_server", "vllm.entrypoints.openai.api_server", params=("args",), used_by="launch._serve"),
    Internal("build_async_engine_client", "vllm.entrypoints.openai.api_server", params=("args",),
             used_by="launch._serve"),
    Internal("build_and_serve", "vllm.entrypoints.openai.api_server",
             params=("engine_client", "listen_address", "sock", "args"), used_by="launch._serve"),
    # --- the drafting layer (worker/drafting/) ---------------------------------------------
    Internal("Scheduler", SCHED,
             members=("update_draft_token_ids", "update_from_output", "_free_request", "schedule",
                      "get_grammar_bitmask"),
             instance=("running", "waiting", "max_num_scheduled_tokens", "max_num_running_reqs"),
             member_params={"update_draft_token_ids": ("self", "draft_token_ids"),
                            "update_from_output": ("self", "scheduler_output", "model_runner_output"),
                            "_free_request": ("self", "request"), "schedule": ("self",),
                            "get_grammar_bitmask": ("self", "scheduler_output")},
             used_by="drafting/scheduler.py: DSparkDraftingScheduler subclasses it (--scheduler-cls)"),
    Internal("SchedulerOutput", "vllm.v1.core.sched.output",
             members=("total_num_scheduled_tokens", "num_scheduled_tokens", "scheduled_spec_decode_tokens"),
             used_by="drafting/budget_step.py: tokens scheduled this step; "
                     "drafting/scheduler.py: each request's verified drafts"),
    Internal("StructuredOutputManager", SO, members=("validate_tokens", "grammar_init", "_create_grammar"),
             instance=("backend", "vllm_config", "tokenizer"),
             member_params={"grammar_init": ("self", "request"), "_create_grammar": ("self", "request")},
             used_by="drafting/engines.py: xgrammar and llguidance in one manager"),
    Internal("StructuredOutputManager", SO, instance=("backend_name",), series=("0.33",),
             used_by="drafting/engines.py: 0.33 refuses a request whose backend differs from it; "
                     "the two-engine manager sets it on purpose"),
    Internal("XgrammarBackend", f"{SO}.backend_xgrammar", members=("compile_grammar", "allocate_token_bitmask"),
             used_by="drafting/engines.py: the primary engine"),
    Internal("XgrammarGrammar", f"{SO}.backend_xgrammar", members=("matcher",),
             used_by="drafting/scheduler.py: forced tokens from the grammar"),
    Internal("GuidanceBackend", f"{SO}.backend_guidance", members=("compile_grammar", "allocate_token_bitmask"),
             used_by="drafting/engines.py: the second engine"),
    Internal("GuidanceGrammar", f"{SO}.backend_guidance", members=("ll_matcher",),
             used_by="drafting/scheduler.py: forced tokens from llguidance"),
    Internal("DraftTokenIds", "vllm.v1.outputs", members=("draft_token_ids",), used_by="drafting/scheduler.py"),
    Internal("ModelRunnerOutput", "vllm.v1.outputs", members=("sampled_token_ids",), used_by="drafting/scheduler.py"),
    Internal("Request", "vllm.v1.request", members=("num_tokens",),
             instance=("spec_token_ids", "num_computed_tokens", "is_prefill_chunk"),
             used_by="drafting/budget_step.py: each request's draft and progress"),
    Internal("Request", "vllm.v1.request", instance=("num_prompt_tokens",),
             used_by="drafting/scheduler.py: where the prompt ends (its n-grams are the prompt's source)"),
    # --- serve.py: what the tool-call parser can constrain --------------------------------
    Internal("ToolParserManager", "vllm.tool_parsers", members=("get_tool_parser",),
             params=None, used_by="serve.structural_tag_format: a parser's structural-tag format "
                                  "(its class's `structural_tag_model`; strict tools under auto)"),
    # --- vllm_fixes.py: the CPU build's faults -----------------------------------------
    Internal("current_platform", "vllm.platforms", used_by="vllm_fixes: the fixes apply on CPU only"),
    Internal("expand_batch_to_tokens", "vllm.v1.sample.rejection_sampler", params=("x", "cu_num_tokens", "num_tokens"),
             used_by="vllm_fixes: the CPU expand kernel's self-test and its replacement"),
    Internal("sample_recovered_tokens", "vllm.v1.sample.rejection_sampler",
             params=("max_spec_len", "num_draft_tokens", "cu_num_draft_tokens", "draft_token_ids", "draft_probs",
                     "target_probs", "sampling_metadata", "device"),
             used_by="vllm_fixes: recovered tokens sampled only at each request's first rejected position"),
    Internal("generate_uniform_probs", "vllm.v1.sample.rejection_sampler",
             params=("num_tokens", "num_draft_tokens", "generators", "device"),
             used_by="vllm_fixes: the accept test's uniforms, to find the positions read back"),
    Internal("rejection_sample", "vllm.v1.sample.rejection_sampler",
             params=("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs",
                     "target_logits", "bonus_token_ids", "sampling_metadata"),
             used_by="vllm_fixes: each verify step's output checked against the positions read back"),
    Internal("GREEDY_TEMPERATURE", "vllm.v1.sample.rejection_sampler",
             used_by="vllm_fixes: the greedy requests of a verify step, whose recovered tokens are not read"),
    Internal("PLACEHOLDER_TOKEN_ID", "vllm.v1.sample.rejection_sampler",
             used_by="vllm_fixes: the padding of a verify step's output"),
    Internal("GPUModelRunner", "vllm.v1.worker.gpu_model_runner", members=("_sample", "_bookkeeping_sync"),
             used_by="vllm_fixes: seeded requests on chunked prefill"),
    Internal("GPUModelRunner", "vllm.v1.worker.gpu_model_runner",
             members=("execute_model", "_get_spec_decode_draft_probs", "sample_tokens"),
             member_params={"execute_model": ("self", "scheduler_output"),
                            "_get_spec_decode_draft_probs": ("self", "spec_decode_metadata"),
                            "sample_tokens": ("self",)},
             series=("0.32",),
             used_by="drafting/draft_probs.py: sampled drafts verified with the distribution they were drawn "
                     "from, and the verifier's rows handed back (0.33 not read yet: its drafts stay one-hot)"),
    Internal("rejection_sample", "vllm.v1.sample.rejection_sampler",
             params=("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs",
                     "target_logits"),
             series=("0.32",),
             used_by="drafting/draft_probs.py: the verifier's processed distribution at sampled positions "
                     "(verifier_rows.py)"),
)

# Not vLLM, but shipped pinned beside it and used through vLLM's grammar objects; checked at
# start with the rest (resolve.problems), not in a vLLM wheel's sources.
LIBRARY_MEMBERS: Tuple[Tuple[str, str], ...] = (
    ("xgrammar.GrammarMatcher", "find_jump_forward_string"),
    ("xgrammar.GrammarMatcher", "is_completed"),
    ("xgrammar.GrammarMatcher", "rollback"),
    ("llguidance.LLMatcher", "try_consume_tokens"),
    ("llguidance.LLMatcher", "compute_ff_bytes"),
    ("llguidance.LLMatcher", "compute_bitmask"),
    ("llguidance.LLMatcher", "rollback"),
    ("llguidance.LLMatcher", "is_accepting"),
    ("llguidance.LLMatcher", "is_stopped"),
)


def series_of(version: str) -> Optional[str]:
    """"0.33.1+cpu" -> "0.33" when supported, else None."""
    parts = version.split("+")[0].split(".")
    series = ".".join(parts[:2])
    return series if series in SUPPORTED_SERIES else None


def by_name(name: str) -> Internal:
    return next(i for i in INTERNALS if i.name == name)
