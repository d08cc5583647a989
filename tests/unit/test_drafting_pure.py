"""The drafting layer's pure parts: the n-gram index and the draft builder's rules.

The grammar here is a small scripted walker over a fixed document (a test double for
xgrammar's matcher, which lives in the worker venv; the integration tests use the real one).
"""

from gpustack_dspark.worker.drafting.draft_builder import FORCED, SPELLED, STATISTICAL, DraftPolicy, Spellings, build_draft
from gpustack_dspark.worker.drafting.ngram_index import NgramIndex, RequestHistory, SharedHistory, predict, tail
from gpustack_dspark.worker.drafting.stats import DraftingCounters, StatsWriter, read_counters


class ScriptedGrammar:
    """Accepts exactly `document` (a token list); `forced` maps positions to forced strings."""

    def __init__(self, document, forced, stop=99):
        self.document, self.forced, self.stop = list(document), dict(forced), stop
        self.position = 0
        self.max_position = 0

    def accept_token(self, token):
        expected = self.document[self.position] if self.position < len(self.document) else self.stop
        if token != expected or self.position > len(self.document):
            return False
        self.position += 1
        self.max_position = max(self.max_position, self.position)
        return True

    def rollback(self, n):
        assert n <= self.position
        self.position -= n

    def find_jump_forward_string(self):
        # Forced spans are given as {start: text}, one token per character (see encode);
        # like xgrammar, the remaining forced text from the current position.
        for start, text in self.forced.items():
            if start <= self.position < start + len(text):
                return text[self.position - start:]
        return ""

    def is_completed(self):
        return self.position == len(self.document)

    def is_terminated(self):
        return self.position > len(self.document)

    def only_allowed_token(self):
        return self.stop


def encode(text):
    return [ord(c) for c in text]


def test_index_counts_and_forgets():
    index = NgramIndex(max_n=2)
    index.add([1, 2, 3, 1, 2, 4])
    assert index.table[(1, 2)] == {3: 1, 4: 1}
    index.remove([1, 2, 3, 1, 2, 4])
    assert index.table == {}


def test_predict_prefers_longest_context_and_is_never_certain():
    index = NgramIndex(max_n=3)
    index.add([5, 1, 2, 7, 9, 1, 2, 8, 5, 1, 2, 7])
    token, p = predict([5, 1, 2], [index])
    assert token == 7 and p == 2 / 3  # (5,1,2) -> 7 twice: 2 / (2 + 1)
    token, p = predict([9, 1, 2], [index])
    assert token == 8  # (9,1,2) seen once -> 8
    assert predict([42], [index]) is None


def test_request_and_shared_histories_grow_and_evict():
    history = RequestHistory(max_n=2, prompt_len=3)
    history.update([1, 2, 3])
    history.update([1, 2, 3, 1, 2])
    assert history.indexed == 5 and history.prompt.table[(1, 2)] == {3: 1}
    assert history.reply.table[(3, 1)] == {2: 1} and (3, 1) not in history.prompt.table
    shared = SharedHistory(max_n=2, capacity=1)
    shared.add_output([4, 5, 6])
    shared.add_output([7, 8, 9])
    assert (4, 5) not in shared.index.table and shared.index.table[(7, 8)] == {9: 1}
    assert tail([1, 2, 3], [4], 3) == [2, 3, 4]


def test_forced_tokens_first_then_statistical_then_forced_again():
    # {"a":<value 1 2>,"b":  -> forced '{"a":' at 0, free value, forced ',"b":' after it.
    doc = encode('{"a":') + [1, 2] + encode(',"b":')
    grammar = ScriptedGrammar(doc, {0: '{"a":', 7: ',"b":'})
    def guess(draft):  # knows the value tokens only
        return (doc[len(draft)], 0.9) if len(draft) in (5, 6) else None

    draft = build_draft(grammar, encode, guess, DraftPolicy(length=16, threshold=0.3))
    assert draft.tokens == doc + [99]  # the stop token once the document is complete
    assert draft.kinds == [FORCED] * 5 + [STATISTICAL] * 2 + [FORCED] * 6
    assert grammar.position == 0, "the grammar is rolled back"


def test_threshold_cuts_at_cumulative_confidence_and_forced_only_mode():
    doc = encode('{"a":') + [1, 2, 3]
    grammar = ScriptedGrammar(doc, {0: '{"a":'})
    draft = build_draft(grammar, encode, lambda _: ((doc + [0])[5 + len(_) - 5], 0.6),
                        DraftPolicy(length=16, threshold=0.5))
    # 0.6 passes, 0.6 * 0.6 = 0.36 is below 0.5: one statistical token, then the cut.
    assert draft.kinds == [FORCED] * 5 + [STATISTICAL] and draft.cut_by_threshold
    draft = build_draft(grammar, encode, lambda _: (1, 0.99), DraftPolicy(length=16, threshold=0.3, statistical=False))
    assert draft.kinds == [FORCED] * 5 and not draft.cut_by_threshold
    draft = build_draft(grammar, encode, lambda _: (1, 0.99), DraftPolicy(length=3, threshold=0.3))
    assert len(draft.tokens) == 3, "never longer than the speculative length"


def test_forced_text_is_spelled_the_way_the_model_spelled_it_before():
    # The grammar forces "ab"; canonical split: "a", "b"; the history knows the model writes
    # it as one token 300 ("ab"). The guess is taken because its text is a prefix of the forced text.
    texts = {300: "ab", 301: "zz"}
    doc = [300]
    grammar = ScriptedGrammar(doc, {0: "ab"})
    draft = build_draft(grammar, encode, lambda _: (300, 0.4), DraftPolicy(length=4, threshold=0.9, statistical=False),
                        token_text=lambda t: texts.get(t, chr(t) if t < 256 else ""))
    assert draft.tokens[:1] == [300] and draft.kinds[:1] == [FORCED]
    # A guess that does not spell the forced text is ignored: the canonical split is used.
    grammar = ScriptedGrammar(encode("ab"), {0: "ab"})
    draft = build_draft(grammar, encode, lambda _: (301, 0.9), DraftPolicy(length=2, threshold=0.1, statistical=False),
                        token_text=lambda t: texts.get(t, ""))
    assert draft.tokens == encode("ab") and draft.kinds == [FORCED, FORCED]


def test_a_forced_token_is_forced_only_when_no_other_spelling_is_allowed():
    # Vocabulary: single characters, plus '",' and 'ab' (and 'abc', which runs past "ab").
    vocab = [(ord(c), c) for c in '{}",:ab'] + [(300, '",'), (301, "ab"), (302, "abc"), (303, "\ufffd")]
    spellings = Spellings(vocab)
    # Before '",' two tokens are allowed: '"' alone and '",'.
    assert not spellings.sole('",', '"') and not spellings.sole('",', '",')
    # ':' is the only token spelling a piece of ':' (nothing longer starts with it).
    assert spellings.sole(':', ':')
    # 'ab' could also be written 'abc' if the grammar allowed a 'c' after it: not sole.
    assert not spellings.sole("ab", "ab")
    assert spellings.sole("{:", "{") and not spellings.sole("{:", "}")  # '}' spells no piece of it
    # In a draft: the canonical '{' is forced, the '"' before ',' is spelled; the stop token forced.
    doc = encode('{"')
    grammar = ScriptedGrammar(doc, {0: '{"'})
    draft = build_draft(grammar, encode, lambda _: None, DraftPolicy(length=8, threshold=0.3),
                        token_text=lambda t: dict(vocab).get(t, ""), spellings=Spellings(vocab + [(304, '"x')]))
    assert draft.tokens == doc + [99] and draft.kinds == [FORCED, SPELLED, FORCED]


def test_statistical_guess_the_grammar_refuses_ends_the_draft():
    grammar = ScriptedGrammar([1, 2], {})
    draft = build_draft(grammar, encode, lambda _: (7, 0.9), DraftPolicy(length=8, threshold=0.1))
    assert draft.tokens == [] and grammar.position == 0


def test_counters_summary_and_file_round_trip(tmp_path):
    counters = DraftingCounters(forced_proposed=12, forced_accepted=9, forced_rejected=1,
                                target_forward_passes=4, output_tokens=13)
    summary = counters.summary()
    assert summary["tokens_per_forward"] == 3.25 and summary["forced_acceptance"] == 0.9
    assert summary["statistical_acceptance"] is None
    path = tmp_path / "counters.json"
    StatsWriter(str(path)).maybe_write(counters, force=True)
    assert read_counters(str(path)) == counters
    assert read_counters(str(tmp_path / "missing.json")) is None


def test_the_step_profile_splits_a_steps_time_and_counts_only_closed_steps():
    from gpustack_dspark.worker.drafting.scheduler import StepClock
    from gpustack_dspark.worker.drafting.stats import DraftingCounters

    counters = DraftingCounters()
    clock = StepClock(counters)
    assert counters.step_profile() is None
    for start in (0.0, 1.0):
        clock.open(start)
        clock.add("layer_us", 0.001)
        clock.add("mask_us", 0.002)
        clock.add("vllm_scheduler_us", 0.003)
        clock.add("draft_check_us", 0.0005)
        clock.close(start + 0.010)
    clock.close(7.0)  # closing again counts nothing more
    profile = counters.step_profile()
    assert profile["steps"] == 2 and profile["step_ms"] == 10.0
    assert profile["share"] == {"layer": 0.1, "draft_check": 0.05, "grammar_masks": 0.2, "vllm_scheduler": 0.3,
                                "forward_and_rest": 0.35}
    counters = DraftingCounters()
    clock = StepClock(counters)
    clock.open(0.0)
    clock.add("layer_us", 0.001)
    clock.open(0.5)  # reopened before drafts: the first step is dropped
    clock.add("mask_us", 0.002)
    clock.close(0.51)
    profile = counters.step_profile()
    assert profile["steps"] == 1 and profile["step_ms"] == 10.0
    assert profile["ms_per_step"] == {"layer": 1.0, "draft_check": 0.0, "grammar_masks": 2.0,
                                      "vllm_scheduler": 0.0, "forward_and_rest": 7.0}
    assert profile["share"]["forward_and_rest"] == 0.7


def test_the_prompt_and_reply_indexes_predict_as_one_index_of_all_the_tokens_did():
    """Splitting the request's index in two (for the sources) changes no prediction: the counts
    merged over prompt + reply are the counts of one index over all the tokens, whatever the
    split point and however the tokens arrive."""
    import random

    from gpustack_dspark.worker.drafting.ngram_index import interpolated

    rng = random.Random(7)
    for _ in range(200):
        tokens = [rng.randrange(6) for _ in range(rng.randrange(2, 40))]
        prompt_len = rng.randrange(0, len(tokens) + 1)
        whole = NgramIndex(max_n=3)
        whole.add(tokens)
        split = RequestHistory(max_n=3, prompt_len=prompt_len)
        grown = 0
        while grown < len(tokens):  # fed as a request grows: the prompt, then a few tokens a step
            grown = max(prompt_len, grown + rng.randrange(1, 4)) if grown else max(prompt_len, 1)
            split.update(tokens[:grown])
        for n in range(1, 4):
            context = [rng.randrange(6) for _ in range(n)]
            assert predict(context, [whole]) == predict(context, [split.prompt, split.reply])
            assert interpolated(context, [whole]) == interpolated(context, [split.prompt, split.reply])


def test_a_drafted_tokens_source_is_the_index_that_saw_it_after_the_longest_context():
    from gpustack_dspark.worker.drafting.ngram_index import LEARNED, source

    prompt, reply, history = NgramIndex(3), NgramIndex(3), NgramIndex(3)
    prompt.add([10, 11, 12, 13])   # the prompt: "... 11 12 13"
    reply.add([11, 12, 14])        # the reply so far wrote 14 after "11 12" once
    history.add([12, 14, 12, 14])  # earlier replies: 14 after 12 twice
    named = (("prompt", prompt), ("reply", reply), ("history", history))
    assert source([10, 11, 12], 13, named) == "prompt"  # the longest context that saw 13: the prompt's
    assert source([9, 11, 12], 14, named) == "reply"  # (11, 12) -> 14: the reply only
    assert source([9, 9, 12], 14, named) == "history"  # (12,) -> 14: history twice, reply never
    assert source([9, 9, 12], 99, named) == LEARNED  # in no index
    again = NgramIndex(3)
    again.add([7, 12, 14, 12, 14])  # (12,) -> 14 twice, as in history: a tie goes to the first named
    assert source([9, 9, 12], 14, (("history", history), ("reply", again))) == "history"
    assert source([9, 9, 12], 14, (("reply", again), ("history", history))) == "reply"


def test_the_counters_add_up_by_source():
    from gpustack_dspark.worker.drafting.stats import DraftingCounters

    counters = DraftingCounters(statistical_proposed=5, prompt_proposed=3, history_proposed=2, prompt_accepted=2,
                                prompt_rejected=1)
    summary = counters.summary()
    assert summary["prompt_acceptance"] == round(2 / 3, 4) and summary["history_acceptance"] is None
