"""The drafting layer's Prometheus families: name, help, counter field. Pure constants.

Shared by the worker (worker/drafting/stats.py exports them) and the server plugin
(observe/metrics_config.py tells GPUStack's worker to scrape them); imports nothing.
"""

METRICS = (
    ("dspark_draft_forced_tokens_proposed_total", "Grammar-forced draft tokens proposed", "forced_proposed"),
    ("dspark_draft_forced_tokens_accepted_total", "Grammar-forced draft tokens accepted", "forced_accepted"),
    ("dspark_draft_forced_tokens_rejected_total", "Grammar-forced draft tokens that were the first one rejected",
     "forced_rejected"),
    ("dspark_draft_spelled_tokens_proposed_total",
     "Draft tokens of grammar-forced text where the grammar allowed other spellings too", "spelled_proposed"),
    ("dspark_draft_spelled_tokens_accepted_total", "Spelled draft tokens accepted", "spelled_accepted"),
    ("dspark_draft_spelled_tokens_rejected_total", "Spelled draft tokens that were the first one rejected",
     "spelled_rejected"),
    ("dspark_draft_statistical_tokens_rejected_total", "Statistical draft tokens that were the first one rejected",
     "statistical_rejected"),
    ("dspark_draft_statistical_tokens_proposed_total", "Statistical (n-gram/suffix) draft tokens proposed",
     "statistical_proposed"),
    ("dspark_draft_statistical_tokens_accepted_total", "Statistical draft tokens accepted", "statistical_accepted"),
    ("dspark_draft_sampled_tokens_proposed_total",
     "Statistical draft tokens drawn from their counts (temperature > 0) and verified with that distribution",
     "sampled_proposed"),
    ("dspark_draft_sampled_tokens_accepted_total", "Sampled draft tokens accepted", "sampled_accepted"),
    ("dspark_draft_sampled_tokens_rejected_total", "Sampled draft tokens that were the first one rejected",
     "sampled_rejected"),
    ("dspark_draft_verifier_rows_total",
     "The verifier's distributions at sampled draft positions, averaged per context into the next drafts' q",
     "verifier_rows"),
    *((f"dspark_draft_{source}_tokens_{what}_total", f"Statistical and sampled draft tokens {what}: {says}"
       + (" (the first one rejected)" if what == "rejected" else ""), f"{source}_{what}")
      for source, says in (("prompt", "seen in the request's prompt"), ("reply", "seen earlier in the same reply"),
                           ("history", "seen in recent replies on this replica"),
                           ("learned", "in no index, drawn from the verifier's rows"))
      for what in ("proposed", "accepted", "rejected")),
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
    ("dspark_grammar_compiles_total", "Requests whose grammar was new to this replica (compiled, not cached)",
     "grammar_compiles"),
    ("dspark_grammar_reuses_total", "Requests whose grammar this replica had compiled before (cached)",
     "grammar_reuses"),
    ("dspark_target_forward_passes_total", "Request-steps of the target model that produced tokens",
     "target_forward_passes"),
    ("dspark_output_tokens_total", "Tokens produced by those steps", "output_tokens"),
    ("dspark_budget_steps_total", "Steps the speculation budget decided (--dspark-speculative-length auto)",
     "budget_steps"),
    ("dspark_budget_steps_off_total", "Steps where the speculation budget verified no draft token",
     "budget_steps_off"),
    ("dspark_budget_draft_tokens_offered_total", "Draft tokens built while the speculation budget was on",
     "budget_tokens_offered"),
    ("dspark_budget_draft_tokens_kept_total", "Of them, draft tokens the speculation budget kept for verification",
     "budget_tokens_kept"),
    ("dspark_budget_steps_capped_by_prefill_total", "Steps where waiting prefills limited the draft tokens",
     "budget_steps_capped_by_prefill"),
)

# The speculation budget's gauges (worker/drafting/stats.py), present when it is on.
BUDGET_GAUGES = {
    "draft_tokens": ("dspark_budget_draft_tokens", "Draft tokens the speculation budget kept on its last step"),
    "speculating": ("dspark_budget_speculating", "1 while the speculation budget verifies drafts, 0 while it is off"),
    "step_fixed": ("dspark_step_time_fixed_seconds", "The step-time model's fixed cost per engine step (a)"),
    "step_per_token": ("dspark_step_time_per_token_seconds", "The step-time model's cost per scheduled token (b)"),
    "position": ("dspark_draft_position_acceptance",
                 "Observed acceptance of draft tokens the verifier reached, per kind and position"),
}
