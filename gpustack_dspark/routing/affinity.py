"""Affinity: requests that share a schema or a prompt prefix go to the replica that already has
them, within a load bound (pure).

Why: a JSON workload repeats itself (one schema, one long system prompt, thousands of
requests). On the replica that served one of them the grammar is compiled (xgrammar and
llguidance cache it) and the prompt's prefix is in vLLM's prefix cache; any other replica pays
both again. Balancing by load alone spreads such requests evenly and so pays them everywhere.

Three pieces:

- `request_keys`: a request's affinity key from its body, without a tokenizer: the model, a
  hash of the schema it asks for (`response_format` json_schema, `structured_outputs` /
  `guided_json`, the parameters of `strict` tools) and a hash of its prompt's leading part —
  the messages before the last one (system prompt, instructions, examples), or the first
  bytes of a lone message or a `prompt` — in whole blocks of `BLOCK_BYTES`, up to
  `prefix_bytes`. A leading part shorter than one block does not key (not worth a cache);
  a request with neither schema nor prefix has no key and is balanced by load alone.
- `Ring`: consistent hashing over the candidate instances (`VNODES` points each), so a replica
  that leaves moves only its own keys and one that joins takes only its share.
- `choose`: bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018, as HAProxy's
  `hash-balance-factor`): from the key's place (where the `Ledger` settled it; a new key: its
  point on the ring) walk the ring and take the first instance whose in-flight is below its
  capacity, `ceil(max(load_bound x fair, fair + 2 sqrt(fair)))` with `fair = (total in flight
  + 1) x share`, where `share` is its slow-start weight over the candidates' sum (equal once
  warm: the mean): a hot key spills over to the next instance on the ring instead of piling up,
  no instance runs more than `load_bound` times the mean once many are in flight, and one
  ramping in takes less. The square-root term is the noise of a balanced count (`NOISE_SIGMAS`
  standard deviations): with few in flight per instance (4 in the benchmark's closed loop of 12
  over three) `load_bound` alone spills one request in eight on chance alone, each a cold
  prefix elsewhere. The other side: an instance whose level (in-flight averaged over about two
  request lifetimes of choices: the `Ledger`'s) stays within its share / `load_bound`, or below
  the place's by more than the noise band, takes a keyed request whose place's level is past its
  share (hot keys whose homes share two instances no longer leave the third idle), and the key
  settles there: its next requests find their prefix where the last one left it. On levels, not
  counts: a balanced closed loop's counts dip that low by chance, and a move on a dip pays a
  cold prefix for nothing. A move takes the key's load (its share of recent requests times all
  in flight) from one level to the other at once, so the next request does not see the taker
  as idle still and move a second key there (the benchmark's trace showed two moves in a row
  onto one replica, which ran 8 of 11 in flight ten choices later and spilled). Simulated
  on the benchmark's workload (30 Zipf keys, LRU prefix caches; a scratch script, not
  committed): the linear bound with the floor on counts, hit rate 0.87, in-flight max/min
  1.01–1.10; the noise band and levels, 0.94–0.96 and 1.13–1.30. On the unit tests' closed-loop
  traces (6, 12, 24, 30 in flight, six seeds each, Zipf s 1.0) the noise-band gap and the level
  shift send 2.1 % of requests elsewhere than their key's last instance (5.0 % before) at
  max/min 1.16 on average, 1.27 at worst (1.19, 1.52); with the keys' rates below, 1.3 % at
  1.09 and 1.20 (1.8 %, 1.17, 1.50 with them off; first 500 of 3,000 choices not counted: a
  scratch script, not committed). At a few in flight per instance none of
  that fires: counts and levels cannot tell the ring's uneven split of a Zipf load from noise,
  so each key stays where the ring put it. The keys' own rates (shares of recent choices, summed
  per instance by the `Ledger`) can: a key moves where the fewest keys live once its place's
  are past that one's by `RATE_MARGIN` of a fair share. Simulated (a scratch script: three
  replicas, LRU prefix caches, 30 Zipf keys, 24 seeds), Poisson arrivals at 0.2-1 in flight
  each: in-flight max/min median 2.61 -> 1.35, worst 6.69 -> 1.70, hit rate 0.938 -> 0.921; with
  a new popularity ranking every 220 requests (as the benchmark's runs on one server), median
  3.07 -> 1.49, over 2 in 59 -> 2 of 72 phases; a closed loop of 12, 1.44 -> 1.38, hit 0.929 ->
  0.918. Speed is not in the bound (the live
  estimates are noisy on CPU: twice another's after a few answers would let a home hold 8 of 9
  in flight); expected finish time still places every request without a key, and every keyed
  one when all are at their bound.
"""

import bisect
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from gpustack_dspark.routing.intent import requested_schema

BLOCK_BYTES = 256  # the unit a prefix keys in; a leading part below it does not key
VNODES = 64  # ring points per instance: an even split of keys within a few percent
# The in-flight noise of a balanced instance, in standard deviations: each of N requests in flight
# sits on an instance with probability `share`, so its count's standard deviation is at most
# sqrt(its fair share). The bound spills nothing within this band (its other side decides on
# averaged levels instead, which this noise hardly moves).
NOISE_SIGMAS = 2.0
# How far, in units of its fair share of recent choices, the keys living on an instance must be
# above another's, the key's own rate counted on the taker, before the key moves to even the two:
# about 1.7 standard deviations of the difference of two instances' key rates over
# `Ledger.RATE_CHOICES` choices at a third each (0.18). Noise moves a key now and then, never
# back and forth (each move lowers the sum of squares); a wider margin or a longer window left
# the ring's split standing longer after the popularity changed (simulated: 0.25 over 256
# choices, in-flight max/min over 2 in 16 of 36 phases after a new Zipf ranking; 0.30 over 64,
# 2 of 72).
RATE_MARGIN = 0.30


@dataclass(frozen=True)
class AffinityConfig:
    """`policies/routing.yaml` `proxy.affinity`."""

    enabled: bool = True
    load_bound: float = 1.5  # an instance takes a keyed request while in flight < bound x its fair share (or 2 sd)
    prefix_bytes: int = 4096  # how much of the prompt's leading part keys a request (whole blocks)


@dataclass(frozen=True)
class AffinityKey:
    """What a request shares with others: `point` places it on the ring."""

    model: str
    schema: Optional[str]  # hash of the schema (or strict tools), None if it asks for none
    prefix: Optional[str]  # hash of the leading part's whole blocks, None if shorter than one
    prefix_bytes: int = 0  # bytes of the leading part that keyed

    @property
    def point(self) -> int:
        return _hash64(f"{self.model}\x00{self.schema or ''}\x00{self.prefix or ''}")


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def schema_hash(body: Mapping[str, Any]) -> Optional[str]:
    """The schema the request's output must follow, or its strict tools' parameters, hashed."""
    schema = requested_schema(body)
    if schema is not None:
        return _digest(b"schema:" + _canonical(schema))
    strict = []
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and function.get("strict") is True:
            strict.append([function.get("name"), function.get("parameters")])
    return _digest(b"tools:" + _canonical(strict)) if strict else None


def _message_bytes(message: Any) -> bytes:
    if not isinstance(message, Mapping):
        return _canonical(message)
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text (an image part keys by its JSON)
        content = "".join(p.get("text", "") if isinstance(p, Mapping) and p.get("type") == "text" else
                          _canonical(p).decode() for p in content)
    role = message.get("role", "")
    return f"{role}\x00{content if isinstance(content, str) else _canonical(content).decode()}\x01".encode()


def leading_part(body: Mapping[str, Any]) -> bytes:
    """The part of a prompt that requests are likely to share: every message but the last (a
    lone message: all of it; a completion's `prompt`: all of it). Cut to blocks by the caller."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        lead = messages[:-1] if len(messages) > 1 else messages
        return b"".join(_message_bytes(m) for m in lead)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt.encode("utf-8", "surrogatepass")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return _canonical(prompt)  # token ids
    return b""


def prefix_hash(body: Mapping[str, Any], prefix_bytes: int) -> Tuple[Optional[str], int]:
    """(hash, bytes) of the leading part's whole blocks up to `prefix_bytes`; (None, 0) below one."""
    lead = leading_part(body)
    keyed = min(len(lead), max(0, prefix_bytes)) // BLOCK_BYTES * BLOCK_BYTES
    if keyed < BLOCK_BYTES:
        return None, 0
    return _digest(lead[:keyed]), keyed


def request_keys(model: Optional[str], body: Any, config: AffinityConfig) -> Optional[AffinityKey]:
    """The request's affinity key, or None (no schema and no prefix worth a cache, or off)."""
    if not config.enabled or not isinstance(body, Mapping) or not model:
        return None
    schema = schema_hash(body)
    prefix, keyed = prefix_hash(body, config.prefix_bytes)
    if schema is None and prefix is None:
        return None
    return AffinityKey(model, schema, prefix, keyed)


class Ring:
    """Consistent hashing over instance ids (`VNODES` points each)."""

    def __init__(self, instances: Iterable[int], vnodes: int = VNODES) -> None:
        points = sorted((_hash64(f"instance:{i}:{v}"), i) for i in set(instances) for v in range(vnodes))
        self._hashes = [h for h, _ in points]
        self._owners = [i for _, i in points]
        self.instances = frozenset(self._owners)

    def walk(self, point: int) -> List[int]:
        """Each instance once, in ring order from `point` (the first is the key's home)."""
        if not self._owners:
            return []
        start = bisect.bisect_left(self._hashes, point) % len(self._owners)
        seen: List[int] = []
        for n in range(len(self._owners)):
            owner = self._owners[(start + n) % len(self._owners)]
            if owner not in seen:
                seen.append(owner)
                if len(seen) == len(self.instances):
                    break
        return seen

    def home(self, point: int) -> Optional[int]:
        walked = self.walk(point)
        return walked[0] if walked else None


def fair_shares(candidates: Sequence[int], counts: Mapping[int, int],
                shares: Optional[Mapping[int, float]] = None) -> Dict[int, float]:
    """Per instance, its share of all in flight counting the new one: `(total + 1) x share`
    (`shares` default to equal: the mean)."""
    total = sum(max(0, counts.get(c, 0)) for c in candidates) + 1
    raw = {c: max(0.0, (shares or {}).get(c, 1.0)) for c in candidates}
    norm = sum(raw.values()) or 1.0
    return {c: total * raw[c] / norm for c in candidates}


def capacities(candidates: Sequence[int], counts: Mapping[int, int], load_bound: float,
               shares: Optional[Mapping[int, float]] = None) -> Dict[int, int]:
    """Per instance, how many requests it may hold in flight counting the new one:
    `ceil(max(load_bound x fair, fair + NOISE_SIGMAS x sqrt(fair)))`, at least 1, where `fair` is
    `(total + 1) x share`; `shares` default to equal."""
    return _capacities(fair_shares(candidates, counts, shares), load_bound)


def _capacities(fair: Mapping[int, float], load_bound: float) -> Dict[int, int]:
    return {c: max(1, math.ceil(max(load_bound * f, f + NOISE_SIGMAS * math.sqrt(f)) - 1e-9))
            for c, f in fair.items()}


@dataclass(frozen=True)
class Choice:
    instance: int
    home: int  # the key's place: where it lives now (the ledger's memory), else its ring point
    spilled: int  # how many instances before the chosen one were at capacity (or passed over)
    moved: bool = False  # the bound's other side took it: the key's place moves with it


def choose(ring: Ring, key: AffinityKey, candidates: Sequence[int], counts: Mapping[int, int],
           load_bound: float, shares: Optional[Mapping[int, float]] = None,
           place: Optional[int] = None, levels: Optional[Mapping[int, float]] = None,
           rates: Optional[Mapping[int, float]] = None, key_rate: float = 0.0) -> Optional[Choice]:
    """The first instance from the key's place (`place`, where the ledger last settled it, if a
    candidate; else its point on the ring), then on around the ring, whose in-flight is below
    its capacity; None when every candidate is at capacity (the caller balances by load).
    The bound's other side, on the instances' `levels` (their in-flight averaged over recent
    choices; the counts themselves when not given): when that instance's level is above its fair
    share while another's is within its fair share / `load_bound` (and its count within its share),
    the least loaded of those takes the request instead (`moved`: the key settles there): hot keys
    whose homes share a few instances would otherwise leave one nearly idle (in-flight averages
    5.2 / 4.8 / 1.8 at `load_bound` 1.5 in the benchmark). On levels, not counts: a closed loop's
    counts dip below the floor by chance (a balanced instance with a share of 4 sits at 0 or 1 in
    flight one choice in thirteen), and each such move costs a cold prefix.

    On levels, an instance also takes it when its level is below the place's, both in units of
    their fair shares, by more than the noise band (`NOISE_SIGMAS` / sqrt(its fair share); a
    ramping instance's small share keeps it out), not only when nearly idle: a lasting imbalance
    that the floor alone tolerates (levels 7.5 / 4.5 / 2.5 at 12 in flight) is evened out instead
    of leaving the busiest to spill. Whether the key fits the gap is not asked: a
    hot key is cached wherever it went lately, so moving it costs little, and a rule that kept
    hot keys home (tried: only a key whose share of requests fits the taker's share moves) let
    one dominant schema hold a replica at its bound while the others idled (max/min 30 on a
    trace where one key sends nearly every request).

    At any load, given the `rates` of the keys living on each instance (their shares of recent
    choices, summed per instance) and this key's `key_rate`: a request about to go home goes
    instead to the instance whose keys, this one's added, are fewest in units of its fair share,
    if that is below the home's by `RATE_MARGIN` or more, within its capacity, and not busier
    in flight than the home (levels in units of their fair shares: rates do not know speed,
    and the levels' rule moves keys off a slow replica, which this one would move back). At a
    few in flight per instance the counts and levels cannot tell the ring's uneven split of a
    skewed load from noise (Poisson arrivals at 0.2-1.0 in flight each: one replica held 3.4x
    another's); the rates can. Each such move lowers the sum of squares of the instances'
    rates, so keys do not pass back and forth, and a key too big for the gap (a dominant
    schema) stays. A key with no place yet settles there by the same test, as its home."""
    allowed = set(candidates)
    order = [i for i in ring.walk(key.point) if i in allowed]
    if not order:
        return None
    if place in allowed and order[0] != place:
        order.remove(place)
        order.insert(0, place)
    fair = fair_shares(order, counts, shares)  # once per request: this is the proxy's hot path
    caps = _capacities(fair, load_bound)
    placed = next((n for n, i in enumerate(order) if counts.get(i, 0) + 1 <= caps[i]), None)
    if placed is None:
        return None
    moved = False
    averaged = levels is not None
    if levels is None:
        levels, level_fair = counts, fair
    else:
        level_fair = fair_shares(order, levels, shares)
    # the key's place, in units of its fair share (slow start: a ramping instance's share is small)
    source = levels.get(order[0], 0) / level_fair[order[0]] if level_fair[order[0]] > 0 else 0.0

    def takes(i: int) -> bool:  # nearly idle, or (on levels) below the place past the noise band
        level, share = levels.get(i, 0), level_fair[i]
        return counts.get(i, 0) + 1 <= fair[i] and share > 0 and (
            level + 1 <= share / load_bound
            or (averaged and source - level / share >= NOISE_SIGMAS / math.sqrt(share)))

    if levels.get(order[placed], 0) + 1 > level_fair[order[placed]]:
        idle = [n for n, i in enumerate(order) if takes(i)]
        if idle:
            placed = min(idle, key=lambda n: ((counts.get(order[n], 0) + 1) / fair[order[n]], n))
            moved = True
    if rates is not None and placed == 0:
        norm = sum(fair.values())

        def keyed(i: int, extra: float = 0.0) -> float:  # keys living there, in units of its fair share
            return (rates.get(i, 0.0) + extra) * norm / fair[i] if fair[i] > 0 else math.inf

        home = keyed(order[0])
        evener = [n for n, i in enumerate(order) if n > 0 and counts.get(i, 0) + 1 <= caps[i]
                  and keyed(i, key_rate) <= home - RATE_MARGIN
                  and (levels.get(i, 0) / level_fair[i] if level_fair[i] > 0 else math.inf) <= source]
        if evener:
            placed = min(evener, key=lambda n: (keyed(order[n], key_rate), n))
            if place not in allowed:  # a key with no place yet: this is where it settles, its home
                return Choice(order[placed], order[placed], 0, True)
            moved = True
    return Choice(order[placed], order[0], placed, moved)


class Ledger:
    """The proxy's affinity state: rings by candidate set, counters, where each recent key lives
    (bounded), each instance's level (its in-flight averaged over recent choices: the floor's
    input), each remembered key's rate (its share of recent choices: the load a move carries)
    and, per instance, the sum of the rates of the keys living there (the rates' rule's input).
    A key settles where its first request went; only the bound's other side or the rates' rule
    moves it (a request sent elsewhere: the key follows it, so its next requests find their
    prefix there, and its load moves between the two levels at once, so the next choice does
    not see the taker as idle still) or its instance leaving. A spill past the upper bound is overflow and
    does not move it: a hot key's burst spreads, then comes home. Not thread-safe: the tracker
    holds its lock around it."""

    MAX_RINGS = 64
    MAX_KEYS = 4096  # keys whose place is remembered (least recently used forgotten first)
    OUTCOMES = ("home", "spilled", "all_full", "unkeyed")
    # An instance's level averages its in-flight over about this many times the number in flight
    # of recent choices: two request lifetimes in a closed loop, whatever the load.
    LEVEL_LIFETIMES = 2.0
    # A key's rate (its share of recent choices) averages over this many lifetimes, and over at
    # least `RATE_CHOICES` choices: longer than the levels', a share is steadier than an instance's
    # count (the hottest of the benchmark's 30 Zipf keys, 28 % of requests: a standard deviation of
    # 4 points over 64 choices), and at a few in flight a lifetime is a few choices only.
    KEY_LIFETIMES = 8.0
    RATE_CHOICES = 64.0

    def __init__(self) -> None:
        self._rings: Dict[frozenset, Ring] = {}
        self.outcomes: Dict[str, int] = {o: 0 for o in self.OUTCOMES}
        self.per_instance: Dict[int, Dict[str, int]] = {}
        self._place: Dict[int, int] = {}  # key point -> instance it lives on (insertion = last use)
        self.levels: Dict[int, float] = {}  # instance -> its in-flight averaged over recent choices
        # key point -> (its share of choices, the decay clock then): an exponential average kept
        # lazily, so a choice costs O(1) however many keys are remembered
        self._rates: Dict[int, Tuple[float, float]] = {}
        # instance -> (the rates of the keys living there, summed; the clock then), kept the same way
        self._placed: Dict[int, Tuple[float, float]] = {}
        self._decay = 0.0  # sum over choices of -log(1 - the key rates' weight then)

    def observe(self, candidates: Sequence[int], counts: Mapping[int, int]) -> float:
        """One choice among `candidates` (keyed or not): each one's level moves toward its count
        by 1 / (`LEVEL_LIFETIMES` x (all in flight + 1)); a new instance starts at its count.
        Returns the key rates' weight of this choice, 1 / max(`KEY_LIFETIMES` x (all in flight
        + 1), `RATE_CHOICES`), by which the decay clock has moved."""
        total = sum(max(0, counts.get(c, 0)) for c in candidates) + 1
        weight = 1.0 / (self.LEVEL_LIFETIMES * total)
        rate_weight = 1.0 / max(self.KEY_LIFETIMES * total, self.RATE_CHOICES)
        self._decay -= math.log1p(-rate_weight)
        for c in candidates:
            count = max(0, counts.get(c, 0))
            level = self.levels.get(c)
            self.levels[c] = float(count) if level is None else level + (count - level) * weight
        return rate_weight

    def _now(self, entry: Optional[Tuple[float, float]]) -> float:
        """A lazily decayed average's value now."""
        return 0.0 if entry is None else entry[0] * math.exp(entry[1] - self._decay)

    def _add(self, instance: int, amount: float) -> None:
        self._placed[instance] = (max(0.0, self._now(self._placed.get(instance)) + amount), self._decay)

    def ring(self, candidates: Sequence[int]) -> Ring:
        members = frozenset(candidates)
        ring = self._rings.get(members)
        if ring is None:
            if len(self._rings) >= self.MAX_RINGS:
                self._rings.pop(next(iter(self._rings)))
            ring = self._rings[members] = Ring(members)
        return ring

    def choose(self, key: AffinityKey, candidates: Sequence[int], counts: Mapping[int, int], load_bound: float,
               shares: Optional[Mapping[int, float]] = None) -> Optional[int]:
        """The instance for a keyed request, or None when all are at capacity (counted)."""
        weight = self.observe(candidates, counts)
        before = place = self._place.pop(key.point, None)
        # rates as shares of recent choices: divided by the weight all choices carry now (below 1
        # for the first `RATE_CHOICES` or so, when every rate is still short by that factor)
        mass = self.window
        old = self._now(self._rates.get(key.point))
        rate = (old + weight) / mass
        # the in-flight its requests bring: its share of choices times all in flight (by levels)
        load = rate * (sum(self.levels.get(c, 0.0) for c in candidates) + 1)
        living = {c: self._now(self._placed.get(c)) / mass for c in candidates}  # keys living there
        choice = choose(self.ring(candidates), key, candidates, counts, load_bound, shares, place, self.levels,
                        living, rate)
        if choice is None:
            self.outcomes["all_full"] += 1
        else:
            outcome = "home" if choice.spilled == 0 else "spilled"
            self.outcomes[outcome] += 1
            entry = self.per_instance.setdefault(choice.instance, {"home": 0, "spilled_in": 0})
            entry["home" if outcome == "home" else "spilled_in"] += 1
            if choice.moved:  # its load follows it now: the next choice sees the target less idle
                self.levels[choice.instance] = self.levels.get(choice.instance, 0.0) + load
                if place is not None and place != choice.instance and place in self.levels:
                    self.levels[place] = max(0.0, self.levels[place] - load)
            if place is None or choice.moved:
                place = choice.instance
        if before is not None:
            self._add(before, -old)
        if place is None:
            self._rates.pop(key.point, None)
            return None
        self._rates[key.point] = (old + weight, self._decay)
        self._add(place, old + weight)
        self._place[key.point] = place  # re-inserted: the most recently used
        if len(self._place) > self.MAX_KEYS:
            self._drop(next(iter(self._place)))
        return None if choice is None else choice.instance

    @property
    def window(self) -> float:
        """The weight all choices in the key rates' window carry now: a rate divided by it is a
        share of recent choices (below 1 for the first `RATE_CHOICES` or so)."""
        return -math.expm1(-self._decay)

    def keyed_share(self, instance: int) -> Optional[float]:
        """The rates of the keys living on `instance`, summed: their share of recent choices."""
        entry = self._placed.get(instance)
        return None if entry is None or self._decay <= 0 else self._now(entry) / self.window

    def resume(self, levels: Mapping[int, float], keyed_shares: Mapping[int, float], window: float) -> None:
        """Takes up another ledger's state as its status shows it (`levels`, `keyed_share` per
        instance, `window`), to replay what it will choose for keys it has not seen (the e2e test)."""
        self.levels.update(levels)
        self._decay = -math.log1p(-min(max(window, 0.0), 1.0 - 1e-12))
        self._placed = {i: (share * window, self._decay) for i, share in keyed_shares.items()}

    def _drop(self, point: int) -> None:
        """Forgets a key: its place, its rate, and that rate from its place's sum."""
        place = self._place.pop(point, None)
        rate = self._now(self._rates.pop(point, None))
        if place is not None and place in self._placed:
            self._add(place, -rate)

    def unkeyed(self, candidates: Sequence[int], counts: Mapping[int, int]) -> None:
        self.observe(candidates, counts)
        self.outcomes["unkeyed"] += 1

    def keys_per_instance(self) -> Dict[int, int]:
        out: Dict[int, int] = {}
        for instance in self._place.values():
            out[instance] = out.get(instance, 0) + 1
        return out

    def snapshot(self) -> Dict[str, Any]:
        keys = self.keys_per_instance()
        return {"outcomes": dict(self.outcomes),
                "instances": {i: {**v, "keys": keys.get(i, 0)} for i, v in sorted(self.per_instance.items())},
                "keys_remembered": len(self._place), "rate_window": self.window}

    def forget(self, keep: Iterable[int]) -> None:
        keep = set(keep)
        for instance in [i for i in self.per_instance if i not in keep]:
            self.per_instance.pop(instance, None)
        for point in [p for p, i in self._place.items() if i not in keep]:
            self._drop(point)
        for instance in [i for i in self.levels if i not in keep]:
            self.levels.pop(instance, None)
        for instance in [i for i in self._placed if i not in keep]:
            self._placed.pop(instance, None)
        for members in [m for m in self._rings if not m <= keep]:
            self._rings.pop(members, None)


__all__ = ["AffinityConfig", "Ledger", "AffinityKey", "BLOCK_BYTES", "Choice", "NOISE_SIGMAS", "Ring", "VNODES",
           "capacities", "choose", "fair_shares", "leading_part", "prefix_hash", "request_keys",
           "schema_hash"]
