"""The demo's offline domains: real text from the Python standard library and generated skills.

Nothing here downloads anything. ``code``, ``prose`` and the quiz facts come from the sources
of ``STDLIB_MODULES`` as CPython 3.11.7 ships them, pinned in the package
(``stdlib_corpus.json.gz``, checked against ``STDLIB_CORPUS_SHA256``; the Python Software
Foundation License, ``STDLIB-LICENSE.txt`` beside it, allows their redistribution), so every
machine builds the same rows whatever Python runs it; everything else is generated.

Public API:

- ``write_offline_domains(folder, seed, sizes=DomainSizes()) -> {name: path}``: write one
  JSON-lines file per domain into ``folder``, in the row shapes ``DataSource`` reads.
- ``DOMAIN_FORMATS``: each domain's ``DataSource.format``; ``GENERAL_DOMAINS``: the domains
  the demo's base model is pretrained on.
- ``DomainSizes``: rows per domain; ``STDLIB_MODULES``: the modules read.
- ``choice_prompt(question, choices)``: a multiple-choice prompt exactly as
  ``dynamics.data.formats.multiple_choice`` renders it for scoring.

The domains (rows per file with the default ``DomainSizes``):

- ``code`` (text): the source of ``STDLIB_MODULES``, comments kept, cut at blank lines into
  documents of about ``CODE_CHUNK_CHARS`` characters.
- ``prose`` (text): English technical prose from the same modules: every docstring (of the
  module, its classes and functions, ``ast.get_docstring``) and every block of full-line
  comments, skipping short ones, doctest examples and commented-out code.
- ``quiz`` (multiple choice): "What is the full name of the function `a85encode`?" with
  the choices ``base64.a85encode``, ``operator.a85encode``, ``shutil.a85encode`` and
  ``urllib.parse.a85encode``; ``answer`` is the 0-based index of the right one. A fact is a
  public top-level function or class that exactly one of ``STDLIB_MODULES`` defines. The
  answer modules are the ``4 * QUIZ_GROUPS`` modules defining the most facts, in groups of
  four; a question's choices are its module's group, always in the same order, and every
  module has as many questions, so each letter is right equally often and chance is 25%.
- ``facts`` (text): each quiz fact twice, as a sentence ("In the Python standard library,
  the function `a85encode` is defined in the module `base64`: its full name is
  `base64.a85encode`.") and as its quiz question answered ("...\nAnswer: A"), in a seeded
  random order. A base model pretrained on ``GENERAL_DOMAINS`` memorises the quiz from
  these rows: the quiz is a closed-book test of facts seen in pretraining, so fine-tuning
  that forgets them lowers its accuracy, and ``facts`` is the data that can protect it.

  Why this shape (measured with a 0.9M-parameter byte-level model pretrained for 1,200
  steps): with the choices shuffled per question the model must find the true line and
  copy its letter, a circuit it did not form (accuracy at chance, even when the question
  named the answer); with fixed choices naming only the module ("Which module defines
  ...?") the letter must be recalled from the question ~60 bytes back, and it reached 46%;
  with the full names as choices the last choice line repeats the name right before
  "Answer:", and it reached 87%.
- ``arithmetic`` (instruction): "What is 482 + 37?" answered with worked steps (digit-wise
  addition with carries, subtraction with borrows, long multiplication by partial products).
- ``toolcall`` (instruction): a user request ("What's the weather in Oslo in celsius?")
  answered with one JSON function call ``{"name": ..., "arguments": {...}}``.

Determinism: every random choice comes from ``random.Random`` seeded with ``f"{seed}:{domain}"``
(string seeds are hashed with SHA-512, the same on every machine), every collection is
sorted before it is sampled, the files are written with a fixed key order, and the standard
library text is the pinned corpus. The same seed gives byte-identical files on every machine.
A different seed draws different generated rows and different subsets of ``code``/``prose``
when their sizes are below the available documents.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import io
import json
import os
import random
import tempfile
import tokenize
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import ascii_uppercase
from typing import Any

DATA_VERSION = 1
"""Bumped whenever the generated rows change, so caches keyed on it are rebuilt."""

STDLIB_CORPUS = Path(__file__).with_name("stdlib_corpus.json.gz")
"""The sources of ``STDLIB_MODULES`` from CPython 3.11.7 (``scripts/build_stdlib_corpus.py``)."""
STDLIB_CORPUS_SHA256 = "df383d3a2d63e3c11bf1892f64214278462d423ab9eebe53f2b25a9c563dfaef"

# Pure-Python modules of moderate size present in CPython 3.10-3.14 as these files (not
# packages that moved, e.g. pathlib and zipfile, nor modules removed by PEP 594). Sorted.
STDLIB_MODULES: tuple[str, ...] = (
    "base64",
    "bisect",
    "calendar",
    "cmd",
    "colorsys",
    "configparser",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "difflib",
    "fnmatch",
    "fractions",
    "functools",
    "getopt",
    "gettext",
    "glob",
    "gzip",
    "heapq",
    "hmac",
    "html.parser",
    "ipaddress",
    "json",
    "json.decoder",
    "json.encoder",
    "linecache",
    "mimetypes",
    "numbers",
    "operator",
    "pprint",
    "queue",
    "random",
    "reprlib",
    "sched",
    "secrets",
    "shlex",
    "shutil",
    "statistics",
    "string",
    "tempfile",
    "textwrap",
    "timeit",
    "tokenize",
    "traceback",
    "urllib.parse",
    "uuid",
    "warnings",
    "weakref",
)

CODE_CHUNK_CHARS = 1000
"""A ``code`` document ends at the first blank line after this many characters (or at
twice this many); ``build_examples`` packs or truncates them to the sequence length."""
QUIZ_GROUPS = 3
"""Groups of four answer modules; a question's choices are its module's group."""
PROSE_MIN_WORDS = 8
"""Docstrings and comment blocks with fewer words are too terse to be prose."""

DOMAIN_FORMATS: dict[str, str] = {
    "code": "text",
    "prose": "text",
    "facts": "text",
    "arithmetic": "instruction",
    "toolcall": "instruction",
    "quiz": "multiple_choice",
}
"""Each domain's ``DataSource.format``, in the order the files are written."""

GENERAL_DOMAINS: tuple[str, ...] = ("code", "prose", "facts")
"""The domains a base model is pretrained on; ``arithmetic`` and ``toolcall`` stay unlearned
targets and ``quiz`` is evaluation-only (its facts are in ``facts``)."""


@dataclass(frozen=True)
class DomainSizes:
    """Rows written per domain. ``None`` keeps every document the standard library yields."""

    code: int | None = None
    """``code`` documents (about 1,100 of ``CODE_CHUNK_CHARS`` on Python 3.11)."""
    prose: int | None = None
    """``prose`` documents (about 2,800 on Python 3.11)."""
    arithmetic: int = 2000
    """Arithmetic problems with worked answers."""
    toolcall: int = 2000
    """Tool-call requests with their JSON call."""
    quiz: int = 144
    """Quiz questions, one per fact, rounded down to a multiple of the ``4 * QUIZ_GROUPS``
    answer modules; ``facts`` has one row per quiz question too."""

    def __post_init__(self) -> None:
        for name in ("code", "prose", "arithmetic", "toolcall", "quiz"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ValueError(f"DomainSizes.{name}={value!r}: use a positive row count")


def write_offline_domains(
    folder: str | os.PathLike[str], seed: int, sizes: DomainSizes | None = None
) -> dict[str, Path]:
    """Write every domain of ``DOMAIN_FORMATS`` to ``folder/<name>.jsonl``; return the paths.

    Each file is written atomically (a temporary file renamed into place).
    """
    sizes = DomainSizes() if sizes is None else sizes
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sources = stdlib_sources()
    # The quiz and the facts rows are about the same facts, drawn once.
    groups = answer_groups(quiz_facts(sources))
    facts = sample_quiz_facts(
        random.Random(f"{seed}:quiz"), quiz_facts(sources), groups, sizes.quiz
    )
    builders: dict[str, Callable[[random.Random], list[dict[str, Any]]]] = {
        "code": lambda rng: _sample(rng, code_documents(sources), sizes.code),
        "prose": lambda rng: _sample(rng, prose_documents(sources), sizes.prose),
        "facts": lambda rng: fact_rows(rng, facts, groups),
        "arithmetic": lambda rng: [arithmetic_row(rng) for _ in range(sizes.arithmetic)],
        "toolcall": lambda rng: [toolcall_row(rng) for _ in range(sizes.toolcall)],
        "quiz": lambda rng: [quiz_row(fact, groups) for fact in facts],
    }
    paths = {}
    for name in DOMAIN_FORMATS:
        rows = builders[name](random.Random(f"{seed}:{name}"))
        paths[name] = folder / f"{name}.jsonl"
        _write_jsonl(paths[name], rows)
    return paths


def _sample(rng: random.Random, items: list[Any], size: int | None) -> list[Any]:
    """``size`` items drawn without replacement, kept in their original order."""
    if size is None or size >= len(items):
        return list(items)
    return [items[i] for i in sorted(rng.sample(range(len(items)), size))]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------
# Standard library text: code and prose
# ---------------------------------------------------------------------------------------


def stdlib_sources() -> list[tuple[str, str]]:
    """``(module, source)`` for each of ``STDLIB_MODULES``, in that order, from the pinned
    corpus. Raises if the file is missing or is not the one this version ships."""
    try:
        packed = STDLIB_CORPUS.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"the demo's corpus {STDLIB_CORPUS} is missing: reinstall dynamics (pip install -e .)"
        ) from None
    digest = hashlib.sha256(packed).hexdigest()
    if digest != STDLIB_CORPUS_SHA256:
        raise ValueError(
            f"the demo's corpus {STDLIB_CORPUS} has SHA-256 {digest}, not the pinned "
            f"{STDLIB_CORPUS_SHA256}: reinstall dynamics to restore the file"
        )
    modules = json.loads(gzip.decompress(packed))["modules"]
    return [(module, modules[module]) for module in STDLIB_MODULES]


def code_documents(sources: list[tuple[str, str]]) -> list[dict[str, str]]:
    """Each module's source cut into ``{"text"}`` documents at blank lines."""
    documents = []
    for _, source in sources:
        chunk: list[str] = []
        size = 0
        for line in source.splitlines(keepends=True):
            chunk.append(line)
            size += len(line)
            if (size >= CODE_CHUNK_CHARS and not line.strip()) or size >= 2 * CODE_CHUNK_CHARS:
                documents.append({"text": "".join(chunk).strip("\n")})
                chunk, size = [], 0
        if "".join(chunk).strip():
            documents.append({"text": "".join(chunk).strip("\n")})
    return documents


def prose_documents(sources: list[tuple[str, str]]) -> list[dict[str, str]]:
    """Docstrings and comment blocks of each module as ``{"text"}`` documents, deduplicated,
    in module order, then source order."""
    seen: set[str] = set()
    documents = []
    for _, source in sources:
        for text in [*_docstrings(source), *_comment_blocks(source)]:
            if len(text.split()) >= PROSE_MIN_WORDS and text not in seen:
                seen.add(text)
                documents.append({"text": text})
    return documents


def _docstrings(source: str) -> Iterator[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=True)
            # Doctest examples are code, not prose.
            if docstring and ">>>" not in docstring:
                yield docstring


def _comment_blocks(source: str) -> Iterator[str]:
    """Runs of full-line comments on consecutive lines, joined into one paragraph."""
    block: list[str] = []
    last_row = -1
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT or token.line.strip() != token.string.strip():
            continue  # a trailing comment after code is a note, not prose
        if token.start[0] != last_row + 1 and block:
            yield from _prose_comment(block)
            block = []
        block.append(token.string.lstrip("#").strip())
        last_row = token.start[0]
    if block:
        yield from _prose_comment(block)


def _prose_comment(lines: list[str]) -> Iterator[str]:
    text = " ".join(line for line in lines if line)
    # Commented-out code and banners are mostly symbols; English is mostly letters.
    letters = sum(c.isalpha() or c.isspace() for c in text)
    if text and letters >= 0.85 * len(text):
        yield text


# ---------------------------------------------------------------------------------------
# The quiz and its facts
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """One quiz fact: the standard-library ``module`` is the only one defining ``name``."""

    module: str
    kind: str  # "function" or "class"
    name: str


def quiz_facts(sources: list[tuple[str, str]]) -> list[Fact]:
    """The public top-level functions and classes defined by exactly one of ``sources``,
    sorted by module then name."""
    definitions: dict[str, list[tuple[str, str]]] = {}
    for module, source in sources:
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if node.name.startswith("_"):
                    continue
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                definitions.setdefault(node.name, []).append((module, kind))
    facts = [
        Fact(module=where[0][0], kind=where[0][1], name=name)
        for name, where in definitions.items()
        # Unambiguous facts only: one module, one definition (not redefined per platform).
        if len(where) == 1
    ]
    return sorted(facts, key=lambda f: (f.module, f.name))


def answer_groups(facts: list[Fact]) -> list[tuple[str, ...]]:
    """The quiz's answer modules: the ``QUIZ_GROUPS * 4`` modules defining the most facts
    (ties by name), cut into groups of four in that order; each group, sorted, is the fixed
    choice list of its modules' questions."""
    counts: dict[str, int] = {}
    for fact in facts:
        counts[fact.module] = counts.get(fact.module, 0) + 1
    ranked = sorted(counts, key=lambda module: (-counts[module], module))[: 4 * QUIZ_GROUPS]
    if len(ranked) < 4 * QUIZ_GROUPS:
        raise ValueError(
            f"the quiz needs {4 * QUIZ_GROUPS} modules with facts, found {len(ranked)}"
        )
    return [tuple(sorted(ranked[k : k + 4])) for k in range(0, len(ranked), 4)]


def sample_quiz_facts(
    rng: random.Random, facts: list[Fact], groups: list[tuple[str, ...]], size: int
) -> list[Fact]:
    """``size // len(modules)`` facts of each answer module (a seeded sample), sorted: every
    module, hence every answer letter, is equally frequent and chance is exactly 25%."""
    modules = [module for group in groups for module in group]
    per_module = size // len(modules)
    chosen = []
    for module in modules:
        candidates = [f for f in facts if f.module == module]
        if len(candidates) < per_module:
            raise ValueError(
                f"DomainSizes.quiz={size}: module {module} defines {len(candidates)} facts, "
                f"fewer than the {per_module} per module asked; lower the quiz size"
            )
        chosen.extend(rng.sample(candidates, per_module))
    return sorted(chosen, key=lambda f: (f.module, f.name))


def choice_prompt(question: str, choices: Sequence[str]) -> str:
    """The scoring prompt of a multiple-choice row, as ``formats.multiple_choice`` renders it."""
    lines = [question, *(f"{ascii_uppercase[k]}. {c}" for k, c in enumerate(choices)), "Answer:"]
    return "\n".join(lines)


def quiz_row(fact: Fact, groups: list[tuple[str, ...]]) -> dict[str, Any]:
    """The question on ``fact``, with its answer group's modules as the choices."""
    (modules,) = [group for group in groups if fact.module in group]
    return {
        "question": f"What is the full name of the {fact.kind} `{fact.name}`?",
        "choices": [f"{module}.{fact.name}" for module in modules],
        "answer": modules.index(fact.module),
    }


def fact_rows(
    rng: random.Random, facts: list[Fact], groups: list[tuple[str, ...]]
) -> list[dict[str, str]]:
    """Two ``{"text"}`` rows per fact, the fact as a sentence and its quiz question answered,
    in a seeded random order: packed neighbours are then unrelated facts, so a block's
    earlier answers say nothing about the next one."""
    rows = []
    for fact in facts:
        row = quiz_row(fact, groups)
        prompt = choice_prompt(row["question"], row["choices"])
        rows.append({"text": f"{prompt} {ascii_uppercase[row['answer']]}"})
        rows.append(
            {
                "text": f"In the Python standard library, the {fact.kind} `{fact.name}` is "
                f"defined in the module `{fact.module}`: its full name is "
                f"`{fact.module}.{fact.name}`."
            }
        )
    rng.shuffle(rows)
    return rows


# ---------------------------------------------------------------------------------------
# Arithmetic with worked steps
# ---------------------------------------------------------------------------------------


def _digits(n: int) -> list[int]:
    """Decimal digits of ``n``, least significant first."""
    return [int(c) for c in reversed(str(n))]


def _addition(a: int, b: int) -> str:
    steps = ["Add the digits from right to left."]
    da, db = _digits(a), _digits(b)
    carry = 0
    for k in range(max(len(da), len(db))):
        x, y = (da[k] if k < len(da) else 0), (db[k] if k < len(db) else 0)
        total = x + y + carry
        steps.append(f"{x} + {y} + {carry} = {total}: write {total % 10}, carry {total // 10}.")
        carry = total // 10
    if carry:
        steps.append(f"Write the last carry {carry}.")
    steps.append(f"So {a} + {b} = {a + b}.")
    return "\n".join(steps)


def _subtraction(a: int, b: int) -> str:
    steps = ["Subtract the digits from right to left, borrowing when needed."]
    da, db = _digits(a), _digits(b)
    borrow = 0
    for k in range(len(da)):
        x, y = da[k] - borrow, (db[k] if k < len(db) else 0)
        if x < y:
            steps.append(f"{x} - {y} needs a borrow: {x + 10} - {y} = {x + 10 - y}.")
            borrow = 1
        else:
            steps.append(f"{x} - {y} = {x - y}.")
            borrow = 0
    steps.append(f"So {a} - {b} = {a - b}.")
    return "\n".join(steps)


def _multiplication(a: int, b: int) -> str:
    steps = [f"Multiply {a} by each digit of {b}."]
    partials = []
    for k, digit in enumerate(_digits(b)):
        partial = a * digit * 10**k
        partials.append(partial)
        steps.append(f"{a} * {digit * 10**k} = {partial}")
    if len(partials) > 1:
        steps.append(f"Add the partial products: {' + '.join(map(str, partials))} = {a * b}.")
    steps.append(f"So {a} * {b} = {a * b}.")
    return "\n".join(steps)


def arithmetic_row(rng: random.Random) -> dict[str, str]:
    """One problem: addition or subtraction of 2-3 digit numbers, or a 2-3 digit number times
    a 1-2 digit number, with worked steps in the response. With the chat template a row is
    at most about 200 bytes, so it fits a 256-byte sequence untruncated."""
    operation = rng.choice(["+", "-", "*"])
    if operation == "*":
        a, b = rng.randint(10, 999), rng.randint(2, 99)
        response = _multiplication(a, b)
    else:
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        if operation == "-":
            a, b = max(a, b), min(a, b)
            response = _subtraction(a, b)
        else:
            response = _addition(a, b)
    return {"prompt": f"What is {a} {operation} {b}?", "response": response}


# ---------------------------------------------------------------------------------------
# Tool calls
# ---------------------------------------------------------------------------------------

CITIES = (
    "Amsterdam", "Athens", "Berlin", "Bogota", "Cairo", "Chicago", "Dublin", "Helsinki",
    "Jakarta", "Lagos", "Lima", "Lisbon", "Madrid", "Montreal", "Nairobi", "Oslo", "Paris",
    "Prague", "Santiago", "Seoul", "Sydney", "Tokyo", "Toronto", "Vienna", "Warsaw", "Zurich",
)  # fmt: skip
CURRENCIES = ("AUD", "BRL", "CAD", "CHF", "EUR", "GBP", "INR", "JPY", "NOK", "USD")
PEOPLE = ("alex", "billie", "chris", "dana", "eli", "farah", "gus", "hana", "ivan", "jo")
TOPICS = (
    "budget review", "design sync", "lunch plans", "project update", "quarterly report",
    "release notes", "team offsite", "travel booking",
)  # fmt: skip
LANGUAGES = ("French", "German", "Italian", "Japanese", "Portuguese", "Spanish", "Swedish")
PHRASES = (
    "good morning", "see you tomorrow", "thank you very much", "where is the station",
    "the meeting is at noon", "happy birthday",
)  # fmt: skip
FILE_PATTERNS = ("*.csv", "*.json", "*.log", "*.md", "*.py", "*.txt", "report_*", "test_*")
FOLDERS = ("data", "docs", "downloads", "logs", "notes", "src", "tests")
SYMBOLS = ("AAPL", "AMZN", "GOOG", "IBM", "MSFT", "NVDA", "ORCL", "TSLA")


def _weather(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    city, unit = rng.choice(CITIES), rng.choice(["celsius", "fahrenheit"])
    request = rng.choice(
        [
            f"What's the weather in {city} in {unit}?",
            f"Tell me the temperature in {city}, in degrees {unit}.",
            f"Is it cold in {city} right now? Use {unit}.",
        ]
    )
    return request, "get_weather", {"city": city, "unit": unit}


def _currency(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    amount = rng.choice([5, 10, 20, 50, 75, 100, 250, 500, 1000, 1200])
    source, target = rng.sample(CURRENCIES, 2)
    request = rng.choice(
        [
            f"Convert {amount} {source} to {target}.",
            f"How much is {amount} {source} in {target}?",
            f"I have {amount} {source}; what is that in {target}?",
        ]
    )
    return request, "convert_currency", {"amount": amount, "from": source, "to": target}


def _timer(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    minutes = rng.randint(1, 90)
    label = rng.choice(["tea", "pasta", "laundry", "break", "call", "oven", "workout"])
    request = rng.choice(
        [
            f"Set a timer for {minutes} minutes for the {label}.",
            f"Remind me about the {label} in {minutes} minutes.",
            f"Start a {minutes} minute {label} timer.",
        ]
    )
    return request, "set_timer", {"minutes": minutes, "label": label}


def _email(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    person, topic = rng.choice(PEOPLE), rng.choice(TOPICS)
    address = f"{person}@example.com"
    request = rng.choice(
        [
            f"Email {address} about the {topic}.",
            f"Send a message to {address} with the subject {topic}.",
            f"Write to {address}: subject is {topic}.",
        ]
    )
    return request, "send_email", {"to": address, "subject": topic}


def _search(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    pattern, folder = rng.choice(FILE_PATTERNS), rng.choice(FOLDERS)
    request = rng.choice(
        [
            f"Find files matching {pattern} in {folder}.",
            f"List the {pattern} files under the {folder} folder.",
            f"Search {folder} for {pattern}.",
        ]
    )
    return request, "search_files", {"pattern": pattern, "folder": folder}


def _event(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    topic = rng.choice(TOPICS)
    date = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    time = f"{rng.randint(8, 18):02d}:{rng.choice(['00', '15', '30', '45'])}"
    request = rng.choice(
        [
            f"Put the {topic} in my calendar on {date} at {time}.",
            f"Schedule a {topic} for {date}, {time}.",
            f"Create an event called {topic} on {date} at {time}.",
        ]
    )
    return request, "create_event", {"title": topic, "date": date, "time": time}


def _translate(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    phrase, language = rng.choice(PHRASES), rng.choice(LANGUAGES)
    request = rng.choice(
        [
            f'Translate "{phrase}" into {language}.',
            f'How do you say "{phrase}" in {language}?',
            f'What is "{phrase}" in {language}?',
        ]
    )
    return request, "translate_text", {"text": phrase, "target_language": language}


def _stock(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    symbol = rng.choice(SYMBOLS)
    request = rng.choice(
        [
            f"What is {symbol} trading at?",
            f"Get me the latest stock price of {symbol}.",
            f"How is {symbol} doing today?",
        ]
    )
    return request, "get_stock_price", {"symbol": symbol}


TOOLS: tuple[Callable[[random.Random], tuple[str, str, dict[str, Any]]], ...] = (
    _weather,
    _currency,
    _timer,
    _email,
    _search,
    _event,
    _translate,
    _stock,
)


def toolcall_row(rng: random.Random) -> dict[str, str]:
    """One request and the JSON call answering it (name first, arguments in a fixed order)."""
    request, name, arguments = rng.choice(TOOLS)(rng)
    return {"prompt": request, "response": json.dumps({"name": name, "arguments": arguments})}
