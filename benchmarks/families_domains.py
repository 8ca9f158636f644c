"""The offline domains that ``benchmarks/scenario_families.py`` draws scenarios from, beside
the demo's six (:mod:`dynamics.data.offline`): four generated skills, generated structured
text, and a second quiz on the facts the demo's base model saw in pretraining.

Public API:

- ``write_family_domains(folder, seed, quiz, rows=FAMILY_ROWS) -> {name: path}``: write one
  JSON-lines file per domain of ``NEW_DOMAINS`` into ``folder``, in the row shapes
  ``DataSource`` reads; ``quiz`` is the demo's quiz file the second quiz is built from.
- ``NEW_DOMAINS``: each new domain's ``DataSource.format``.
- one ``*_row(rng)`` function per generated domain, and ``modules_quiz_row(row)``.

Determinism, as in :mod:`dynamics.data.offline`: every random choice comes from
``random.Random(f"{seed}:{name}")`` (string seeds are hashed with SHA-512, the same on every
machine), and the files are written with a fixed key order, so the same seed gives
byte-identical files on every machine.
"""

from __future__ import annotations

import datetime
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from string import ascii_lowercase
from typing import Any

from dynamics.data.offline import CITIES, CURRENCIES, PEOPLE
from dynamics.runs import rundir

FAMILY_ROWS = 2000
"""Rows of each generated domain: the demo's ``arithmetic`` and ``toolcall`` have as many."""

NEW_DOMAINS: dict[str, str] = {
    "strings": "instruction",
    "units": "instruction",
    "dates": "instruction",
    "sorting": "instruction",
    "records": "text",
    "modules_quiz": "multiple_choice",
}
"""Each new domain's ``DataSource.format``, in the order the files are written."""


# ---------------------------------------------------------------------------------------
# strings: reverse, uppercase, count a letter
# ---------------------------------------------------------------------------------------


def random_word(rng: random.Random, shortest: int = 3, longest: int = 9) -> str:
    """A made-up lowercase word: the model cannot have memorised its answer."""
    return "".join(rng.choice(ascii_lowercase) for _ in range(rng.randint(shortest, longest)))


def strings_row(rng: random.Random) -> dict[str, str]:
    """String manipulation on made-up words: reverse a phrase, write it in uppercase, or
    count how often a letter appears in it. The answer repeats the phrase, so that it is
    long enough for its loss to move by more than a few bytes."""
    phrase = " ".join(random_word(rng) for _ in range(rng.randint(1, 3)))
    task = rng.choice(["reverse", "uppercase", "count"])
    if task == "reverse":
        return {
            "prompt": f'Reverse the string "{phrase}".',
            "response": f'The reverse of "{phrase}" is "{phrase[::-1]}".',
        }
    if task == "uppercase":
        return {
            "prompt": f'Write "{phrase}" in uppercase.',
            "response": f'"{phrase}" in uppercase is "{phrase.upper()}".',
        }
    # A letter of the phrase three times in four, any letter (often absent) otherwise.
    letter = (
        rng.choice(phrase.replace(" ", "")) if rng.random() < 0.75 else rng.choice(ascii_lowercase)
    )
    count = phrase.count(letter)
    times = "time" if count == 1 else "times"
    return {
        "prompt": f'How many times does the letter "{letter}" appear in "{phrase}"?',
        "response": f'The letter "{letter}" appears {count} {times} in "{phrase}".',
    }


# ---------------------------------------------------------------------------------------
# units: conversions by an exact integer factor
# ---------------------------------------------------------------------------------------

CONVERSIONS: tuple[tuple[str, str, int], ...] = (
    ("km", "m", 1000),
    ("m", "cm", 100),
    ("cm", "mm", 10),
    ("mi", "yd", 1760),
    ("yd", "ft", 3),
    ("ft", "in", 12),
    ("kg", "g", 1000),
    ("t", "kg", 1000),
    ("lb", "oz", 16),
    ("L", "mL", 1000),
    ("gal", "qt", 4),
    ("week", "day", 7),
    ("day", "h", 24),
    ("h", "min", 60),
    ("min", "s", 60),
)
"""(larger unit, smaller unit, how many smaller units make one larger)."""


def units_row(rng: random.Random) -> dict[str, str]:
    """Unit conversion by an exact factor (``CONVERSIONS``), either way, with the factor as
    a worked step; amounts converted to the larger unit are multiples of the factor, so
    every answer is a whole number."""
    large, small, factor = rng.choice(CONVERSIONS)
    count = rng.randint(2, 99)
    if rng.random() < 0.5:
        amount, unit, result, into = count, large, count * factor, small
        step = f"1 {large} = {factor} {small}, so multiply by {factor}"
    else:
        amount, unit, result, into = count * factor, small, count, large
        step = f"1 {large} = {factor} {small}, so divide by {factor}"
    return {
        "prompt": f"Convert {amount} {unit} to {into}.",
        "response": f"{step}: {amount} {unit} = {result} {into}.",
    }


# ---------------------------------------------------------------------------------------
# dates: calendar arithmetic
# ---------------------------------------------------------------------------------------

FIRST_DAY = datetime.date(1990, 1, 1)
DAYS_SPAN = 365 * 50
"""Dates are drawn from the 50 years from ``FIRST_DAY``."""


def random_date(rng: random.Random) -> datetime.date:
    return FIRST_DAY + datetime.timedelta(days=rng.randrange(DAYS_SPAN))


def dates_row(rng: random.Random) -> dict[str, str]:
    """Date arithmetic in ISO dates, answered by ``datetime``: the date some days after or
    before another, the number of days between two dates, or the weekday of a date."""
    start = random_date(rng)
    task = rng.choice(["after", "before", "between", "weekday"])
    if task in ("after", "before"):
        days = rng.randint(1, 400)
        end = start + datetime.timedelta(days=days if task == "after" else -days)
        return {
            "prompt": f"What date is {days} days {task} {start.isoformat()}?",
            "response": f"{days} days {task} {start.isoformat()} is {end.isoformat()}.",
        }
    if task == "between":
        end = start + datetime.timedelta(days=rng.randint(1, 1000))
        days = (end - start).days
        return {
            "prompt": f"How many days are there from {start.isoformat()} to {end.isoformat()}?",
            "response": f"From {start.isoformat()} to {end.isoformat()} there are {days} days.",
        }
    return {
        "prompt": f"What day of the week is {start.isoformat()}?",
        "response": f"{start.isoformat()} is a {start.strftime('%A')}.",
    }


# ---------------------------------------------------------------------------------------
# sorting: numbers and words
# ---------------------------------------------------------------------------------------


def sorting_row(rng: random.Random) -> dict[str, str]:
    """Sort 3-8 numbers (ascending or descending) or 3-6 made-up words (alphabetically);
    the answer lists them comma-separated."""
    if rng.random() < 0.5:
        numbers = [rng.randint(0, 999) for _ in range(rng.randint(3, 8))]
        order = rng.choice(["ascending", "descending"])
        ordered = sorted(numbers, reverse=order == "descending")
        return {
            "prompt": f"Sort in {order} order: {', '.join(map(str, numbers))}.",
            "response": ", ".join(map(str, ordered)),
        }
    words = [random_word(rng) for _ in range(rng.randint(3, 6))]
    return {
        "prompt": f"Sort alphabetically: {', '.join(words)}.",
        "response": ", ".join(sorted(words)),
    }


# ---------------------------------------------------------------------------------------
# records: generated CSV tables and JSON records (text)
# ---------------------------------------------------------------------------------------

ITEMS = ("apples", "cables", "chairs", "lamps", "maps", "notebooks", "pens", "tickets")


def records_row(rng: random.Random) -> dict[str, str]:
    """A small table of orders as CSV (a header and 2-5 rows) or one order as a JSON
    object: structured text unlike the demo's code and prose."""
    orders = [
        {
            "id": rng.randint(1000, 9999),
            "customer": rng.choice(PEOPLE),
            "city": rng.choice(CITIES),
            "item": rng.choice(ITEMS),
            "quantity": rng.randint(1, 50),
            "price": f"{rng.randint(1, 500)}.{rng.randint(0, 99):02d}",
            "currency": rng.choice(CURRENCIES),
        }
        for _ in range(rng.randint(2, 5))
    ]
    if rng.random() < 0.5:
        header = ",".join(orders[0])
        return {
            "text": "\n".join(
                [header, *(",".join(str(v) for v in order.values()) for order in orders)]
            )
        }
    return {"text": json.dumps(orders[0])}


# ---------------------------------------------------------------------------------------
# modules_quiz: the demo's quiz facts, asked by module
# ---------------------------------------------------------------------------------------

QUIZ_QUESTION = re.compile(
    r"What is the full name of the (?P<kind>function|class) `(?P<name>\w+)`\?"
)


def modules_quiz_row(row: dict[str, Any]) -> dict[str, Any]:
    """The demo's quiz question ``row`` asked another way: "In which module is the function
    `a85encode` defined?", with the module names as choices (the same modules, in the same
    order, so the same answer). The demo's base model saw every such fact in pretraining
    (its ``facts``), yet answers only 47 of the 144 (0.33, chance 0.25) against 122 of the
    demo's own quiz, whose choices end in the name just asked (see
    :mod:`dynamics.data.offline`): a weak, noisy accuracy constraint. Other wordings did no
    better (0.25-0.33: the module in backticks, "Which module defines ...?", the fact's
    sentence left for the choices to end)."""
    match = QUIZ_QUESTION.fullmatch(row["question"])
    if match is None:
        raise ValueError(f"not a question of the demo's quiz: {row['question']!r}")
    suffix = f".{match['name']}"
    modules = [choice.removesuffix(suffix) for choice in row["choices"]]
    return {
        "question": f"In which module is the {match['kind']} `{match['name']}` defined?",
        "choices": modules,
        "answer": row["answer"],
    }


GENERATED: dict[str, Callable[[random.Random], dict[str, str]]] = {
    "strings": strings_row,
    "units": units_row,
    "dates": dates_row,
    "sorting": sorting_row,
    "records": records_row,
}


def write_family_domains(
    folder: Path, seed: int, quiz: Path, rows: int = FAMILY_ROWS
) -> dict[str, Path]:
    """Write every domain of ``NEW_DOMAINS`` to ``folder/<name>.jsonl`` (atomically); return
    the paths. The generated ones have ``rows`` rows drawn with ``random.Random(f"{seed}:{name}")``;
    ``modules_quiz`` has one question per question of the demo's ``quiz`` file."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in NEW_DOMAINS:
        if name == "modules_quiz":
            written = [
                modules_quiz_row(json.loads(line))
                for line in quiz.read_text(encoding="utf-8").splitlines()
            ]
        else:
            rng = random.Random(f"{seed}:{name}")
            written = [GENERATED[name](rng) for _ in range(rows)]
        paths[name] = folder / f"{name}.jsonl"
        rundir.atomic_write_text(paths[name], "".join(json.dumps(row) + "\n" for row in written))
    return paths
