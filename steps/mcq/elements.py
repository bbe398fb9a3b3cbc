"""The `builtin:elements` question set: science-exam MCQs generated from mendeleev's elements.db.

Two kinds of templates over the 118 elements:
- forward  ("What is the atomic number of Iron?"): options are values of that attribute, taken
  from similar elements (nearby atomic number, shared initial for symbols, nearby year ...);
- reverse  ("Which element is described here: <description with the name masked>?"): options
  are element names from the same block and nearby atomic numbers.

Context (the Kaggle retrieval column) is the relevant fact text of the answer element PLUS the
same fact for `context_facts - 1` distractor elements, shuffled, like a retriever that returns
near misses. Several options therefore appear in every context, so "the option that occurs in
the context" is not the answer; the model has to match the question to the right passage.
Without context the questions need remembered knowledge (splits are by element, so no element's
facts leak from train into test).

No shortcut from the options alone: distractors are the nearest elements on both sides of the
answer in the template's `order` (atomic number, or discovery year), and how many lie below the
answer is balanced per template, so the answer's rank among the options (e.g. the middle of five
nearby numbers) is uniform; the group/block question stays within one block (no odd format out).
"""

from __future__ import annotations

import random
import re
import sqlite3
from dataclasses import dataclass
from importlib import util
from pathlib import Path
from typing import Callable

import pandas as pd

from steps.tracking import InputError

COLUMNS = (
    "atomic_number",
    "symbol",
    "name",
    "description",
    "uses",
    "sources",
    "discoverers",
    "discovery_year",
    "discovery_location",
    "name_origin",
    "group_id",
    "block",
    "period",
)
NAME_VARIANTS = {"Aluminum": ["Aluminium"], "Sulfur": ["Sulphur"], "Cesium": ["Caesium"]}


def elements_db() -> Path:
    spec = util.find_spec("mendeleev")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package `mendeleev` is not installed: pip install mendeleev")
    return Path(list(spec.submodule_search_locations)[0]) / "elements.db"


def load_elements(db: Path | None = None) -> list[dict]:
    con = sqlite3.connect(f"file:{db or elements_db()}?mode=ro", uri=True)
    try:
        rows = con.execute(f"SELECT {', '.join(COLUMNS)} FROM elements ORDER BY atomic_number").fetchall()
    finally:
        con.close()
    return [{k: (v.strip() if isinstance(v, str) else v) for k, v in zip(COLUMNS, r)} for r in rows]


# ---- fact text ---------------------------------------------------------------------------------
def snippet(text: str | None, max_chars: int = 160) -> str:
    """First sentences of a long field, up to max_chars (keeps contexts short for CPU training)."""
    if not text:
        return ""
    sents = re.split(r"(?<=[.!?])\s+", " ".join(text.split()))
    out = sents[0]
    for s in sents[1:]:
        if len(out) + 1 + len(s) > max_chars:
            break
        out += " " + s
    return out[:max_chars].rstrip()


def mask(text: str, e: dict) -> str:
    """Hide the element's name and symbol so a reverse question does not name its answer."""
    names = [e["name"], *NAME_VARIANTS.get(e["name"], [])]
    for n in names:
        text = re.sub(rf"\b{re.escape(n)}\w*", "this element", text, flags=re.IGNORECASE)
    return re.sub(rf"\b{re.escape(e['symbol'])}\b", "X", text)


def known_discoverers(e: dict) -> str:
    d = (e["discoverers"] or "").strip().rstrip(".")
    return "" if not d or "known to the ancient" in d.lower() else d


def position(e: dict) -> str:
    group = f", group {e['group_id']}" if e["group_id"] else ""
    return f"period {e['period']}{group}, {e['block']}-block"


def symbol_fact(e: dict) -> str:
    return f"{e['name']} has the chemical symbol {e['symbol']}."


def origin_fact(e: dict) -> str:
    return f"Origin of the name {e['name']}: {snippet(e['name_origin'], 160)}"


def discovery_fact(e: dict) -> str:
    parts = [f"{e['name']} was discovered"]
    if known_discoverers(e):
        parts.append(f"by {known_discoverers(e)}")
    if e["discovery_year"]:
        parts.append(f"in {e['discovery_year']}")
    if e["discovery_location"]:
        parts.append(f"({e['discovery_location']})")
    return " ".join(parts) + "."


# ---- templates ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Template:
    """A question kind. `value(e)` is the fact the question is about ('' = not applicable);
    forward templates answer with that value, reverse ones with the element name."""

    name: str
    value: Callable[[dict], str]
    prompt: Callable[[dict], str]
    fact: Callable[[dict], str]
    reverse: bool = False
    closeness: Callable[[dict, dict], tuple] = lambda e, o: (abs(e["atomic_number"] - o["atomic_number"]),)
    order: Callable[[dict], tuple] = lambda e: (e["atomic_number"],)  # the answer's rank is balanced in it


def _same_initial(e, o):
    return (
        o["symbol"][0] != e["name"][0] and o["symbol"][0] != e["symbol"][0],
        abs(e["atomic_number"] - o["atomic_number"]),
    )


def _same_block(e, o):
    return (o["block"] != e["block"], abs(e["atomic_number"] - o["atomic_number"]))


def _year_gap(e, o):
    return (abs((e["discovery_year"] or 0) - (o["discovery_year"] or 0)), o["atomic_number"])


def _year(e):
    return (e["discovery_year"] or 0, e["atomic_number"])


def grouped_position(e: dict) -> str:
    """Position of elements with a group: the 28 f-block ones without a group would be the only
    'period P, f-block' options (an odd format a model could pick without knowing anything)."""
    return position(e) if e["group_id"] else ""


TEMPLATES = [
    Template(
        "symbol",
        lambda e: e["symbol"],
        lambda e: f"What is the chemical symbol of {e['name']}?",
        symbol_fact,
        closeness=_same_initial,
    ),
    Template(
        "atomic_number",
        lambda e: str(e["atomic_number"]),
        lambda e: f"What is the atomic number of {e['name']}?",
        lambda e: f"{e['name']} has atomic number {e['atomic_number']}.",
    ),
    Template(
        "group_block",
        grouped_position,
        lambda e: f"Where is {e['name']} placed in the periodic table?",
        lambda e: f"{e['name']} is in {position(e)} of the periodic table.",
        closeness=_same_block,
    ),
    Template(
        "discovery_year",
        lambda e: str(e["discovery_year"] or ""),
        lambda e: f"In which year was {e['name']} discovered?",
        discovery_fact,
        closeness=_year_gap,
        order=_year,
    ),
    Template(
        "discoverers",
        known_discoverers,
        lambda e: f"Who discovered {e['name']}?",
        discovery_fact,
        closeness=_year_gap,
        order=_year,
    ),
    Template(
        "discovery_location",
        lambda e: e["discovery_location"] or "",
        lambda e: f"In which country was {e['name']} discovered?",
        discovery_fact,
    ),
    Template(
        "name_origin",
        lambda e: snippet(e["name_origin"], 160),
        lambda e: f"Where does the name of {e['name']} come from?",
        origin_fact,
    ),
    Template(
        "description",
        lambda e: snippet(e["description"]),
        lambda e: f"Which element is this? {mask(snippet(e['description']), e)}",
        lambda e: f"{e['name']}: {snippet(e['description'])}",
        reverse=True,
        closeness=_same_block,
    ),
    Template(
        "uses",
        lambda e: snippet(e["uses"]),
        lambda e: f"Which element has these uses? {mask(snippet(e['uses']), e)}",
        lambda e: f"Uses of {e['name']}: {snippet(e['uses'])}",
        reverse=True,
        closeness=_same_block,
    ),
    Template(
        "sources",
        lambda e: snippet(e["sources"]),
        lambda e: f"Which element is obtained like this? {mask(snippet(e['sources']), e)}",
        lambda e: f"Sources of {e['name']}: {snippet(e['sources'])}",
        reverse=True,
        closeness=_same_block,
    ),
    Template(
        "symbol_reverse",
        lambda e: e["symbol"],
        lambda e: f"Which element has the chemical symbol {e['symbol']}?",
        symbol_fact,
        reverse=True,
        closeness=_same_block,
    ),
    Template(
        "name_origin_reverse",
        lambda e: snippet(e["name_origin"], 160),
        lambda e: f"Which element's name comes from this? {mask(snippet(e['name_origin'], 160), e)}",
        origin_fact,
        reverse=True,
        closeness=_same_block,
    ),
    Template(
        "discovery_reverse",
        lambda e: (
            discovery_fact(e).split(" was discovered", 1)[1] if known_discoverers(e) and e["discovery_year"] else ""
        ),
        lambda e: f"Which element was discovered{discovery_fact(e).split(' was discovered', 1)[1]}".rstrip(".") + "?",
        discovery_fact,
        reverse=True,
        closeness=_year_gap,
        order=_year,
    ),
]
TEMPLATE_NAMES = [t.name for t in TEMPLATES]


def _candidates(t: Template, e: dict, elements: list[dict]) -> list[dict]:
    """Elements whose option (value or name) differs from the answer and from each other, most
    similar first, so options are plausible but never ambiguous."""
    answer = t.value(e)
    seen, out = {answer}, []
    for o in sorted((o for o in elements if o is not e and t.value(o)), key=lambda o: t.closeness(e, o)):
        key = t.value(o)
        if key in seen or (not t.reverse and key.lower() == answer.lower()):
            continue
        seen.add(key)
        out.append(o)
    return out


def _distractors(
    t: Template, e: dict, elements: list[dict], rng: random.Random, pool: int, rank_counts: list[int]
) -> list[dict]:
    """4 distractors among the 2 * pool most similar candidates: r below the answer in `t.order`
    and 4 - r above it (each drawn from the nearest r + slack of its side, slack = (pool - 4) // 2).
    r is the least used feasible rank so far in this template: the answer's rank among its options
    is uniform, not the middle of five neighbours. `rank_counts` is updated."""
    cands = _candidates(t, e, elements)[: 2 * pool]
    below = [o for o in cands if t.order(o) < t.order(e)]
    above = [o for o in cands if t.order(o) > t.order(e)]
    feasible = [r for r in range(5) if len(below) >= r and len(above) >= 4 - r]
    if not feasible:
        return []
    r = min(feasible, key=lambda k: (rank_counts[k], rng.random()))
    rank_counts[r] += 1
    slack = max(0, (pool - 4) // 2)
    return rng.sample(below[: r + slack], r) + rng.sample(above[: 4 - r + slack], 4 - r)


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def generate(
    seed: int, templates: list[str] | None = None, context_facts: int = 3, distractor_pool: int = 8
) -> pd.DataFrame:
    """All distinct questions: prompt, answer_text, distractors, context, template, element.
    Letters and ids are assigned after splitting (steps.mcq.data.assign_letters)."""
    rng = random.Random(seed)
    elements = load_elements()
    unknown = sorted(set(templates or []) - set(TEMPLATE_NAMES))
    if unknown:
        raise InputError(f"config key 'prepare_mcq.templates': unknown {unknown}; known: {TEMPLATE_NAMES}")
    chosen = [t for t in TEMPLATES if not templates or t.name in templates]
    rows = []
    for t in chosen:
        rank_counts = [0] * 5
        for e in elements:
            if not t.value(e):
                continue
            others = _distractors(t, e, elements, rng, distractor_pool, rank_counts)
            rng.shuffle(others)  # which near misses go into the context: not tied to their side
            if not others:
                continue
            option = (lambda o: o["name"]) if t.reverse else t.value
            facts = [t.fact(e)] + [t.fact(o) for o in others[: max(0, context_facts - 1)]]
            rng.shuffle(facts)
            rows.append(
                {
                    "prompt": t.prompt(e),
                    "answer_text": option(e),
                    "distractors": [option(o) for o in others],
                    "context": " ".join(facts),
                    "template": t.name,
                    "element": e["name"],
                }
            )
    seen: set[str] = set()  # distinct questions only (e.g. two elements with the same sources text)
    rows = [r for r in rows if not (_norm(r["prompt"]) in seen or seen.add(_norm(r["prompt"])))]
    rng.shuffle(rows)
    return pd.DataFrame(rows)
