"""TRL's dataset formats read as they are, with the label masks of TRL's SFT preprocessing.

TRL's masks come from ``SFTTrainer._prepare_dataset`` itself, run on the same rows with the
same tokenizer (the trainer object is not needed: the method reads only the tokenizer, the
chat template override and ``completion_only_loss`` from it)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import datasets
import pytest
from transformers import PreTrainedTokenizerFast
from trl import SFTConfig
from trl.trainer.sft_trainer import SFTTrainer

from dynamics.data import IGNORE_INDEX, DataError, DataSource, LMExample, build_examples
from dynamics.engine.config import DatasetConfig
from tests.fixtures.tiny_tokenizer import FIXTURES, tiny_tokenizer

TRL_FIXTURES = FIXTURES / "trl"

GENERATION_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""The ChatML template of SmolLM2 and Qwen with TRL's ``{% generation %}`` block around each
assistant turn after its generation prompt, which TRL's ``assistant_only_loss`` needs."""


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return tiny_tokenizer(chat_template=GENERATION_TEMPLATE)


def rows_of(name: str) -> datasets.Dataset:
    return datasets.Dataset.from_list(
        [json.loads(line) for line in (TRL_FIXTURES / name).read_text().splitlines()]
    )


def ours(
    rows: datasets.Dataset, tokenizer: PreTrainedTokenizerFast, **fields: Any
) -> list[LMExample]:
    examples = build_examples(
        rows,
        tokenizer,
        DataSource(rows=rows, format="instruction", **fields),
        sequence_length=10_000,
    )
    assert all(isinstance(e, LMExample) for e in examples)
    return examples  # type: ignore[return-value]


def trl_examples(
    rows: datasets.Dataset,
    tokenizer: PreTrainedTokenizerFast,
    tmp_path: Path,
    *,
    assistant_only_loss: bool,
) -> list[tuple[list[int], list[int]]]:
    args = SFTConfig(
        output_dir=str(tmp_path),
        max_length=None,
        assistant_only_loss=assistant_only_loss,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    trainer = SimpleNamespace(
        _tokenizer=tokenizer, chat_template=None, completion_only_loss="prompt" in rows.column_names
    )
    prepared = SFTTrainer._prepare_dataset(trainer, rows, tokenizer, args, False, None, "train")  # type: ignore[arg-type]
    return list(zip(prepared["input_ids"], prepared["labels"], strict=True))


@pytest.mark.parametrize(
    ("fixture", "loss_on", "assistant_only_loss"),
    [
        # TRL's completion_only_loss on a conversational prompt/completion pair.
        ("prompt_completion.jsonl", "last-assistant", False),
        # TRL's assistant_only_loss on multi-turn messages.
        ("multi_turn.jsonl", "all-assistant", True),
        # Both: the assistant turns of the completion.
        ("prompt_completion.jsonl", "all-assistant", True),
    ],
)
def test_label_masks_equal_trls(
    fixture: str,
    loss_on: str,
    assistant_only_loss: bool,
    tokenizer: PreTrainedTokenizerFast,
    tmp_path: Path,
) -> None:
    rows = rows_of(fixture)
    expected = trl_examples(rows, tokenizer, tmp_path, assistant_only_loss=assistant_only_loss)
    got = [
        (e.input_ids.tolist(), e.labels.tolist()) for e in ours(rows, tokenizer, loss_on=loss_on)
    ]
    assert got == expected
    assert all(any(label != IGNORE_INDEX for label in labels) for _, labels in got)


def loss_text(tokenizer: PreTrainedTokenizerFast, example: LMExample) -> str:
    """The decoded tokens with a loss, runs of them joined by '|'."""
    runs, current = [], []
    for token, label in zip(example.input_ids.tolist(), example.labels.tolist(), strict=True):
        if label != IGNORE_INDEX:
            current.append(token)
        elif current:
            runs.append(str(tokenizer.decode(current)))
            current = []
    if current:
        runs.append(str(tokenizer.decode(current)))
    return "|".join(runs)


def test_messages_train_the_last_turn_by_default_and_every_assistant_turn_on_request(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    rows = rows_of("multi_turn.jsonl").select([0])
    last, every = ours(rows, tokenizer)[0], ours(rows, tokenizer, loss_on="all-assistant")[0]
    assert last.input_ids.tolist() == every.input_ids.tolist()
    assert loss_text(tokenizer, last) == "One, two, three.<|im_end|>\n"
    assert (
        loss_text(tokenizer, every)
        == "Hello! How can I help?<|im_end|>\n|One, two, three.<|im_end|>\n"
    )


def test_all_assistant_without_a_chat_template_trains_each_assistant_content() -> None:
    plain = tiny_tokenizer(chat_template=None)
    rows = rows_of("multi_turn.jsonl").select([0])
    last, every = ours(rows, plain)[0], ours(rows, plain, loss_on="all-assistant")[0]
    assert plain.decode(every.input_ids) == (
        "### User:\nHi!\n\n### Assistant:\nHello! How can I help?\n\n### User:\nCount to three.\n\n"
        "### Assistant:\nOne, two, three.<|endoftext|>"
    )
    assert every.input_ids.tolist() == last.input_ids.tolist()
    assert loss_text(plain, last) == "One, two, three.<|endoftext|>"
    assert loss_text(plain, every) == "Hello! How can I help?\n\n|One, two, three.<|endoftext|>"


def test_string_prompt_completion_reads_as_prompt_response(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    rows = rows_of("prompt_completion_text.jsonl")
    renamed = rows.rename_column("completion", "response")
    got = [(e.input_ids.tolist(), e.labels.tolist()) for e in ours(rows, tokenizer)]
    assert got == [(e.input_ids.tolist(), e.labels.tolist()) for e in ours(renamed, tokenizer)]
    assert loss_text(tokenizer, ours(rows, tokenizer)[1]) == "An apple.<|im_end|>\n"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"prompt": "Hi", "completion": [{"role": "assistant", "content": "Hello"}]},
            r"row 0: 'prompt' and 'completion' must both be strings or both be lists",
        ),
        (
            {
                "prompt": [{"role": "user", "content": "Hi"}],
                "completion": [{"role": "user", "content": "Hello"}],
            },
            r"row 0: 'completion' is the response and must start with a message of role 'assistant', not 'user'",
        ),
    ],
)
def test_malformed_prompt_completion_rows_name_the_row(
    row: dict[str, Any], message: str, tokenizer: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(DataError, match=message):
        ours(datasets.Dataset.from_list([row]), tokenizer)


def test_run_config_reads_completion_columns_and_loss_on() -> None:
    config = DatasetConfig(
        name="chat",
        role="target",
        format="instruction",
        loss_on="all-assistant",
        columns={"completion": "answer"},
    )
    source = config.data_source()
    assert (source.loss_on, source.completion_column) == ("all-assistant", "answer")
    with pytest.raises(ValueError, match="loss_on"):
        DatasetConfig(name="chat", role="target", format="instruction", loss_on="every-turn")
