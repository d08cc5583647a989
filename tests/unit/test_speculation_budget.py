"""The per-step speculation budget (worker/drafting/budget.py) on recorded and simulated step
traces, no engine: the time model's fit, the acceptance calibration, the choice rule, and the
controller over a low -> high -> low load trace."""

import json
import math
import random
from pathlib import Path

import pytest

from gpustack_dspark.worker.drafting.budget import (
    AcceptanceModel, BudgetConfig, SpeculationBudget, StepTimeModel, best_slots, decide)


# --- the step-time model ---------------------------------------------------------------------

def test_time_model_recovers_a_line_and_forgets_old_hardware():
    model = StepTimeModel(forgetting=0.95)
    for i in range(200):
        tokens = 1 + (i * 7) % 40
        model.observe(tokens, 0.004 + 0.0005 * tokens)
    a, b = model.fit()
    assert a == pytest.approx(0.004, rel=1e-6) and b == pytest.approx(0.0005, rel=1e-6)
    for i in range(300):  # the replica got slower per token (e.g. neighbours on the CPU)
        tokens = 1 + (i * 7) % 40
        model.observe(tokens, 0.004 + 0.002 * tokens)
    a, b = model.fit()
    assert b == pytest.approx(0.002, rel=1e-3)


def test_first_shape_outliers_count_as_at_most_twice_the_line_but_new_sizes_and_lasting_changes_do():
    rng = random.Random(1)
    clean, clipped = StepTimeModel(clip=0), StepTimeModel()
    for i in range(300):
        tokens = rng.randint(8, 72)
        seconds = 0.006 + 0.0001 * tokens
        slow = seconds * 8 if i % 25 == 5 else seconds  # a shape's first step: 8x
        clean.observe(tokens, slow)
        clipped.observe(tokens, slow)
    a, b = clipped.fit()
    assert a == pytest.approx(0.006, rel=0.15) and b == pytest.approx(0.0001, rel=0.3)
    assert clean.fit()[0] > 0.0075 and clipped.clipped >= 10  # unclipped: a 30 % too high
    # A step larger than any seen is taken as it is (no extrapolation) ...
    model = StepTimeModel()
    for _ in range(20):
        model.observe(4, 0.004)
    model.observe(72, 0.05)
    assert model.clipped == 0 and model.fit()[1] > 0.0003
    # ... and a lasting change within the sizes seen moves the line, up to 2x per step.
    for _ in range(200):
        model.observe(4, 0.02)
    assert _fit_at(model, 4) == pytest.approx(0.02, rel=0.1)


def _fit_at(model, tokens):
    a, b = model.fit()
    return a + b * tokens


def test_time_model_without_spread_puts_all_cost_per_step_and_refuses_bad_samples():
    model = StepTimeModel()
    assert model.fit() is None
    for _ in range(10):
        model.observe(8, 0.01)
    model.observe(0, 5.0)
    model.observe(8, float("nan"))
    model.observe(8, -1.0)
    assert model.steps == 10
    a, b = model.fit()
    assert (round(a, 9), b) == (0.01, 0.0)


def test_time_model_never_has_a_negative_intercept_or_slope():
    model = StepTimeModel()
    for tokens, seconds in ((1, 0.001), (10, 0.030), (20, 0.062)):  # steeper than proportional
        model.observe(tokens, seconds)
    a, b = model.fit()
    assert a >= 0.0 and b > 0.0
    model = StepTimeModel()
    for tokens, seconds in ((1, 0.030), (10, 0.020), (20, 0.010)):  # noise: more tokens, faster
        model.observe(tokens, seconds)
    a, b = model.fit()
    assert b == 0.0 and a > 0.0


# --- acceptance calibration ------------------------------------------------------------------

def test_survival_is_the_product_of_confidences_until_measured_otherwise():
    model = AcceptanceModel(max_length=4)
    assert model.survival(["forced", "statistical", "statistical"], [1.0, 0.8, 0.5]) == pytest.approx(
        [1.0, 0.8, 0.4])
    # Forced tokens at position 0 that the model spells differently half of the time.
    for i in range(400):
        model.observe(["forced"], [1.0], num_scheduled=1, num_accepted=i % 2)
    assert model.survival(["forced"], [1.0])[0] == pytest.approx(0.5, abs=0.03)
    assert model.per_position()["forced"][0] == pytest.approx(0.5, abs=0.03)
    # Other positions and kinds keep their prior.
    assert model.survival(["statistical", "forced"], [0.9, 1.0]) == pytest.approx([0.9, 0.9])


def test_acceptance_counts_only_positions_the_verifier_reached():
    model = AcceptanceModel(max_length=4)
    # Accepted 1 of 4: position 0 kept, 1 refused, 2 and 3 never reached.
    model.observe(["statistical"] * 4, [0.9] * 4, num_scheduled=4, num_accepted=1)
    assert model.per_position()["statistical"] == [1.0, 0.0, None, None]
    # A trimmed draft: only the scheduled part counts.
    model.observe(["statistical"] * 4, [0.9] * 4, num_scheduled=1, num_accepted=1)
    assert model.per_position()["statistical"][1] == 0.0


def test_overconfident_statistics_lose_survival():
    model = AcceptanceModel(max_length=3, prior=4.0)
    rng = random.Random(0)
    for _ in range(600):  # claims 0.9, right 30 % of the time
        model.observe(["statistical"], [0.9], num_scheduled=1, num_accepted=int(rng.random() < 0.3))
    assert model.survival(["statistical"], [0.9])[0] == pytest.approx(0.3, abs=0.06)


# --- the choice ------------------------------------------------------------------------------

def test_cheap_tokens_verify_everything_and_costly_tokens_nothing():
    drafts = [[1.0, 0.9, 0.8, 0.6], [0.95, 0.5]]
    # GPU-like: a step costs the same for 1 or 9 positions.
    assert decide(drafts, 2, 2, (0.010, 0.0), 64, None, 0.0).lengths == [4, 2]
    # Verification costs nearly a whole step per token: uncertain tokens do not pay ...
    off = decide([[0.9, 0.8], [0.6]], 2, 2, (0.001, 0.010), 64, None, 0.0)
    assert off.lengths == [0, 0] and off.cutoff == math.inf and off.reason.startswith("off: expected")
    # ... but a certain one (forced, survival 1) does, as long as a step has a fixed cost.
    assert decide([[1.0, 0.6]], 2, 2, (0.001, 0.010), 64, None, 0.0).lengths == [1]


def test_drafting_time_is_priced_into_speculating_only():
    # Eight requests, two certain (forced) tokens each, cheap verification: on pays ...
    drafts = [[1.0, 1.0, 0.85, 0.7]] * 8
    a, b = 0.003, 0.0006
    on = decide(drafts, 8, 8, (a, b), 2048, None, 0.0, draft_cost=8 * 0.0001)
    assert sum(on.lengths) >= 16 and on.reason.startswith("on:")
    # ... unless building the drafts costs more than they save: 2 ms per request is paid
    # every step while speculating and not while off (drafts only on probe steps).
    off = decide(drafts, 8, 8, (a, b), 2048, None, 0.0, draft_cost=8 * 0.002)
    assert off.lengths == [0] * 8 and off.reason.startswith("off: expected") and "drafting 16.00 ms" in off.reason
    # The controller prices what it measured, per request drafted.
    budget = SpeculationBudget(BudgetConfig(max_length=4))
    for tokens in range(8, 48):
        budget.time.observe(tokens, a + b * tokens)
    budget.drafting.observe(0.016, 8)
    budget.drafting.observe(-1, 8)  # nonsense is ignored
    assert budget.drafting.for_requests(8) == pytest.approx(0.016)
    assert budget.step([(["forced", "forced", "statistical", "statistical"], [1.0, 1.0, 0.85, 0.82])] * 8,
                       base_tokens=8, base_output=8, slot_cap=2048).lengths == [0] * 8
    assert budget.snapshot()["drafting_ms_per_request"] == pytest.approx(2.0)


def test_the_glue_times_a_step_without_the_layers_drafting():
    from gpustack_dspark.worker.drafting.budget_step import BudgetGlue

    glue = BudgetGlue(4)
    # tokens, step start, drafts built at 101.0, 0.3 s of it the layer's drafting
    glue._pending = (10, 100.0, 101.0, 0.3)
    glue._close(None)                   # the engine then went idle: up to the step's own end
    assert glue.budget.time.sy == pytest.approx(0.7)
    glue._pending = (10, 200.0, 200.4, 0.1)
    glue._close(201.0)                  # requests still running: up to the next schedule()
    assert glue.budget.time.sy == pytest.approx(0.7 * glue.budget.time.forgetting + 0.9)


class _Scheduler:
    def __init__(self, running):
        self.running, self.waiting = running, []
        self.max_num_scheduled_tokens, self.max_num_running_reqs = 2048, 8


def test_the_glue_takes_the_whole_period_only_while_requests_run(monkeypatch):
    from gpustack_dspark.worker.drafting import budget_step

    clock = iter([10.0, 10.004, 10.006, 10.010, 10.030, 10.033, 10.034])
    monkeypatch.setattr(budget_step.time, "perf_counter", lambda: next(clock))

    class Request:
        request_id, spec_token_ids, num_computed_tokens, num_tokens, is_prefill_chunk = "r", [], 5, 6, False

    glue = budget_step.BudgetGlue(4)
    busy = _Scheduler([Request()])
    glue.before_schedule(busy, {}, {})                 # 10.000 step 1 starts
    glue.after_schedule(type("Out", (), {"total_num_scheduled_tokens": 1})())
    glue.after_update()                                # 10.004
    glue.after_drafts(0.001, 1)                        # 10.006, 1 ms of drafting
    glue.before_schedule(busy, {}, {})                 # 10.010: still running -> period 10 ms - 1 ms
    assert glue.budget.time.sy == pytest.approx(0.009)
    glue.after_update()                                # 10.030
    glue.before_schedule(_Scheduler([]), {}, {})       # 10.033: went idle -> 20 ms to its own end
    assert glue.budget.time.sy == pytest.approx(0.009 * glue.budget.time.forgetting + 0.020)
    assert glue.budget.drafting.for_requests(1) == pytest.approx(0.001)


def test_the_choice_maximises_the_rate_and_keeps_prefixes():
    drafts = [[0.99, 0.97, 0.3, 0.2], [0.9, 0.1], [0.05]]
    a, b = 0.002, 0.001
    k, ranked, rates = best_slots(drafts, 3, 3, a, b, 64)
    assert rates[k] == max(rates)
    brute = max(range(len(ranked) + 1), key=lambda n: (3 + sum(ranked[:n])) / (a + b * (3 + n)))
    assert k == brute
    lengths = decide(drafts, 3, 3, (a, b), 64, None, 0.0).lengths
    assert sum(lengths) == k and all(n <= len(d) for n, d in zip(lengths, drafts))
    assert lengths == [2, 1, 0]


def test_waiting_prefills_keep_their_token_budget():
    drafts = [[1.0] * 8] * 4
    capped = decide(drafts, 4 + 100, 4, (0.010, 0.0), 5, None, 0.0)
    assert sum(capped.lengths) == 5
    none_left = decide(drafts, 4 + 100, 4, (0.010, 0.0), 0, None, 0.0)
    assert none_left.lengths == [0, 0, 0, 0] and "no token budget" in none_left.reason


def test_without_a_time_model_drafts_stay_as_built():
    decision = decide([[0.1, 0.1], [1.0]], 2, 2, None, 0, None, 0.0)
    assert decision.lengths == [2, 1] and "not profiled" in decision.reason


def test_hysteresis_keeps_a_cutoff_that_is_nearly_as_good():
    drafts = [[1.0, 0.9, 0.5]]
    a, b = 0.002, 0.001
    best = decide(drafts, 1, 1, (a, b), 64, None, 0.0)
    # A previous cutoff that admits one more slot, within 50 % of the best: kept.
    kept = decide(drafts, 1, 1, (a, b), 64, 0.5, 0.5)
    assert kept.cutoff == 0.5 and sum(kept.lengths) == 3 and sum(best.lengths) != 3
    # Without hysteresis the best wins.
    assert decide(drafts, 1, 1, (a, b), 64, 0.5, 0.0).lengths == best.lengths


# --- the controller over a load trace --------------------------------------------------------

class SimulatedReplica:
    """A replica whose step costs A + B * tokens. JSON drafts: two forced tokens, statistical
    ones after them, right with 0.85 while the layer claims 0.95 (so calibration has something
    to learn); free-text drafts: statistical only, right with 0.5, claimed 0.6."""

    A, B = 0.003, 0.0006
    TRUE = {"forced": 1.0, "statistical": 0.85, "text": 0.5}

    def __init__(self, seed=0):
        self.rng = random.Random(seed)

    def draft(self, workload="json"):
        if workload == "text":
            return ["statistical"] * 8, [0.6] * 8
        kinds = ["forced", "forced", "statistical", "statistical", "forced", "statistical",
                 "statistical", "statistical"]
        return kinds, [1.0 if k == "forced" else 0.95 for k in kinds]

    def verify(self, kinds, length, workload="json"):
        accepted = 0
        for kind in kinds[:length]:
            p = self.TRUE["text"] if workload == "text" else self.TRUE[kind]
            if self.rng.random() < p:
                accepted += 1
            else:
                break
        return accepted

    def step_time(self, tokens):
        return self.A + self.B * tokens * (1.0 + 0.05 * (self.rng.random() - 0.5))


def run_trace(phases, budget=None, seed=0, step_seconds=None):
    """phases: [(concurrency, steps[, workload])]; returns per step (concurrency, draft tokens
    kept, decision). `step_seconds(replica, concurrency, kept)`: a step's time (default the
    simulated replica's A + B * tokens)."""
    replica = SimulatedReplica(seed)
    budget = budget or SpeculationBudget(BudgetConfig(max_length=8, hysteresis=0.03))
    trace = []
    for concurrency, steps, *rest in phases:
        workload = rest[0] if rest else "json"
        for _ in range(steps):
            build = budget.build_length()
            drafts = [replica.draft(workload) for _ in range(concurrency)] if build else []
            drafts = [(k[:build], c[:build]) for k, c in drafts]
            decision = budget.step(drafts, base_tokens=concurrency, base_output=concurrency, slot_cap=2048)
            kept = sum(decision.lengths)
            for (kinds, confs), length in zip(drafts, decision.lengths):
                budget.acceptance.observe(kinds, confs, length, replica.verify(kinds, length, workload))
            seconds = (step_seconds(replica, concurrency, kept) if step_seconds
                       else replica.step_time(concurrency + kept))
            budget.time.observe(concurrency + kept, seconds)
            trace.append((concurrency, kept, decision))
    return trace, budget


def phase(trace, start, end):
    return [kept for _, kept, _ in trace[start:end]]


def per_request(trace, start, end):
    kept = phase(trace, start, end)
    return sum(kept) / len(kept) / trace[start][0]


def test_the_budget_shrinks_under_load_reaches_zero_and_recovers():
    trace, budget = run_trace([(1, 60), (4, 60), (64, 200, "text"), (1, 200)])
    low, mid = per_request(trace, 20, 60), per_request(trace, 80, 120)
    high, recovered = per_request(trace, 160, 320), per_request(trace, 420, 520)
    assert low >= 6, low                   # one request: verify (nearly) all 8
    assert mid < low, (mid, low)           # four: shorter
    assert high == 0, high                 # 64 on free text: speculation loses, it is off
    assert recovered >= 6, recovered       # load dropped: back on (found on a probe step)
    assert trace[300][1] == 0 and trace[300][2].reason.startswith("off: expected")
    # Calibration learned that statistical tokens are right less often than claimed.
    assert budget.acceptance.calibration("statistical", 2) < 0.95


def test_under_load_json_drafts_shrink_to_the_certain_tokens():
    # A forced token is always kept by the verifier: it costs b and saves a token, so it pays
    # at any load; the uncertain tail does not.
    trace, _ = run_trace([(1, 60), (64, 200)])
    high = phase(trace, 160, 260)
    assert all(64 * 2 <= kept <= 64 * 3 for kept in high), sorted(set(high))


def test_the_budget_is_right_where_it_speculates():
    # The chosen total matches the best total in hindsight for the true costs (within 5 %).
    trace, budget = run_trace([(1, 40), (8, 200)])
    a, b = budget.model()
    assert a == pytest.approx(SimulatedReplica.A, rel=0.2) and b == pytest.approx(SimulatedReplica.B, rel=0.2)
    replica = SimulatedReplica()
    survival = budget.acceptance.survival(*replica.draft())
    truth = [1.0, 1.0, 0.85, 0.85 ** 2, 0.85 ** 2, 0.85 ** 3, 0.85 ** 4, 0.85 ** 5]
    assert survival == pytest.approx(truth, abs=0.08)
    k, ranked, rates = best_slots([truth] * 8, 8, 8, SimulatedReplica.A, SimulatedReplica.B, 2048)
    chosen = phase(trace, 200, 240)
    best_rate = rates[k]
    for kept in chosen:
        assert rates[kept] >= 0.95 * best_rate


def test_the_budget_does_not_oscillate():
    # Steady load right at the edge where speculation starts to lose: on/off flips are rare.
    trace, _ = run_trace([(1, 40), (12, 400)], seed=3)
    steady = [kept for _, kept, _ in trace[100:]]
    flips = sum(1 for x, y in zip(steady, steady[1:]) if (x == 0) != (y == 0))
    changes = sum(1 for x, y in zip(steady, steady[1:]) if abs(x - y) > 12)
    assert flips <= 6, flips
    assert changes <= 20, changes


def test_while_off_drafts_are_built_only_on_probe_steps():
    budget = SpeculationBudget(BudgetConfig(max_length=4, probe_every=5))
    assert budget.build_length() == 4  # nothing decided yet
    for i in range(10):
        budget.time.observe(1 + i, 0.001 * (1 + i) * 50)  # tokens cost a whole step each
    budget.step([(["statistical"] * 4, [0.5] * 4)], base_tokens=1, base_output=1, slot_cap=64)
    assert budget.cutoff == math.inf
    built = [budget.build_length() for _ in range(10)]
    assert built == [0, 0, 0, 0, 4, 0, 0, 0, 0, 4]
    # A probe that finds it off again doubles the spacing (up to probe_max); on resets it.
    budget = SpeculationBudget(BudgetConfig(max_length=4, probe_every=2, probe_max=8))
    for i in range(10):
        budget.time.observe(1 + i, 0.001 * (1 + i) * 50)
    losing, paying = [(["statistical"] * 4, [0.5] * 4)], [(["forced"] * 4, [1.0] * 4)]
    budget.step(losing, base_tokens=1, base_output=1, slot_cap=64)
    gaps = []
    for _ in range(5):
        n = 1
        while budget.build_length() == 0:
            n += 1
        gaps.append(n)
        budget.step(losing, base_tokens=1, base_output=1, slot_cap=64)
    assert gaps == [2, 4, 8, 8, 8], gaps
    budget.time = StepTimeModel()
    for i in range(10):
        budget.time.observe(1 + i, 0.010)  # verifying is free now: on
    budget.step(paying, base_tokens=1, base_output=1, slot_cap=64)
    assert budget.build_length() == 4 and budget._probe_interval == 2


def test_snapshot_is_plain_data():
    trace, budget = run_trace([(2, 30)])
    snap = budget.snapshot()
    assert snap["max_length"] == 8 and snap["time_model"]["in_use"] is True
    assert snap["counters"]["steps"] == 30 and snap["counters"]["tokens_offered"] >= snap["counters"]["tokens_kept"]
    assert set(snap["acceptance_per_position"]) == {"forced", "spelled", "statistical", "sampled", "base"}
    import json
    json.dumps(snap)


# --- the knob, the launch plan, the stats file and the metrics --------------------------------

from gpustack_dspark.knobs import KnobError, parse_knob_args  # noqa: E402
from gpustack_dspark.translate import Environment, plan_launch  # noqa: E402

CPU = Environment(device="cpu")


def plan(*flags):
    knobs, rest = parse_knob_args(["--enable-dspark", *flags])
    return plan_launch("/m", knobs, rest, config={"model_type": "llama"}, env=CPU)


def test_auto_length_turns_the_budget_on_in_the_layer_config():
    p = plan("--dspark-speculative-length=auto", "--dspark-speculative-max", "6")
    config = json.loads(p.vllm_argv[p.vllm_argv.index("--additional-config") + 1])["dspark_drafting"]
    spec = json.loads(p.vllm_argv[p.vllm_argv.index("--speculative-config") + 1])
    assert config["budget"] is True and config["length"] == 6 and spec["num_speculative_tokens"] == 6
    assert p.drafting["budget"] is True and "speculative_length=auto(max 6)" in p.startup_line()
    default = plan("--dspark-speculative-length", "AUTO")
    assert default.speculative_length == 8  # the max knob's default
    fixed = plan("--dspark-speculative-length=5")
    assert "budget" not in fixed.drafting and '"budget"' not in " ".join(fixed.vllm_argv)


@pytest.mark.parametrize("flags, message", [
    (["--dspark-speculative-length=aut"],
     "--dspark-speculative-length: 'aut' is not allowed; allowed: auto or an integer 1-16"),
    (["--dspark-speculative-length=auto", "--dspark-speculative-max=0"],
     "--dspark-speculative-max: '0' is not allowed; allowed: an integer 1-16"),
    (["--dspark-speculative-max=6"],
     "--dspark-speculative-max: 6 is not allowed (it bounds only the per-step budget of "
     "--dspark-speculative-length auto); allowed: leave it out, or set --dspark-speculative-length auto"),
    (["--dspark-speculative-length=auto", "--dspark-drafting=off"],
     "--dspark-speculative-length: 'auto' is not allowed (auto needs the drafting layer (or method dspark, "
     "whose adaptive verification sizes its drafts); here the layer is off: turned off (--dspark-drafting=off)); "
     "allowed: an integer 1-16"),
])
def test_bad_budget_knobs_say_field_value_and_what_is_allowed(flags, message):
    with pytest.raises(KnobError) as e:
        plan(*flags)
    assert str(e.value) == message


def test_yaml_takes_auto_like_the_flag():
    from gpustack_dspark.knobs import build_knobs

    knobs = build_knobs({"enable": True, "speculative_length": "auto", "speculative_max": 4})
    assert knobs.length_auto and knobs.speculative_max == 4


def test_the_stats_file_carries_the_snapshot_and_metrics_export_it(tmp_path):
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from gpustack_dspark.worker.drafting.budget_step import BudgetGlue
    from gpustack_dspark.worker.drafting.stats import (DraftingCounters, StatsWriter, metric_families,
                                                       read_budget, read_counters)

    glue = BudgetGlue(4)
    _, glue.budget = None, run_trace([(2, 30)])[1]
    counters = DraftingCounters(drafts=3)
    glue.sync(counters)
    path = tmp_path / "counters.json"
    StatsWriter(str(path)).maybe_write(counters, force=True, extra=glue.extra)
    assert read_counters(str(path)) == counters and counters.budget_steps == 30
    budget = read_budget(str(path))
    assert budget["counters"]["steps"] == 30 and budget["time_model"]["in_use"] is True

    class Collector:
        def collect(self):
            return metric_families(counters, "m", budget)

    registry = CollectorRegistry()
    registry.register(Collector())
    text = generate_latest(registry).decode()
    assert 'dspark_budget_steps_total{model_name="m"} 30.0' in text
    assert 'dspark_budget_speculating{model_name="m"} 1.0' in text
    assert 'dspark_draft_position_acceptance{kind="forced",model_name="m",position="1"} 1.0' in text
    assert "dspark_step_time_per_token_seconds" in text
    # A hostile or broken file is no snapshot.
    path.write_text('{"budget": [1, 2], "drafts": "x"}')
    assert read_budget(str(path)) is None and read_counters(str(path)) is None


def test_model_yaml_auto_becomes_the_flags():
    from pathlib import Path

    from gpustack_dspark.cli.modeldoc import parse_text

    doc = parse_text("name: x\nsource: local_path\nlocal_path: /m\ndspark:\n  speculative_length: auto\n"
                     "  speculative_max: 6\n", "m.yaml", Path("."))[0]
    assert doc.entry["backend_parameters"] == ["--enable-dspark", "--dspark-speculative-length=auto",
                                               "--dspark-speculative-max=6"]


# --- the benchmark model's recorded step times -----------------------------------------------
# T(batch, positions) of the expanded model (~100 M parameters' cost, tokens of the fixture),
# measured with tests.bench.step_time on real vLLM CPU: at batch 1 nine positions cost 1.14x
# one, at batch 16 3.0x. The budget, fed these step times, must verify long drafts where
# verifying is nearly free and short ones where every token costs.

EXPANDED = json.loads((Path(__file__).parent / "data" / "expanded_step_time.json").read_text())


def expanded_seconds(batch: int, positions: float) -> float:
    """The recorded step time at `batch`, linear between the measured positions."""
    row = sorted((r["positions"], r["ms"]) for r in EXPANDED["rows"] if r["batch"] == batch)
    for (p0, t0), (p1, t1) in zip(row, row[1:]):
        if positions <= p1:
            return (t0 + (t1 - t0) * (max(positions, p0) - p0) / (p1 - p0)) / 1e3
    return row[-1][1] / 1e3


def true_rate(batch: int, length: int, workload: str) -> float:
    """Expected output tokens per second with `length` draft tokens per request, for the true
    acceptance of SimulatedReplica's drafts."""
    kinds, _ = SimulatedReplica().draft(workload)
    survival, s = [], 1.0
    for kind in kinds[:length]:
        s *= SimulatedReplica.TRUE["text"] if workload == "text" else SimulatedReplica.TRUE[kind]
        survival.append(s)
    return batch * (1 + sum(survival)) / expanded_seconds(batch, 1 + length)


def run_on_expanded(batch: int, workload: str, steps: int = 300, seed: int = 0):
    """Draft tokens kept per request per step, after 100 steps of learning."""
    def recorded(replica, concurrency, kept):
        return expanded_seconds(concurrency, 1 + kept / concurrency) * (1.0 + 0.05 * (replica.rng.random() - 0.5))

    trace, _ = run_trace([(batch, steps, workload)], seed=seed, step_seconds=recorded)
    return [kept / batch for kept in phase(trace, 100, steps)]


@pytest.mark.parametrize("batch, workload", [(1, "json"), (1, "text"), (4, "json"), (8, "text"),
                                             (16, "json"), (16, "text")])
def test_on_the_benchmark_models_step_times_the_budget_is_within_5_percent_of_the_best_length(batch, workload):
    kept = run_on_expanded(batch, workload)
    best = max(true_rate(batch, length, workload) for length in range(9))
    # The mean length the budget verified, costed with the recorded step time.
    mean = sum(kept) / len(kept)
    low, high = math.floor(mean), math.ceil(mean)
    got = true_rate(batch, low, workload) + (true_rate(batch, high, workload) - true_rate(batch, low, workload)) * (mean - low)
    assert got >= 0.95 * best, (mean, got, best, [round(true_rate(batch, n, workload)) for n in range(9)])


def test_on_the_benchmark_models_step_times_drafts_are_long_alone_and_short_in_a_crowd():
    alone, crowd = run_on_expanded(1, "text"), run_on_expanded(16, "text")
    assert sum(alone) / len(alone) >= 3 > 1.5 >= sum(crowd) / len(crowd), (sum(alone) / len(alone), sum(crowd) / len(crowd))
    assert min(run_on_expanded(1, "json")) >= 7  # one JSON request: (nearly) the whole draft
