"""``instruction``: a conversation per row, the loss on the assistant's response.

A row is a ``messages`` list, a prompt/response pair turned into
``[system?, user, assistant]``, or TRL's prompt/completion pair (``completion`` is read where
the rows have no ``response`` column): two strings, read as the prompt/response pair, or two
chat lists (conversational), the prompt's messages followed by the completion's, which
starts and ends with the assistant's (``dynamics.data.conversations``). The response is the
last message (or the whole completion); everything before it is the prompt, and its tokens
get label ``-100``.

With a chat template (``dynamics.data.chat_templates``) the row is rendered with
``tokenizer.apply_chat_template`` twice, the prompt alone with ``add_generation_prompt=True``
and the whole conversation, and both are tokenized without extra special tokens (the
template writes them). When the prompt's ids are a prefix of the whole conversation's ids,
the boundary is their length (as TRL's ``completion_mask``). When they are not (a BPE merge
across the boundary), but the prompt's *text* is a prefix of the conversation's text, the
example is the prompt's ids followed by the ids of the rest of the text, so the boundary is
exact by construction. Otherwise the template rewrites earlier turns and ``DataError`` is
raised. Without a chat template, ``FALLBACK_TEMPLATE`` renders the prompt and the response's
tokens are followed by EOS.

With ``source.loss_on == "all-assistant"`` every assistant turn carries the loss (of the
completion, for a prompt/completion pair), as TRL's ``SFTTrainer`` with
``assistant_only_loss=True`` masks it: the conversation is tokenized by
``apply_chat_template(..., return_assistant_tokens_mask=True)`` and a token carries the loss
where the template's ``{% generation %}`` blocks mark it (for a pair, only after the tokens
it shares with the prompt rendered with the generation prompt, TRL's ``completion_mask``).
A template without such blocks is replaced by TRL's training template of its model family;
one TRL has none for is refused with ``DataError``.

The chat template gets each message's keys as they are (``tool_calls``,
``reasoning_content``, the ``name`` of a ``tool`` message, ...; an assistant message with
``tool_calls`` and a null or no content gets ``""``), the row's tool schemas as ``tools=``
(``source.tools_column``: a list of JSON schemas or its JSON text, as TRL reads it), and
``source.chat_template_kwargs`` (e.g. ``enable_thinking=False``). ``FALLBACK_TEMPLATE``
cannot render tools, tool calls, reasoning or template variables: a row with them, or
``chat_template_kwargs``, is refused without a chat template.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dynamics.data.chat_templates import render, render_text, source_chat_template
from dynamics.data.conversations import Chat, as_chat
from dynamics.data.errors import DataError
from dynamics.data.examples import IGNORE_INDEX, LMExample
from dynamics.data.formats.base import RowFormat
from dynamics.data.formats.registry import register
from dynamics.data.tokens import (
    common_prefix_length,
    encode_texts,
    eos_token_id,
    masked_example,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dynamics.data.source import DataSource


class InstructionFormat(RowFormat):
    name = "instruction"
    summary = (
        "prompt/response pairs, messages, or TRL's prompt/completion: strings or message lists"
    )
    renders_chats = True

    def required_columns(self, source: DataSource, columns: list[str]) -> list[str]:
        """A chat list where the rows have ``messages_column``, else the pair's columns."""
        system = [] if source.system_column is None else [source.system_column]
        if source.messages_column in columns:
            # A system prompt is read from its own column next to the chat list too.
            return [source.messages_column, *system]
        return [source.prompt_column, source.response_key(columns), *system]

    def column_fix(self, source: DataSource) -> str:
        return (
            f"give the rows a {source.messages_column!r} chat list, or set messages_column, "
            "or prompt_column/response_column (and system_column) to the pair's columns (TRL's "
            "prompt/completion columns are read as they are)"
        )

    def chat_template(self, tokenizer: PreTrainedTokenizerBase, source: DataSource) -> str | None:
        return source_chat_template(tokenizer, source)

    def documents(
        self,
        rows: list[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        source: DataSource,
        start: int,
        chat_template: str | None,
    ) -> list[LMExample]:
        return _instruction_documents(rows, tokenizer, source, start, chat_template)


def _instruction_documents(
    rows: list[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    source: DataSource,
    start: int,
    template: str | None,
) -> list[LMExample]:
    """Each row as a conversation rendered with ``template`` (``source_chat_template``)."""
    use_messages = bool(rows) and source.messages_column in rows[0]
    chats = [as_chat(row, start + i, source, use_messages) for i, row in enumerate(rows)]
    if template is None and tokenizer.chat_template is None:
        if source.chat_template_kwargs:
            raise DataError(
                f"{source.description}: chat_template_kwargs are passed to a chat template, and "
                "the tokenizer has none; set chat_template_path to the model's Jinja chat "
                "template, or remove chat_template_kwargs"
            )
        return [
            _fallback_document(tokenizer, chat, start + i, source) for i, chat in enumerate(chats)
        ]
    if source.loss_on == "last-assistant":
        return _response_documents(tokenizer, chats, template, source, start)
    if not tokenizer.is_fast:
        raise DataError(
            f"{source.description}: loss_on='all-assistant' locates the assistant's tokens by "
            "their character offsets, which only a fast tokenizer gives; load a fast tokenizer "
            "(use_fast=True) or use loss_on='last-assistant'"
        )
    return [
        _assistant_document(tokenizer, chat, template, source, start + i)
        for i, chat in enumerate(chats)
    ]


def _response_documents(
    tokenizer: PreTrainedTokenizerBase,
    chats: list[Chat],
    template: str | None,
    source: DataSource,
    start: int,
) -> list[LMExample]:
    """``loss_on="last-assistant"``: the loss on the tokens after the prompt's rendering with
    the generation prompt (see the module docstring)."""
    fulls = [
        render_text(tokenizer, c, c.messages, template, source, start + i, False)
        for i, c in enumerate(chats)
    ]
    prompts = [
        render_text(tokenizer, c, c.messages[: c.response_start], template, source, start + i, True)
        for i, c in enumerate(chats)
    ]
    prompt_ids = encode_texts(tokenizer, prompts, special=False)
    full_ids = encode_texts(tokenizer, fulls, special=False)
    documents = []
    for index, (prompt, full, p_ids, f_ids) in enumerate(
        zip(prompts, fulls, prompt_ids, full_ids, strict=True)
    ):
        if f_ids[: len(p_ids)] == p_ids:
            documents.append(masked_example(p_ids, f_ids[len(p_ids) :]))
        elif full.startswith(prompt):
            # The tokenizer merged tokens across the boundary: tokenize the two texts apart.
            rest = encode_texts(tokenizer, [full[len(prompt) :]], special=False)[0]
            documents.append(masked_example(p_ids, rest))
        else:
            raise _not_a_prefix(source, start + index)
    return documents


def _assistant_document(
    tokenizer: PreTrainedTokenizerBase,
    chat: Chat,
    template: str | None,
    source: DataSource,
    index: int,
) -> LMExample:
    """``loss_on="all-assistant"``: the conversation tokenized by ``apply_chat_template`` with
    ``return_assistant_tokens_mask=True``, a token carrying the loss where the template's
    ``{% generation %}`` blocks mark it, as TRL's ``assistant_only_loss``; for a
    prompt/completion pair only from where the prompt's tokens (rendered with the generation
    prompt) and the conversation's diverge, as TRL's ``completion_only_loss``."""
    encoded = render(
        tokenizer,
        chat,
        chat.messages,
        template,
        source,
        index,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids = np.asarray(encoded["input_ids"], dtype=np.int32)
    trained = np.asarray(encoded["assistant_masks"], dtype=bool)
    if chat.assistant_start > 0:
        prompt = render(
            tokenizer,
            chat,
            chat.messages[: chat.assistant_start],
            template,
            source,
            index,
            tokenize=True,
            return_dict=True,
            add_generation_prompt=True,
        )["input_ids"]
        trained[: common_prefix_length(prompt, ids.tolist())] = False
    if not trained.any():
        raise DataError(
            f"{source.description}, row {index}: the chat template marks none of its tokens as the "
            "assistant's ({% generation %} blocks), which loss_on='all-assistant' trains; set "
            "chat_template_path to a template with {% generation %}...{% endgeneration %} around "
            "each assistant turn, install TRL (pip install 'dynamics[trl]') for its training "
            "template of this model family, or use loss_on='last-assistant'"
        )
    return LMExample(input_ids=ids, labels=np.where(trained, ids, IGNORE_INDEX).astype(np.int32))


def _fallback_document(
    tokenizer: PreTrainedTokenizerBase, chat: Chat, index: int, source: DataSource
) -> LMExample:
    """A conversation rendered with ``FALLBACK_TEMPLATE``, its parts tokenized apart (the first
    with the tokenizer's special tokens) so the loss boundaries are exact, and EOS after the
    last message. ``last-assistant``: the loss is on everything after the generation prompt
    of the response's first message; ``all-assistant``: on the content of every assistant
    message it trains (with the blank line that ends it, or the EOS of the last). Tools, tool
    calls and reasoning have no rendering there: a row with them is refused."""
    _check_fallback(chat, index, source)
    conversation, loss_on = chat.messages, source.loss_on
    first_loss = chat.response_start if loss_on == "last-assistant" else chat.assistant_start
    last = len(conversation) - 1
    parts: list[tuple[str, bool]] = []
    for i, message in enumerate(conversation):
        header = f"### {message['role'].capitalize()}:\n"
        body = message["content"] + ("" if i == last else "\n\n")
        if loss_on == "last-assistant":
            parts += [(header, i > first_loss), (body, i >= first_loss)]
        else:
            parts += [(header, False), (body, i >= first_loss and message["role"] == "assistant")]
    groups: list[tuple[str, bool]] = []
    for text, loss in parts:
        if groups and groups[-1][1] == loss:
            groups[-1] = (groups[-1][0] + text, loss)
        elif text:
            groups.append((text, loss))
    ids: list[int] = []
    labels: list[int] = []
    for number, (text, loss) in enumerate(groups):
        encoded = encode_texts(tokenizer, [text], special=number == 0)[0]
        ids += encoded
        labels += encoded if loss else [IGNORE_INDEX] * len(encoded)
    eos = eos_token_id(tokenizer)
    array = np.asarray([*ids, eos], dtype=np.int32)
    return LMExample(input_ids=array, labels=np.asarray([*labels, eos], dtype=np.int32))


def _check_fallback(chat: Chat, index: int, source: DataSource) -> None:
    """Refuse what ``FALLBACK_TEMPLATE`` would drop: tools, tool calls, reasoning."""
    unrendered = ["tools"] if chat.tools is not None else []
    unrendered += sorted(
        {key for m in chat.messages for key in ("tool_calls", "reasoning_content") if key in m}
    )
    if unrendered:
        raise DataError(
            f"{source.description}, row {index}: its {', '.join(unrendered)} need a chat template, "
            "and the tokenizer has none; set chat_template_path to the model's Jinja chat template"
        )


def _not_a_prefix(source: DataSource, index: int) -> DataError:
    return DataError(
        f"{source.description}, row {index}: the chat template's rendering of the "
        "prompt with add_generation_prompt=True is not a prefix of its rendering of the "
        "whole conversation (it renders earlier turns differently, or the response does not "
        "start as the generation prompt ends, e.g. reasoning_content after the empty <think> "
        "block of enable_thinking=false), so the response tokens cannot be located; use a "
        "template that renders the prompt the same way (chat_template_path), or set "
        "tokenizer.chat_template = None to use the fallback template"
    )


register(InstructionFormat())
