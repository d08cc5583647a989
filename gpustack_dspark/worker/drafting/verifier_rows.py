"""What the target model itself said after each context: the proposal for drawn draft tokens. Pure.

Why: a drawn draft token is kept with probability sum(min(p, q)), p the target's distribution
there and q the one it was drawn from (draft_probs.py). Continuation counts of past outputs
(ngram_index.interpolated) estimate the model's distribution after the last tokens from one
sampled token per reply; the verifier computes the whole distribution p at every draft
position it checks. Averaged per context, those rows converge to the model's mean distribution
there, the best any q over the last tokens can do (offline, order JSON at temperature 0.7: kept
0.66 of the time at value tokens, against 0.46 from the counts), in a few replies instead of
hundreds. The rows are the verifier's processed distributions (temperature, top-k/top-p and
the grammar applied), so each sampling setting keeps its own table (`Tables`).

Exact whatever the rows say: q is computed before its token is drawn, from rows of earlier
steps only, and the verifier checks the token against that q.

Interpolation (`proposal`), longest context first: a context with r rows (decayed) keeps
r / (r + prior_rows) of the mass that is left for its mean row and passes the rest on; what
no context takes goes to the counts' distribution (the fallback), so a context the verifier
has not seen yet draws as before. The estimate that the token is kept is the context's own
record: before each row is added, the mean row as it stood then is scored against it,
sum(min(row, mean)) — how well this q would have done on that row, never on rows it was
built from.
"""

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Dict, Hashable, Optional, Sequence, Tuple

Row = Tuple[Tuple[int, ...], Tuple[float, ...]]  # the verifier's top tokens there and their probabilities
Proposal = Tuple[Dict[int, float], float]        # weights of the next token, estimate it is kept


@dataclass
class Entry:
    """One context's decayed sums: probability per token, rows, and the out-of-sample overlap.
    Decay is lazy: each new row is added at weight `unit`, which grows by 1 / forgetting per
    row (the sums are rescaled when it gets large), so adding a row never touches the others."""
    sums: Dict[int, float] = field(default_factory=dict)
    total: float = 0.0
    weight: float = 0.0      # rows, scaled by `unit`
    overlap: float = 0.0     # scores, scaled by `unit`
    scored: float = 0.0      # rows scored, scaled by `unit`
    unit: float = 1.0

    @property
    def rows(self) -> float:
        """Decayed row count (the latest row counts 1)."""
        return self.weight / self.unit

    def mean(self) -> Dict[int, float]:
        return {token: value / self.total for token, value in self.sums.items()} if self.total > 0 else {}

    def score(self, row: Row) -> Optional[float]:
        """sum(min(row, this context's mean row)) before the row is added; None without rows."""
        if self.total <= 0:
            return None
        sums, total = self.sums, self.total
        return sum(min(prob, sums.get(token, 0.0) / total) for token, prob in zip(*row))

    def add(self, row: Row, forgetting: float, keep: int) -> None:
        scored = self.score(row)
        self.unit /= forgetting
        unit = self.unit
        if scored is not None:
            self.overlap += scored * unit
            self.scored += unit
        for token, prob in zip(*row):
            if prob > 0.0:
                self.sums[token] = self.sums.get(token, 0.0) + prob * unit
                self.total += prob * unit
        self.weight += unit
        if len(self.sums) > 2 * keep:
            self.sums = dict(sorted(self.sums.items(), key=lambda kv: -kv[1])[:keep])
            self.total = sum(self.sums.values())
        if unit > 1e6:
            self.sums = {token: value / unit for token, value in self.sums.items()}
            self.total, self.weight, self.overlap, self.scored = (
                self.total / unit, self.weight / unit, self.overlap / unit, self.scored / unit)
            self.unit = 1.0


@dataclass(frozen=True)
class RowsConfig:
    max_n: int = 3              # context lengths 1..max_n
    capacity: int = 32768       # contexts kept (least recently added evicted)
    keep: int = 48              # tokens kept per context (the lightest dropped past twice this)
    prior_rows: float = 2.0     # a context with r rows keeps r / (r + prior_rows) of the mass left
    forgetting: float = 0.98    # weight kept per new row at a context (about the last 50)
    rest: float = 0.03          # stop walking once less than this mass is left


class VerifierRows:
    """context (the last n tokens, n = 1..max_n) -> the verifier's rows there, averaged."""

    def __init__(self, config: RowsConfig = RowsConfig()) -> None:
        self.config = config
        self.table: "OrderedDict[Tuple[int, ...], Entry]" = OrderedDict()
        self.rows_added = 0

    def add(self, context: Sequence[int], row: Row) -> None:
        c = self.config
        if not row[0]:
            return
        self.rows_added += 1
        for n in range(1, min(c.max_n, len(context)) + 1):
            key = tuple(context[len(context) - n:])
            entry = self.table.get(key)
            if entry is None:
                entry = self.table[key] = Entry()
                if len(self.table) > c.capacity:
                    self.table.popitem(last=False)
            else:
                self.table.move_to_end(key)
            entry.add(row, c.forgetting, c.keep)

    def proposal(self, context: Sequence[int], fallback: Callable[[], Optional[Proposal]]) -> Optional[Proposal]:
        """Weights of the next token and the estimate it is kept (module docstring); None when
        neither the rows nor the fallback know this context."""
        c = self.config
        dist: Dict[int, float] = {}
        mass, estimate = 1.0, None
        for n in range(min(c.max_n, len(context)), 0, -1):
            entry = self.table.get(tuple(context[len(context) - n:]))
            if entry is None or entry.total <= 0:
                continue
            if estimate is None and entry.scored > 0:
                estimate = entry.overlap / entry.scored
            rows = entry.rows
            keep = mass * rows / (rows + c.prior_rows)
            for token, prob in entry.mean().items():
                dist[token] = dist.get(token, 0.0) + keep * prob
            mass -= keep
            if mass < c.rest:
                break
        fallen = fallback() if mass >= c.rest else None  # (no rows here: mass is still 1)
        if fallen:
            weights, counted = fallen
            for token, prob in weights.items():
                dist[token] = dist.get(token, 0.0) + mass * prob
            if estimate is None:
                estimate = counted
        if not dist:
            return None
        if estimate is None:  # rows, none scored yet, and no counts: as sure as the rows are many
            estimate = 1.0 - mass
        total = sum(dist.values())
        return {token: prob / total for token, prob in dist.items()}, estimate


class Tables:
    """One VerifierRows per sampling setting (temperature, top-p, top-k): the rows are the
    processed distributions, which differ between settings. The last `limit` settings kept."""

    def __init__(self, limit: int = 8, config: RowsConfig = RowsConfig()) -> None:
        self.limit, self.config = limit, config
        self.tables: "OrderedDict[Hashable, VerifierRows]" = OrderedDict()

    def get(self, setting: Hashable) -> VerifierRows:
        table = self.tables.get(setting)
        if table is None:
            table = self.tables[setting] = VerifierRows(self.config)
            if len(self.tables) > self.limit:
                self.tables.popitem(last=False)
        else:
            self.tables.move_to_end(setting)
        return table

    def rows_added(self) -> int:
        return sum(t.rows_added for t in self.tables.values())


def setting_of(sampling_params) -> Tuple[float, float, int]:
    """The sampling setting a request's rows belong to."""
    return (round(float(getattr(sampling_params, "temperature", 1.0) or 0.0), 4),
            round(float(getattr(sampling_params, "top_p", 1.0) or 1.0), 4),
            int(getattr(sampling_params, "top_k", 0) or 0))


def rows_by_request(req_ids: Sequence[str], num_draft_tokens: Sequence[int], tokens: Sequence[Sequence[int]],
                    probs: Sequence[Sequence[float]], wanted: Dict[str, Sequence[object]]
                    ) -> Dict[str, Dict[int, Row]]:
    """The verifier's rows (top tokens and probabilities, one per draft position, in the batch's
    order: requests with drafts, their positions in order) for the positions `wanted` marks
    (request id -> per position, None: not wanted), as request id -> position -> row."""
    out: Dict[str, Dict[int, Row]] = {}
    start = 0
    for rid, n in zip(req_ids, num_draft_tokens):
        marks = wanted.get(rid)
        if marks:
            for pos in range(min(n, len(marks))):
                if marks[pos] is not None and start + pos < len(tokens):
                    kept = [(t, p) for t, p in zip(tokens[start + pos], probs[start + pos]) if p > 0.0]
                    if kept:
                        out.setdefault(rid, {})[pos] = (tuple(t for t, _ in kept), tuple(p for _, p in kept))
        start += n
    return out
