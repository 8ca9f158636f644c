"""The demo's offline domains: deterministic files in the shapes the data layer reads."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import ast
import json
import re
from collections import Counter
from pathlib import Path

import datasets
import pytest

from dynamics.data import ChoiceExample, DataSource, build_examples, load_rows, offline
from dynamics.data.offline import (
    DOMAIN_FORMATS,
    GENERAL_DOMAINS,
    QUIZ_GROUPS,
    STDLIB_MODULES,
    DomainSizes,
    answer_groups,
    choice_prompt,
    quiz_facts,
    stdlib_sources,
    write_offline_domains,
)
from tests.fixtures.tiny_tokenizer import tiny_tokenizer

SMALL = DomainSizes(code=40, prose=40, arithmetic=60, toolcall=60, quiz=48)


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_offline_domains(tmp_path_factory.mktemp("seed0"), seed=0, sizes=SMALL)


def test_same_seed_writes_identical_files(written: dict[str, Path], tmp_path: Path) -> None:
    again = write_offline_domains(tmp_path, seed=0, sizes=SMALL)
    assert list(again) == list(DOMAIN_FORMATS)
    for name, path in written.items():
        assert again[name].read_bytes() == path.read_bytes(), name


def test_another_seed_draws_other_rows(written: dict[str, Path], tmp_path: Path) -> None:
    other = write_offline_domains(tmp_path, seed=1, sizes=SMALL)
    for name, path in written.items():
        # Every domain is sampled or generated, so every file changes with the seed.
        assert other[name].read_bytes() != path.read_bytes(), name


def test_rows_have_the_columns_of_their_format(written: dict[str, Path], tmp_path: Path) -> None:
    expected_rows = {
        "code": SMALL.code,
        "prose": SMALL.prose,
        "facts": 2 * SMALL.quiz,
        "arithmetic": SMALL.arithmetic,
        "toolcall": SMALL.toolcall,
        "quiz": SMALL.quiz,
    }
    columns = {
        "text": ["text"],
        "instruction": ["prompt", "response"],
        "multiple_choice": ["question", "choices", "answer"],
    }
    for name, path in written.items():
        # The real reading path: datasets' json builder and the column check.
        source = DataSource(path=str(path), format=DOMAIN_FORMATS[name])  # type: ignore[arg-type]
        rows = load_rows(source, cache_dir=tmp_path)
        assert rows.column_names == columns[DOMAIN_FORMATS[name]], name
        assert len(rows) == expected_rows[name], name
        if DOMAIN_FORMATS[name] == "text":
            assert all(text.strip() for text in rows["text"]), name
    assert set(GENERAL_DOMAINS) <= set(DOMAIN_FORMATS)


def test_code_and_prose_are_stdlib_text(written: dict[str, Path]) -> None:
    sources = "\n".join(source for _, source in stdlib_sources())
    for row in read(written["code"]):
        assert row["text"].strip() and row["text"] in sources
    prose = read(written["prose"])
    assert all(len(row["text"].split()) >= 8 and ">>>" not in row["text"] for row in prose)


def test_quiz_questions_are_true_and_balanced(written: dict[str, Path]) -> None:
    sources = dict(stdlib_sources())
    rows = read(written["quiz"])
    groups = answer_groups(quiz_facts(stdlib_sources()))
    answers = []
    for row in rows:
        match = re.fullmatch(r"What is the full name of the (\w+) `(\w+)`\?", row["question"])
        assert match is not None
        kind, name = match.groups()
        modules = [choice.removesuffix(f".{name}") for choice in row["choices"]]
        assert tuple(modules) in groups
        node_type = ast.ClassDef if kind == "class" else ast.FunctionDef
        for k, module in enumerate(modules):
            defined = {
                node.name for node in ast.parse(sources[module]).body if isinstance(node, node_type)
            }
            # True for the answer and false for the other choices: the facts are unambiguous.
            assert (name in defined) == (k == row["answer"])
        answers.append(modules[row["answer"]])
    # Every answer module, hence every letter, is right equally often: chance is 25%.
    per_module = SMALL.quiz // (4 * QUIZ_GROUPS)
    assert Counter(answers) == {module: per_module for group in groups for module in group}
    assert set(Counter(row["answer"] for row in rows).values()) == {len(rows) // 4}


def test_facts_state_and_answer_each_quiz_question(written: dict[str, Path]) -> None:
    quiz, facts = read(written["quiz"]), read(written["facts"])
    texts = [row["text"] for row in facts]
    assert len(texts) == 2 * len(quiz)
    for row in quiz:
        full_name = row["choices"][row["answer"]]
        answered = f"{choice_prompt(row['question'], row['choices'])} {'ABCD'[row['answer']]}"
        assert answered in texts
        assert any(t.endswith(f"its full name is `{full_name}`.") for t in texts)
    # Shuffled, so packed neighbours are unrelated facts, not a run of one module's answers.
    assert texts != sorted(texts)


def test_choice_prompt_is_the_scoring_prompt(written: dict[str, Path]) -> None:
    quiz = read(written["quiz"])[:5]
    source = DataSource(path="quiz.jsonl", format="multiple_choice")
    tokenizer = tiny_tokenizer()
    examples = build_examples(
        datasets.Dataset.from_list(quiz), tokenizer, source, sequence_length=512
    )
    for row, example in zip(quiz, examples, strict=True):
        assert isinstance(example, ChoiceExample)
        assert tokenizer.decode(example.input_ids.tolist()) == choice_prompt(
            row["question"], row["choices"]
        )


def test_arithmetic_answers_are_right(written: dict[str, Path]) -> None:
    for row in read(written["arithmetic"]):
        a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", row["prompt"]).groups()
        final = row["response"].splitlines()[-1]
        expected = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert final == f"So {a} {op} {b} = {expected}."
        # Short enough for a 256-byte sequence with the chat template's ~25 bytes.
        assert len((row["prompt"] + row["response"]).encode()) <= 220


def test_toolcalls_are_json_calls(written: dict[str, Path]) -> None:
    for row in read(written["toolcall"]):
        call = json.loads(row["response"])
        assert list(call) == ["name", "arguments"] and call["arguments"]
        # Every string argument comes from the request (tool-call grounding).
        for value in call["arguments"].values():
            if isinstance(value, str):
                assert value in row["prompt"]


def test_quiz_facts_are_unambiguous() -> None:
    facts = quiz_facts(stdlib_sources())
    assert facts == sorted(facts, key=lambda f: (f.module, f.name))
    assert len({f.name for f in facts}) == len(facts)
    # The default quiz size fits every answer module on this Python.
    write_sizes = DomainSizes()
    groups = answer_groups(facts)
    for module in (m for group in groups for m in group):
        assert sum(f.module == module for f in facts) >= write_sizes.quiz // (4 * QUIZ_GROUPS)


def test_sizes_are_validated() -> None:
    with pytest.raises(ValueError, match=r"DomainSizes\.quiz"):
        DomainSizes(quiz=0)


def test_the_corpus_is_pinned_and_not_read_from_the_running_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sources = stdlib_sources()
    assert [module for module, _ in sources] == list(STDLIB_MODULES)
    assert all(len(source) > 500 for _, source in sources)
    # Another interpreter's standard library is never looked at.
    monkeypatch.setattr("sysconfig.get_paths", lambda: {"stdlib": "/nonexistent"})
    assert stdlib_sources() == sources


def test_a_corpus_that_is_not_the_pinned_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    changed = tmp_path / "stdlib_corpus.json.gz"
    changed.write_bytes(offline.STDLIB_CORPUS.read_bytes() + b"\0")
    monkeypatch.setattr(offline, "STDLIB_CORPUS", changed)
    with pytest.raises(ValueError, match="not the pinned"):
        stdlib_sources()
    monkeypatch.setattr(offline, "STDLIB_CORPUS", tmp_path / "missing.json.gz")
    with pytest.raises(FileNotFoundError, match="reinstall"):
        stdlib_sources()
