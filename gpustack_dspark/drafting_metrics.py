"""The drafting layer's Prometheus families: name, help, counter field. Pure constants.

Shared by the worker (worker/drafting/stats.py exports them) and the server plugin
(observe/metrics_config.py tells GPUStack's worker to scrape them); imports nothing.
"""

METRICS = (
    ("dspark_draft_forced_tokens_proposed_total", "Grammar-forced draft tokens proposed", "forced_proposed"),
    ("dspark_draft_forced_tokens_accepted_total", "Grammar-forced draft tokens accepted", "forced_accepted"),
    ("dspark_draft_forced_tokens_rejected_total", "Grammar-forced draft tokens that were the first one rejected",
     "forced_rejected"),
    ("dspark_draft_statistical_tokens_rejected_total", "Statistical draft tokens that were the first one rejected",
     "statistical_rejected"),
    ("dspark_draft_statistical_tokens_proposed_total", "Statistical (n-gram/suffix) draft tokens proposed",
     "statistical_proposed"),
    ("dspark_draft_statistical_tokens_accepted_total", "Statistical draft tokens accepted", "statistical_accepted"),
    ("dspark_draft_base_tokens_proposed_total", "Draft tokens of vLLM's own drafter passed through",
     "base_proposed"),
    ("dspark_draft_base_tokens_accepted_total", "Draft tokens of vLLM's own drafter accepted", "base_accepted"),
    ("dspark_draft_base_tokens_rejected_total", "Draft tokens of vLLM's own drafter that were the first one rejected",
     "base_rejected"),
    ("dspark_drafts_total", "Drafts built by the DSpark drafting layer", "drafts"),
    ("dspark_drafts_cut_by_threshold_total", "Drafts cut at a token below --dspark-accept-threshold",
     "drafts_cut_by_threshold"),
    ("dspark_draft_grammar_trimmed_tokens_total", "Layer draft tokens removed by vLLM's grammar check",
     "grammar_trimmed_tokens"),
    ("dspark_draft_layer_errors_total", "Steps where the drafting layer failed and vLLM's draft was used",
     "layer_errors"),
    ("dspark_target_forward_passes_total", "Request-steps of the target model that produced tokens",
     "target_forward_passes"),
    ("dspark_output_tokens_total", "Tokens produced by those steps", "output_tokens"),
)
