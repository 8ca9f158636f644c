"""TRL's dataset formats read as they are, with the label masks of TRL's SFT preprocessing.

TRL's masks come from an ``SFTTrainer`` built on the same rows with the same tokenizer (and a
tiny random model): its ``train_dataset`` holds the ids and labels of its own preprocessing,
with the chat template it picks (its training template of a model family with
``assistant_only_loss``, or ``chat_template_path``)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json
import logging
from pathlib import Path
from typing import Any

import datasets
import pytest
import trl.chat_template_utils
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import SFTConfig, SFTTrainer

from dynamics.data import IGNORE_INDEX, DataError, DataSource, LMExample, build_examples
from dynamics.data.loading import check_path
from dynamics.engine.config import DatasetConfig
from tests.fixtures.tiny_tokenizer import CHATML_TEMPLATE, FIXTURES, tiny_tokenizer

TRL_FIXTURES = FIXTURES / "trl"
QWEN3_TEMPLATE = (
    Path(trl.chat_template_utils.__file__).parent / "chat_templates" / "qwen3.jinja"
).read_text()
"""Qwen3's chat template as Qwen3 ships it (TRL keeps a copy to recognise it): it renders the
<think> block of the last assistant turn only, so earlier turns render differently once a
later turn follows, and it has no {% generation %} blocks."""
QWEN3_STYLE = TRL_FIXTURES / "qwen3_style_training.jinja"
"""A small template modelled on TRL's Qwen3 training template, with {% generation %} blocks."""

GENERATION_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}{{ "
    "'<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>\\n' }}{% "
    "endgeneration %}{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}"
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
    tmp_path: Path,
    chat_template: str | None = GENERATION_TEMPLATE,
    **sft_config: Any,
) -> list[tuple[list[int], list[int]]]:
    """The ids and labels of TRL's ``SFTTrainer`` preprocessing of ``rows``, with a fresh tiny
    tokenizer of ``chat_template`` (the trainer sets its pad token)."""
    tokenizer = tiny_tokenizer(chat_template=chat_template)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    args = SFTConfig(
        output_dir=str(tmp_path),
        max_length=None,
        report_to=[],
        use_cpu=True,
        bf16=False,
        **sft_config,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer)
    # The labels TRL trains on: its collator's, one row at a time (so no padding).
    batches = [trainer.data_collator([row]) for row in trainer.train_dataset]
    return [(batch["input_ids"][0].tolist(), batch["labels"][0].tolist()) for batch in batches]


def pairs(examples: list[LMExample]) -> list[tuple[list[int], list[int]]]:
    return [(e.input_ids.tolist(), e.labels.tolist()) for e in examples]


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
    expected = trl_examples(rows, tmp_path, assistant_only_loss=assistant_only_loss)
    got = pairs(ours(rows, tokenizer, loss_on=loss_on))
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
            r"row 0: 'completion' is the response and must start with a message of role "
            r"'assistant', not 'user'",
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


@pytest.mark.parametrize("fixture", ["multi_turn.jsonl", "tool_calling.jsonl"])
def test_qwen3_template_all_assistant_masks_equal_trls(fixture: str, tmp_path: Path) -> None:
    """Qwen3's own template has no {% generation %} blocks: the assistant turns are masked by
    TRL's Qwen3 training template, as SFTTrainer masks them with assistant_only_loss."""
    rows = rows_of(fixture)
    expected = trl_examples(rows, tmp_path, QWEN3_TEMPLATE, assistant_only_loss=True)
    got = pairs(ours(rows, tiny_tokenizer(chat_template=QWEN3_TEMPLATE), loss_on="all-assistant"))
    assert got == expected


def test_multi_turn_all_assistant_with_qwen3s_template_trains_every_turn() -> None:
    qwen3 = tiny_tokenizer(chat_template=QWEN3_TEMPLATE)
    example = ours(rows_of("multi_turn.jsonl").select([0]), qwen3, loss_on="all-assistant")[0]
    assert loss_text(qwen3, example) == (
        "<think>\n\n</think>\n\nHello! How can I help?<|im_end|>\n"
        "|<think>\n\n</think>\n\nOne, two, three.<|im_end|>\n"
    )


def test_tools_tool_calls_and_reasoning_reach_the_template_as_in_trl(tmp_path: Path) -> None:
    """The tools column, the assistant's tool_calls and reasoning_content and the tool
    messages are rendered by a chat_template_path template, and masked as TRL masks them."""
    rows = rows_of("tool_calling.jsonl")
    expected = trl_examples(
        rows, tmp_path, None, assistant_only_loss=True, chat_template_path=str(QWEN3_STYLE)
    )
    plain = tiny_tokenizer(chat_template=None)
    examples = ours(rows, plain, loss_on="all-assistant", chat_template_path=str(QWEN3_STYLE))
    assert pairs(examples) == expected
    rendered = plain.decode(examples[0].input_ids.tolist())
    assert '"name": "get_weather", "description": "The current weather in a city."' in rendered
    assert '<tool_response>\n{"temperature": 21, "sky": "sunny"}\n</tool_response>' in rendered
    assert loss_text(plain, examples[0]) == (
        "<think>\nThe user wants the weather, so I call get_weather.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
        "|<think>\n\n</think>\n\nIt is sunny and 21 degrees in Paris.<|im_end|>\n"
    )


@pytest.mark.parametrize(
    ("kwargs", "response"),
    [
        ({}, "<think>\n\n</think>\n\n2 + 3 = 5.<|im_end|>\n"),
        ({"enable_thinking": False}, "2 + 3 = 5.<|im_end|>\n"),
    ],
)
def test_chat_template_kwargs_reach_the_template_as_in_trl(
    kwargs: dict[str, Any], response: str, tmp_path: Path
) -> None:
    """enable_thinking=False ends the generation prompt with the empty <think> block, which
    then belongs to the prompt (TRL reads the kwargs from a chat_template_kwargs column)."""
    rows = rows_of("prompt_completion.jsonl")
    trl_rows = rows.add_column("chat_template_kwargs", [kwargs] * len(rows)) if kwargs else rows
    expected = trl_examples(trl_rows, tmp_path, None, chat_template_path=str(QWEN3_STYLE))
    plain = tiny_tokenizer(chat_template=None)
    examples = ours(rows, plain, chat_template_path=str(QWEN3_STYLE), chat_template_kwargs=kwargs)
    assert pairs(examples) == expected
    assert loss_text(plain, examples[0]) == response


def test_a_tool_call_without_content_renders_as_an_empty_content(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    row = rows_of("tool_calling.jsonl")[0]
    null = {
        **row,
        "messages": [{**m, "content": None} if m.get("tool_calls") else m for m in row["messages"]],
    }
    source = {"loss_on": "all-assistant", "chat_template_path": str(QWEN3_STYLE)}
    (with_null,) = ours(datasets.Dataset.from_list([null]), tokenizer, **source)
    (with_empty,) = ours(datasets.Dataset.from_list([row]), tokenizer, **source)
    assert pairs([with_null]) == pairs([with_empty])


def test_a_template_without_generation_blocks_that_trl_cannot_patch_is_refused() -> None:
    """ChatML has no {% generation %} blocks and TRL no training template for it."""
    chatml = tiny_tokenizer(chat_template=CHATML_TEMPLATE)
    rows = rows_of("multi_turn.jsonl")
    message = (
        r"dataset 'chat' \(rows in memory\): loss_on='all-assistant' .* set chat_template_path "
        r"to a copy of it with \{% generation %\}"
    )
    with pytest.raises(DataError, match=message):
        build_examples(
            rows,
            chatml,
            DataSource(name="chat", rows=rows, format="instruction", loss_on="all-assistant"),
            sequence_length=100,
        )


@pytest.mark.parametrize(
    ("fixture", "fields", "message"),
    [
        (
            "tool_calling.jsonl",
            {},
            r"row 0: its tools, reasoning_content, tool_calls need a chat template",
        ),
        (
            "multi_turn.jsonl",
            {"chat_template_kwargs": {"enable_thinking": False}},
            r"chat_template_kwargs are passed to a chat template, and the tokenizer has none",
        ),
    ],
)
def test_what_the_fallback_template_cannot_render_is_refused(
    fixture: str, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(DataError, match=message):
        ours(rows_of(fixture), tiny_tokenizer(chat_template=None), **fields)


def test_tools_that_are_not_a_list_of_schemas_name_the_row(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    for tools, message in (
        ("[{", r"row 0: 'tools' is not valid JSON"),
        ('{"name": "f"}', r"row 0: 'tools' must hold a list of tool schemas"),
    ):
        with pytest.raises(DataError, match=message):
            ours(datasets.Dataset.from_list([{"messages": messages, "tools": tools}]), tokenizer)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"chat_template_kwargs": {"tokenize": False}},
            r"chat_template_kwargs sets tokenize, which the",
        ),
        (
            {"format": "text", "chat_template_kwargs": {"enable_thinking": False}},
            r"format is 'text'",
        ),
        (
            {"chat_template_path": "missing.jinja"},
            r"chat_template_path 'missing.jinja' is not a file",
        ),
    ],
)
def test_chat_template_fields_are_checked(fields: dict[str, Any], message: str) -> None:
    config = {"name": "chat", "role": "target", "format": "instruction", **fields}
    with pytest.raises((ValueError, DataError), match=message):
        check_path(DatasetConfig(**config).data_source())


def test_run_config_passes_the_chat_template_fields() -> None:
    source = DatasetConfig(
        name="chat",
        role="target",
        format="instruction",
        chat_template_path=str(QWEN3_STYLE),
        chat_template_kwargs={"enable_thinking": False},
        columns={"tools": "functions"},
    ).data_source()
    assert (source.chat_template_path, source.chat_template_kwargs, source.tools_column) == (
        str(QWEN3_STYLE),
        {"enable_thinking": False},
        "functions",
    )


def test_generation_blocks_without_the_end_of_turn_token_are_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As TRL warns: the model would never be trained to end its turn."""
    before_end = GENERATION_TEMPLATE.replace(
        "{{ message['content'] + '<|im_end|>\\n' }}{% endgeneration %}",
        "{{ message['content'] }}{% endgeneration %}{{ '<|im_end|>\\n' }}",
    )
    assert before_end != GENERATION_TEMPLATE
    rows = rows_of("multi_turn.jsonl")
    with caplog.at_level(logging.WARNING, logger="dynamics.data.chat_templates"):
        ours(rows, tiny_tokenizer(chat_template=GENERATION_TEMPLATE), loss_on="all-assistant")
        assert "end-of-turn" not in caplog.text
        ours(rows, tiny_tokenizer(chat_template=before_end), loss_on="all-assistant")
    assert (
        "rows in memory: the chat template's {% generation %} blocks leave out the assistant's"
        in caplog.text
    )
