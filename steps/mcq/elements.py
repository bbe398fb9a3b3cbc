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

The elements and their fact text: element_facts.py; the templates: element_templates.py.
"""

from __future__ import annotations

import random

import pandas as pd

from steps.core import InputError
from steps.mcq.element_facts import load_elements
from steps.mcq.element_templates import TEMPLATE_NAMES, TEMPLATES, Template

__all__ = ["TEMPLATE_NAMES", "generate", "load_elements"]


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
