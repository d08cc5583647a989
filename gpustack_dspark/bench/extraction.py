"""Extraction requests with a known truth (pure): seeded tasks, their request bodies, and the
field-by-field score of a reply.

Why: a benchmark or the demo that replays the same prompts measures a warm cache, and one
that only checks "the reply is valid JSON" cannot tell a right answer from a well-formed wrong
one. Each `Task` here is written from a record (`truth`) drawn from plain word lists by a seed,
so a fresh seed gives requests no replica has seen, and a reply can be scored against the
record leaf by leaf. The tasks are kept simple for a small instruct model (SmolLM2-135M): a
short paragraph that states every value literally (numbers and dates exactly as the record
writes them), one worked example from a different seed as a user/assistant turn before it, and
a schema with bounded strings and arrays so a weak model cannot loop. The example is drawn per
request (`example="per-request"`, the default) or is one per family (`"per-family"`), as an
application's fixed few-shot prompt is: then every request of a family shares the prompt up to
its own text (what a server's prefix cache can hold), and the text is still new.

Contract:
- `task(family, seed)` is a function of its arguments: the same seed gives the same task, in
  any process. `tasks(seed, count)` takes the families in turn, task i from its own seed derived
  from (seed, i); its user texts are all different, and `task(t.family, t.seed)` rebuilds `t`.
- `truth` is valid under `schema`; the schemas use only what vLLM's grammar engines compile
  (type, properties, required, additionalProperties false, enum, min/maxItems,
  minimum/maximum, string maxLength, or an anchored fixed-length pattern without length bounds).
- `score` compares leaves (strings case- and whitespace-insensitively, numbers numerically,
  booleans and enum values exactly, arrays by position, objects by key); `summarize` adds the
  scores up with a Wilson interval over fields (fields of one reply are not independent, so the
  interval is narrower than it should be: read it as a guide); `score_results` scores a run's
  answered results (`load.Result`, whose `index` names the task).
- No I/O: callers send the bodies (`load.run_load`) and pass back `Result.content` and
  `Result.finish_reason`. jsonschema (the `bench` extra) is imported by `score` only.
"""

import copy
import datetime
import hashlib
import json
import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

FAMILIES: Tuple[str, ...] = ("order", "invoice", "contact", "ticket", "event", "product")
# Where a task's worked example is drawn from: its own seed, or its family (one per family).
PER_REQUEST, PER_FAMILY = "per-request", "per-family"
EXAMPLES: Tuple[str, ...] = (PER_REQUEST, PER_FAMILY)
EXAMPLE_HELP = ("extraction: each request's worked example drawn for it (per-request, the default), or one per "
                "family as an application's fixed few-shot prompt (a family's requests then share their prompt "
                "up to the text, which a prefix cache can hold; --warmup fills it)")
CURRENCIES = ("USD", "EUR", "GBP")
PRIORITIES = ("low", "medium", "high", "urgent")
CATEGORIES = ("billing", "technical", "account", "shipping")
TAGS = ("kitchen", "outdoor", "kids", "gift", "eco", "sale", "new", "wireless", "travel", "office")
# How each boolean is said: (sentences for true, sentences for false); no sentence of one side
# is part of a sentence of the other.
BOOL_PHRASES: Dict[Tuple[str, str], Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    ("ticket", "refund_requested"): (("The customer wants a refund.", "A refund is requested."),
                                     ("No refund is needed.", "The customer does not ask for a refund.")),
    ("product", "in_stock"): (("It is in stock.", "Available now: in stock."),
                              ("It is out of stock.", "Sold out at the moment.")),
}
Z95 = 1.959963984540054

_FIRST = ("Anna", "Ben", "Carla", "David", "Elena", "Frank", "Grace", "Hugo", "Irene", "James", "Karin",
          "Leo", "Maria", "Nina", "Oscar", "Paula", "Quentin", "Rosa", "Samuel", "Tina", "Victor", "Wendy",
          "Yusuf", "Zoe")
_LAST = ("Schmidt", "Brown", "Garcia", "Novak", "Rossi", "Kim", "Larsen", "Dubois", "Silva", "Meyer",
         "Walsh", "Okafor", "Jensen", "Moreau", "Fischer", "Patel", "Costa", "Nilsson", "Becker", "Ward")
_CITIES = ("Berlin", "Leeds", "Lyon", "Porto", "Oslo", "Dublin", "Vienna", "Madrid", "Denver", "Austin",
           "Toronto", "Seattle", "Milan", "Prague", "Zurich", "Boston", "Cork", "Ghent", "Turin", "Bristol")
_STREETS = ("Maple Street", "Oak Avenue", "River Road", "Hill Lane", "Park Street", "Mill Road",
            "Station Road", "Church Lane", "Elm Street", "Harbor Drive", "King Street", "Garden Way")
_COMPANIES = ("Northwind Traders", "Blue Harbor Foods", "Acme Tools", "Greenfield Supplies",
              "Silver Peak Software", "Redwood Logistics", "Brightline Media", "Oakridge Farms",
              "Summit Office", "Clearwater Labs", "Pioneer Textiles", "Lakeside Printing")
_ORDER_ITEMS = ("coffee mug", "desk lamp", "notebook", "water bottle", "phone case", "wall clock",
                "umbrella", "backpack", "tea kettle", "picture frame", "yoga mat", "pillow",
                "bath towel", "cutting board", "flower pot", "reading glasses")
_INVOICE_LINES = ("consulting hours", "software license", "office chairs", "printer paper",
                  "website hosting", "travel costs", "repair work", "cleaning service",
                  "training session", "delivery fee", "design work", "support plan")
_SUBJECTS = {
    "billing": ("charged twice", "wrong amount on my bill", "invoice not received", "payment failed"),
    "technical": ("app crashes on start", "page does not load", "sync stopped working", "error when saving"),
    "account": ("cannot log in", "change my email address", "close my account", "locked out of account"),
    "shipping": ("package not delivered", "wrong item received", "parcel arrived damaged",
                 "tracking number missing"),
}
_EVENT_TITLES = ("team meeting", "budget review", "product demo", "project kickoff", "sales call",
                 "design workshop", "quarterly planning", "training day", "client lunch", "board meeting")
_LOCATIONS = ("Room 101", "Room 204", "Room 310", "the main hall", "the Berlin office", "the Lyon office",
              "the Oslo office", "the library", "the cafeteria", "Conference Room A", "Conference Room B")
_PRODUCTS = ("travel mug", "wireless earbuds", "camping lantern", "desk organizer", "kids raincoat",
             "bamboo cutting board", "laptop stand", "garden hose", "steel water bottle", "picnic blanket",
             "bluetooth speaker", "lunch box", "hiking socks", "table lamp")
_BRANDS = ("Norda", "Kestrel", "Brightway", "Lumo", "Tidewell", "Fernhill", "Solace", "Vantor", "Orbly",
           "Greystone", "Pinecrest", "Aurelio")
_FIRST_DAY = datetime.date(2025, 1, 1)
_LAST_DAY = datetime.date(2027, 10, 31)  # an invoice's due date (at most 60 days on) stays in 2027


def _string(max_length: int) -> Dict[str, Any]:
    return {"type": "string", "maxLength": max_length}


def _pattern(pattern: str) -> Dict[str, Any]:
    return {"type": "string", "pattern": pattern}


def _object(properties: Dict[str, Any]) -> Dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


def _array(items: Dict[str, Any], max_items: int) -> Dict[str, Any]:
    return {"type": "array", "items": items, "minItems": 1, "maxItems": max_items}


def _number(low: float, high: float, integer: bool = False) -> Dict[str, Any]:
    return {"type": "integer" if integer else "number", "minimum": low, "maximum": high}


_DATE = "^\\d{4}-\\d{2}-\\d{2}$"
_MONEY = (0, 100000)


def _schema(family: str) -> Dict[str, Any]:
    if family == "order":
        return _object({"customer": _string(60), "city": _string(60), "date": _pattern(_DATE),
                        "items": _array(_object({"name": _string(60), "quantity": _number(1, 99, True),
                                                 "unit_price": _number(*_MONEY)}), 3)})
    if family == "invoice":
        return _object({"invoice_number": _pattern("^INV-\\d{5}$"), "issuer": _string(80),
                        "date": _pattern(_DATE), "due_date": _pattern(_DATE),
                        "currency": {"type": "string", "enum": list(CURRENCIES)},
                        "lines": _array(_object({"description": _string(60), "amount": _number(*_MONEY)}), 3),
                        "total": _number(*_MONEY)})
    if family == "contact":
        return _object({"name": _string(60), "email": _string(80), "phone": _pattern("^\\d{3}-\\d{3}-\\d{4}$"),
                        "company": _string(80),
                        "address": _object({"street": _string(80), "city": _string(60),
                                            "postal_code": _pattern("^\\d{5}$")})})
    if family == "ticket":
        return _object({"customer": _string(60), "subject": _string(80),
                        "priority": {"type": "string", "enum": list(PRIORITIES)},
                        "category": {"type": "string", "enum": list(CATEGORIES)},
                        "refund_requested": {"type": "boolean"}, "order_id": _pattern("^ORD-\\d{5}$")})
    if family == "event":
        return _object({"title": _string(80), "date": _pattern(_DATE), "start_time": _pattern("^\\d{2}:\\d{2}$"),
                        "duration_minutes": _number(5, 600, True), "location": _string(60),
                        "attendees": _array(_string(60), 4)})
    return _object({"name": _string(80), "brand": _string(60), "price": _number(*_MONEY),
                    "currency": {"type": "string", "enum": list(CURRENCIES)}, "in_stock": {"type": "boolean"},
                    "rating": _number(1, 5), "tags": _array({"type": "string", "enum": list(TAGS)}, 3)})


# --- records -------------------------------------------------------------------------------

def _name(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"


def _names(rng: random.Random, count: int) -> List[str]:
    out: List[str] = []
    while len(out) < count:
        name = _name(rng)
        if name not in out:
            out.append(name)
    return out


def _date(rng: random.Random) -> datetime.date:
    return _FIRST_DAY + datetime.timedelta(days=rng.randint(0, (_LAST_DAY - _FIRST_DAY).days))


def _cents(rng: random.Random, low: int, high: int) -> int:
    """A price in cents between low and high (whole units) that ends in a non-zero digit, so the
    float's JSON text and the two-decimal text are the same ("19.99", never "19.9" / "19.90")."""
    return rng.randint(low, high) * 100 + rng.choice((99, 95, 49, 45, 25, 75, 89, 19, 59, 35))


def _money(cents: int) -> float:
    return cents / 100


def _order(rng: random.Random) -> Dict[str, Any]:
    items = [{"name": n, "quantity": rng.randint(1, 5), "unit_price": _money(_cents(rng, 1, 80))}
             for n in rng.sample(_ORDER_ITEMS, rng.randint(1, 3))]
    return {"customer": _name(rng), "city": rng.choice(_CITIES), "date": _date(rng).isoformat(), "items": items}


def _invoice(rng: random.Random) -> Dict[str, Any]:
    while True:
        amounts = [_cents(rng, 20, 2500) for _ in range(rng.randint(1, 3))]
        if sum(amounts) % 10:  # the total's text keeps two decimals too
            break
    day = _date(rng)
    due = day + datetime.timedelta(days=rng.choice((14, 30, 45, 60)))
    return {"invoice_number": f"INV-{rng.randint(10000, 99999)}", "issuer": rng.choice(_COMPANIES),
            "date": day.isoformat(), "due_date": due.isoformat(),
            "currency": rng.choice(CURRENCIES),
            "lines": [{"description": d, "amount": _money(c)}
                      for d, c in zip(rng.sample(_INVOICE_LINES, len(amounts)), amounts)],
            "total": _money(sum(amounts))}


def _contact(rng: random.Random) -> Dict[str, Any]:
    first, last, company = rng.choice(_FIRST), rng.choice(_LAST), rng.choice(_COMPANIES)
    domain = company.split()[0].lower() + ".com"
    return {"name": f"{first} {last}", "email": f"{first.lower()}.{last.lower()}@{domain}",
            "phone": f"{rng.randint(200, 989)}-{rng.randint(200, 999)}-{rng.randint(1000, 9999)}",
            "company": company,
            "address": {"street": f"{rng.randint(1, 250)} {rng.choice(_STREETS)}", "city": rng.choice(_CITIES),
                        "postal_code": f"{rng.randint(10000, 99999)}"}}


def _ticket(rng: random.Random) -> Dict[str, Any]:
    category = rng.choice(CATEGORIES)
    return {"customer": _name(rng), "subject": rng.choice(_SUBJECTS[category]),
            "priority": rng.choice(PRIORITIES), "category": category,
            "refund_requested": rng.random() < 0.5, "order_id": f"ORD-{rng.randint(10000, 99999)}"}


def _event(rng: random.Random) -> Dict[str, Any]:
    return {"title": rng.choice(_EVENT_TITLES), "date": _date(rng).isoformat(),
            "start_time": f"{rng.randint(8, 17):02d}:{rng.choice((0, 15, 30, 45)):02d}",
            "duration_minutes": rng.choice((15, 30, 45, 60, 90, 120, 180)), "location": rng.choice(_LOCATIONS),
            "attendees": _names(rng, rng.randint(1, 4))}


def _product(rng: random.Random) -> Dict[str, Any]:
    return {"name": rng.choice(_PRODUCTS), "brand": rng.choice(_BRANDS), "price": _money(_cents(rng, 3, 400)),
            "currency": rng.choice(CURRENCIES), "in_stock": rng.random() < 0.5,
            "rating": rng.randint(10, 50) / 10, "tags": rng.sample(TAGS, rng.randint(1, 3))}


_RECORDS: Dict[str, Callable[[random.Random], Dict[str, Any]]] = {
    "order": _order, "invoice": _invoice, "contact": _contact, "ticket": _ticket, "event": _event,
    "product": _product}


# --- texts ---------------------------------------------------------------------------------

def _and(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _num(value: float) -> str:
    return json.dumps(value)


def _said(family: str, key: str, value: bool, rng: random.Random) -> str:
    yes, no = BOOL_PHRASES[(family, key)]
    return rng.choice(yes if value else no)


def _order_text(r: Dict[str, Any], rng: random.Random) -> str:
    item = rng.choice((lambda i: f"{i['quantity']} x {i['name']} at {_num(i['unit_price'])} each",
                       lambda i: f"{i['name']} (quantity {i['quantity']}, unit price {_num(i['unit_price'])})",
                       lambda i: f"{i['quantity']} of the {i['name']} for {_num(i['unit_price'])} each"))
    items = _and([item(i) for i in r["items"]])
    return rng.choice((
        f"{r['customer']} from {r['city']} placed an order on {r['date']}: {items}.",
        f"Order date: {r['date']}. Customer: {r['customer']}, {r['city']}. Items: {items}.",
        f"On {r['date']}, {r['customer']} in {r['city']} ordered {items}.",
        f"Please ship to {r['customer']} in {r['city']}. The order was made on {r['date']} and contains {items}.",
    ))


def _invoice_text(r: Dict[str, Any], rng: random.Random) -> str:
    line = rng.choice((lambda x: f"{x['description']} {_num(x['amount'])}",
                       lambda x: f"{x['description']} for {_num(x['amount'])}",
                       lambda x: f"{x['description']}: {_num(x['amount'])}"))
    lines, total, cur = _and([line(x) for x in r["lines"]]), _num(r["total"]), r["currency"]
    return rng.choice((
        f"Invoice {r['invoice_number']} from {r['issuer']}, dated {r['date']}, is due on {r['due_date']}. "
        f"It lists {lines}. The total is {total} {cur}.",
        f"{r['issuer']} sent invoice {r['invoice_number']} on {r['date']}. Lines: {lines}. "
        f"Total: {total} {cur}, payable by {r['due_date']}.",
        f"Please pay invoice {r['invoice_number']} by {r['due_date']}. It was issued by {r['issuer']} on "
        f"{r['date']} in {cur} for {lines}, a total of {total}.",
    ))


def _contact_text(r: Dict[str, Any], rng: random.Random) -> str:
    a = r["address"]
    return rng.choice((
        f"{r['name']} works at {r['company']}. Email: {r['email']}, phone: {r['phone']}. "
        f"Address: {a['street']}, {a['postal_code']} {a['city']}.",
        f"You can reach {r['name']} of {r['company']} at {r['email']} or by phone at {r['phone']}. "
        f"The office is at {a['street']}, {a['city']} {a['postal_code']}.",
        f"New contact: {r['name']} ({r['company']}), phone {r['phone']}, email {r['email']}. "
        f"Mailing address: {a['street']}, {a['city']}, postal code {a['postal_code']}.",
    ))


def _ticket_text(r: Dict[str, Any], rng: random.Random) -> str:
    refund = _said("ticket", "refund_requested", r["refund_requested"], rng)
    return rng.choice((
        f"{r['customer']} opened a ticket about order {r['order_id']} with the subject \"{r['subject']}\". "
        f"It is {_a(r['category'])} issue with {r['priority']} priority. {refund}",
        f"Ticket from {r['customer']} for order {r['order_id']}. Subject: {r['subject']}. "
        f"Category: {r['category']}, priority: {r['priority']}. {refund}",
        f"Priority {r['priority']}, category {r['category']}: {r['customer']} writes \"{r['subject']}\" "
        f"about order {r['order_id']}. {refund}",
    ))


def _event_text(r: Dict[str, Any], rng: random.Random) -> str:
    names = _and(r["attendees"])
    return rng.choice((
        f"The {r['title']} takes place on {r['date']} at {r['start_time']} in {r['location']}. "
        f"It lasts {r['duration_minutes']} minutes. Attendees: {names}.",
        f"{names} will attend the {r['title']} in {r['location']} on {r['date']}, starting at "
        f"{r['start_time']}, for {r['duration_minutes']} minutes.",
        f"Calendar entry: {r['title']}, {r['date']} at {r['start_time']}, {r['duration_minutes']} minutes, "
        f"in {r['location']}. Invited: {names}.",
    ))


def _product_text(r: Dict[str, Any], rng: random.Random) -> str:
    stock, tags = _said("product", "in_stock", r["in_stock"], rng), _and(r["tags"])
    price, rating, cur = _num(r["price"]), _num(r["rating"]), r["currency"]
    return rng.choice((
        f"The {r['name']} by {r['brand']} costs {price} {cur} and is rated {rating} out of 5. {stock} "
        f"Tags: {tags}.",
        f"{r['brand']} sells the {r['name']} for {price} {cur}, with a rating of {rating}. {stock} "
        f"It is tagged {tags}.",
        f"Product: {r['name']}. Brand: {r['brand']}. Price: {price} {cur}. Rating: {rating}. {stock} "
        f"Tags: {tags}.",
    ))


_TEXTS: Dict[str, Callable[[Dict[str, Any], random.Random], str]] = {
    "order": _order_text, "invoice": _invoice_text, "contact": _contact_text, "ticket": _ticket_text,
    "event": _event_text, "product": _product_text}


# --- tasks ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Task:
    family: str
    seed: int
    # system (the instruction), one worked example as a user/assistant turn, then user (the text)
    messages: List[Dict[str, str]]
    schema: Dict[str, Any]
    truth: Dict[str, Any]  # the record the user text was written from; valid under `schema`
    max_tokens: int


def _derive(*parts: Any) -> int:
    """A 63-bit seed from `parts`, the same in every process (unlike hash() of a str)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big") >> 1


def _check_family(family: Any) -> None:
    if family not in FAMILIES:
        raise ValueError(f"family {family!r} is unknown (allowed: {', '.join(FAMILIES)})")


def _check_example(example: Any) -> None:
    if example not in EXAMPLES:
        raise ValueError(f"example {example!r} is unknown (allowed: {', '.join(EXAMPLES)})")


def _check_int(name: str, value: Any, low: Optional[int] = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or (low is not None and value < low):
        raise ValueError(f"{name} {value!r} is not an integer" + (f" >= {low}" if low is not None else ""))


def _written(family: str, seed: int) -> Tuple[Dict[str, Any], str]:
    record = _RECORDS[family](random.Random(_derive("record", family, seed)))
    return record, _TEXTS[family](record, random.Random(_derive("text", family, seed)))


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def task(family: str, seed: int, example: str = PER_REQUEST) -> Task:
    """The `family` task written from `seed`: its worked example comes from another seed derived
    from this one (`per-request`) or from the family (`per-family`: the same for every task of
    the family but the rare one whose text it repeats), never with the same text."""
    _check_family(family)
    _check_int("seed", seed)
    _check_example(example)
    truth, text = _written(family, seed)
    base = ("example", seed) if example == PER_REQUEST else ("example", family)
    for attempt in range(1000):
        example_record, example_text = _written(family, _derive(*base, attempt))
        if example_text != text and example_record != truth:
            break
    # The example as a turn of the conversation: a small model copies it from there better than
    # from the system message (docs/drafting.md, "The real model").
    system = f"Extract the {family} from the user's text as JSON. Use only values stated in the text."
    messages = [{"role": "system", "content": system}, {"role": "user", "content": example_text},
                {"role": "assistant", "content": _compact(example_record)}, {"role": "user", "content": text}]
    return Task(family, seed, messages, _schema(family), truth, 2 * math.ceil(len(json.dumps(truth)) / 2) + 32)


def tasks(seed: int, count: int, families: Sequence[str] = FAMILIES, example: str = PER_REQUEST) -> List[Task]:
    """`count` tasks taking `families` in turn; task i from a seed derived from (seed, i) (from
    (seed, i, k) in the rare case its text repeats an earlier one's), so all user texts differ.
    `example`: as in `task`."""
    _check_int("seed", seed)
    _check_example(example)
    _check_int("count", count, 0)
    if isinstance(families, str) or not families:
        raise ValueError(f"families {families!r} is not a non-empty sequence (allowed: {', '.join(FAMILIES)})")
    for family in families:
        _check_family(family)
    out: List[Task] = []
    seen = set()
    for i in range(count):
        family = families[i % len(families)]
        for k in range(1000):
            t = task(family, _derive(seed, i) if k == 0 else _derive(seed, i, k), example)
            if t.messages[-1]["content"] not in seen:
                break
        seen.add(t.messages[-1]["content"])
        out.append(t)
    return out


class TaskStream:
    """`tasks(seed, n)` for an n not known in advance (a run limited by time): the i-th task,
    the list grown by doubling as needed (tasks' prefixes do not depend on n)."""

    def __init__(self, seed: int, families: Sequence[str] = FAMILIES, example: str = PER_REQUEST):
        _check_example(example)
        self.seed, self.families, self.example = seed, families, example
        self._tasks: List[Task] = []

    def __getitem__(self, i: int) -> Task:
        if i >= len(self._tasks):
            self._tasks = tasks(self.seed, max(2 * len(self._tasks), i + 1, 16), self.families, self.example)
        return self._tasks[i]


def body(task: Task, model: str, temperature: float = 0.0, top_p: Optional[float] = None,
         seed: Optional[int] = None) -> Dict[str, Any]:
    """The OpenAI chat-completions request for `task`, its JSON schema as the response format."""
    out: Dict[str, Any] = {"model": model, "messages": copy.deepcopy(task.messages), "max_tokens": task.max_tokens,
                           "temperature": temperature}
    if top_p is not None:
        out["top_p"] = top_p
    if seed is not None:
        out["seed"] = seed
    out["response_format"] = {"type": "json_schema",
                              "json_schema": {"name": task.family, "schema": copy.deepcopy(task.schema)}}
    return out


_QUESTIONS = (
    "Explain in one sentence what people use the {thing} for.",
    "Give one tip for keeping the {thing} clean.",
    "Write a short greeting to {name} from {city}.",
    "Name two things to do in {city} on a {day}.",
    "Why would {name} need the {thing}? Answer briefly.",
    "Write one sentence about buying the {thing} in {city}.",
    "Suggest a name for a shop in {city} that sells the {thing} and similar goods.",
    "Write a two-line note to {name} about the {event}.",
    "What should I bring to the {event} on {day}?",
    "Describe the weather in {city} on a typical {day} in one sentence.",
)
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def free_text_bodies(seed: int, count: int, model: str, max_tokens: int = 64,
                     temperature: float = 0.0) -> List[Dict[str, Any]]:
    """`count` plain chat requests (no response format), all different: the free-text share of
    mixed traffic."""
    _check_int("seed", seed)
    _check_int("count", count, 0)
    _check_int("max_tokens", max_tokens, 1)
    rng = random.Random(_derive("free text", seed))
    prompts: List[str] = []
    seen = set()
    for _ in range(1000 * count):
        if len(prompts) == count:
            break
        thing = rng.choice(_ORDER_ITEMS + _PRODUCTS)
        prompt = rng.choice(_QUESTIONS).format(
            thing=thing, name=rng.choice(_FIRST), city=rng.choice(_CITIES),
            day=rng.choice(_DAYS), event=rng.choice(_EVENT_TITLES))
        if prompt not in seen:
            seen.add(prompt)
            prompts.append(prompt)
    if len(prompts) < count:
        raise ValueError(f"count {count} is more than the distinct free-text prompts found ({len(prompts)})")
    return [{"model": model, "messages": [{"role": "user", "content": p}], "max_tokens": max_tokens,
             "temperature": temperature} for p in prompts]


# --- scores --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Score:
    family: str
    valid: bool  # the reply parses as JSON and follows the schema
    finish: str  # finish_reason as given ("stop", "length"; "" or "error" for none)
    right: int  # leaves equal to the truth's
    total: int  # leaves in the truth
    wrong: Tuple[str, ...]  # paths of the wrong or missing leaves, e.g. "items[1].unit_price"


_MISSING = object()


def _text(value: str) -> str:
    return " ".join(value.split()).casefold()


def _leaf_equal(truth: Any, reply: Any, enum: bool) -> bool:
    if isinstance(truth, bool) or enum:
        return type(reply) is type(truth) and reply == truth
    if isinstance(truth, (int, float)):
        return (isinstance(reply, (int, float)) and not isinstance(reply, bool)
                and abs(reply - truth) <= 1e-6 * max(1.0, abs(truth)))
    if isinstance(truth, str):
        return isinstance(reply, str) and _text(reply) == _text(truth)
    return reply == truth


def _compare(truth: Any, reply: Any, schema: Any, path: str) -> Tuple[int, List[str]]:
    """(leaves right, paths wrong) of `truth` against `reply` (_MISSING where the reply has none)."""
    schema = schema if isinstance(schema, dict) else {}
    if isinstance(truth, dict):
        right, wrong = 0, []
        properties = schema.get("properties", {})
        for key, value in truth.items():
            sub = reply.get(key, _MISSING) if isinstance(reply, dict) else _MISSING
            r, w = _compare(value, sub, properties.get(key), f"{path}.{key}" if path else key)
            right, wrong = right + r, wrong + w
        return right, wrong
    if isinstance(truth, list):
        right, wrong = 0, []
        for i, value in enumerate(truth):
            sub = reply[i] if isinstance(reply, list) and i < len(reply) else _MISSING
            r, w = _compare(value, sub, schema.get("items"), f"{path}[{i}]")
            right, wrong = right + r, wrong + w
        return right, wrong
    if reply is not _MISSING and _leaf_equal(truth, reply, "enum" in schema):
        return 1, []
    return 0, [path]


def score(task: Task, content: str, finish_reason: str) -> Score:
    """`content` (a reply's text) scored against `task.truth`, leaf by leaf."""
    import jsonschema

    right, wrong = _compare(task.truth, _MISSING, task.schema, "")
    total = right + len(wrong)
    finish = finish_reason or ""
    try:
        value = json.loads(content)
    except (TypeError, ValueError):
        return Score(task.family, False, finish, 0, total, tuple(wrong))
    valid = jsonschema.Draft202012Validator(task.schema).is_valid(value)
    right, wrong = _compare(task.truth, value, task.schema, "")
    return Score(task.family, valid, finish, right, total, tuple(wrong))


def score_results(tasks: Any, results: Sequence[Any]) -> List[Score]:
    """Each answered result (`content`, `finish_reason`, `index`) scored against `tasks[index]`
    (a list of tasks or a `TaskStream`)."""
    return [score(tasks[r.index], r.content, r.finish_reason) for r in results]


@dataclass(frozen=True)
class Summary:
    requests: int  # scored replies and failed requests
    valid: int
    finished_stop: int
    finished_length: int
    failed: int  # no reply: `failed` as passed, and scores whose finish is "error"
    format_errors: int  # replies not valid under their schema, not counting those cut at max_tokens
    fields_right: int
    fields_total: int  # over the scores (a request passed only as `failed` has no fields)
    accuracy: float  # fields_right / fields_total; NaN without fields
    accuracy_ci95: Tuple[float, float]  # Wilson interval; (0, 1) without fields
    per_family: Dict[str, Tuple[int, int]]  # family: (right, total), in first-seen order


def wilson(right: int, total: int, z: float = Z95) -> Tuple[float, float]:
    """The Wilson score interval for right/total; (0, 1) for no trials."""
    if total <= 0:
        return 0.0, 1.0
    p = right / total
    denominator = 1 + z * z / total
    center = (p + z * z / (2 * total)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return (0.0 if right <= 0 else max(0.0, center - half)), (1.0 if right >= total else min(1.0, center + half))


def summarize(scores: Sequence[Score], failed: int = 0) -> Summary:
    """The scores added up. `failed`: requests that got no reply and were not scored (a request
    scored with finish "error", e.g. `score(t, "", "error")`, counts as failed with its fields
    wrong)."""
    _check_int("failed", failed, 0)
    per_family: Dict[str, Tuple[int, int]] = {}
    for s in scores:
        r, t = per_family.get(s.family, (0, 0))
        per_family[s.family] = (r + s.right, t + s.total)
    right, total = sum(s.right for s in scores), sum(s.total for s in scores)
    return Summary(
        requests=len(scores) + failed, valid=sum(1 for s in scores if s.valid),
        finished_stop=sum(1 for s in scores if s.finish == "stop"),
        finished_length=sum(1 for s in scores if s.finish == "length"),
        failed=failed + sum(1 for s in scores if s.finish == "error"),
        format_errors=sum(1 for s in scores if s.finish != "length" and not s.valid),
        fields_right=right, fields_total=total, accuracy=right / total if total else math.nan,
        accuracy_ci95=wilson(right, total), per_family=per_family)


def summary_line(s: Summary) -> str:
    """One line: validity, how replies ended, failures, and field accuracy with its interval."""
    fields = f"fields right {s.fields_right}/{s.fields_total}"
    if s.fields_total:
        low, high = s.accuracy_ci95
        fields += f" ({100 * s.accuracy:.1f}%, 95% CI {100 * low:.1f}-{100 * high:.1f}%)"
    return (f"valid {s.valid}/{s.requests}, finished stop {s.finished_stop} / length {s.finished_length}, "
            f"failed {s.failed}, {fields}")
