"""Rows to token examples: chat formatting, loss masks, truncation and packing.

Public API:

- ``LMExample(input_ids, labels)``: one language-modelling example (int32 arrays of equal
  length; ``labels`` is ``-100`` where no loss is taken).
- ``ChoiceExample(input_ids, choice_token_ids, answer_index)``: one multiple-choice
  question for letter-restricted argmax accuracy (paper appendix M).
- ``tokenize_rows(rows, tokenizer, source) -> datasets.Dataset``: every row's token ids
  and loss labels through ``Dataset.map``, cached on disk for rows read from files (the
  cache key includes ``TOKENIZATION_VERSION``, a hash of this module's and ``loading``'s code).
- ``build_examples(rows, tokenizer, source, *, sequence_length, packing=False)``: tokenize
  every row once (``tokenize_rows``) into a list of examples (``LMExample`` for ``text``/``instruction``
  sources and ``multiple_choice`` scored by loss, ``ChoiceExample`` for ``multiple_choice``
  scored by accuracy).
- ``letter_token_ids(tokenizer, num_letters)``: the token id of " A", " B", ...
- ``pad_token_id(tokenizer)``: the pad id, or the EOS id when the tokenizer has no pad.
- ``FALLBACK_TEMPLATE``: how instruction rows are rendered without a chat template.
- ``source_chat_template(tokenizer, source)``: the chat template an instruction source is
  rendered with (its ``chat_template_path``, or for ``all-assistant`` TRL's training template).

Formats (``DataSource.format``):

- ``text``: ``tokenizer(text)`` (with the tokenizer's own special tokens, e.g. BOS) plus
  EOS; the loss is on every token.
- ``instruction``: a ``messages`` list, a prompt/response pair turned into
  ``[system?, user, assistant]``, or TRL's prompt/completion pair (``completion`` is read
  where the rows have no ``response`` column): two strings, read as the prompt/response
  pair, or two chat lists (conversational), the prompt's messages followed by the
  completion's, which starts and ends with the assistant's. The response is the last
  message (or the whole completion); everything before it is the prompt, and its tokens
  get label ``-100``. With a chat template the row is
  rendered with ``tokenizer.apply_chat_template`` twice, the prompt alone with
  ``add_generation_prompt=True`` and the whole conversation, and both are tokenized without
  extra special tokens (the template writes them). When the prompt's ids are a prefix of
  the whole conversation's ids, the boundary is their length (as TRL's ``completion_mask``).
  When they are not (a BPE merge
  across the boundary), but the prompt's *text* is a prefix of the conversation's text, the
  example is the prompt's ids followed by the ids of the rest of the text, so the boundary is
  exact by construction. Otherwise the template rewrites earlier turns and ``DataError`` is
  raised. Without a chat template, ``FALLBACK_TEMPLATE`` renders the prompt and the
  response's tokens are followed by EOS. With ``source.loss_on == "all-assistant"`` every
  assistant turn carries the loss (of the completion, for a prompt/completion pair), as TRL's
  ``SFTTrainer`` with ``assistant_only_loss=True`` masks it: the conversation is tokenized by
  ``apply_chat_template(..., return_assistant_tokens_mask=True)`` and a token carries the loss
  where the template's ``{% generation %}`` blocks mark it (for a pair, only after the
  tokens it shares with the prompt rendered with the generation prompt, TRL's
  ``completion_mask``). A template without such blocks is replaced by TRL's training template
  of its model family (``trl.chat_template_utils.get_training_chat_template``: Qwen3, Llama
  3, Gemma, ...); one TRL has none for is refused with ``DataError`` (its fix:
  ``chat_template_path`` to a copy with the blocks, or ``loss_on="last-assistant"``). Without
  TRL installed the template is used as it is, and a row it marks no token of is refused.

  The chat template is the tokenizer's, or the Jinja file ``source.chat_template_path``. It
  gets each message's keys as they are (``tool_calls``, ``reasoning_content``, the
  ``name`` of a ``tool`` message, ...; an assistant message with ``tool_calls`` and a null or
  no content gets ``""``), the row's tool schemas as ``tools=`` (``source.tools_column``: a
  list of JSON schemas or its JSON text, as TRL reads it), and ``source.chat_template_kwargs``
  (e.g. ``enable_thinking=False``). ``FALLBACK_TEMPLATE`` cannot render tools, tool calls,
  reasoning or template variables: a row with them, or ``chat_template_kwargs``, is refused
  without a chat template.
- ``multiple_choice`` scored by accuracy (``source.metric == "accuracy"``): the prompt
  ``"{question}\\nA. {choice}\\nB. {choice}\\n...Answer:"`` (with the tokenizer's special
  tokens); a prompt longer than ``sequence_length`` keeps its *last* tokens, so the scoring
  position still follows ``"Answer:"``.
- ``multiple_choice`` scored by loss (``source.metric == "loss"``): an ``LMExample`` whose
  prompt is ``"{question}\\nAnswer:"`` and whose response, the only tokens with a loss, is
  ``" {correct choice}"``: the loss of the correct answer, as the paper constrains its tiny
  benchmarks in scenarios 1-50. The choices are not listed (the loss is of the answer's text,
  not of a letter). It is truncated like an instruction example.
- an lm-eval task's rows (``source.lm_eval_task``; ``lm_eval_tasks`` builds them with the
  task's own prompts, ``lm_eval_tasks.render_chats`` renders them with the chat template
  when ``source.lm_eval_apply_chat_template``, and ``lm_eval_tasks.encode_pairs`` tokenizes
  each (context, continuation) pair as lm-eval's ``hf`` model does): scored by accuracy, a
  ``ChoiceExample`` holding each choice's context and continuation (lm-eval's ``acc``, or
  ``acc_norm`` by ``score_divisors``; each sequence keeps its last ``sequence_length``
  tokens); scored by loss, an ``LMExample`` of the context with the correct choice's
  continuation as the response, truncated on the left. Either way one warning counts the
  documents that do not fit in ``sequence_length``.

Answers (``answer_column``): a 0-based index, a letter (``"B"``), one of the choices' own
labels (ARC's ``"A"``/``"1"``), a decimal string (HellaSwag's ``"2"``), or a list of 0/1
flags with a single 1 (TruthfulQA's ``mc1_targets.labels``). With ``source.shuffle_choices``
each question's choices are put in an order seeded by the question and its choices
(``choice_order``), the same on every run, so that a benchmark whose correct choice is always
first (TruthfulQA's mc1) is not answered by always picking "A".

Chat lists may use ``{"role", "content"}`` or the ShareGPT keys ``{"from", "value"}`` (roles
``human``/``gpt`` become ``user``/``assistant``); with ``system_column`` set, a non-empty
system prompt of the row is put first.

Fixed length: with ``packing=False`` every example is cut to its first ``sequence_length``
tokens (with ``source.truncation_side == "left"``, to the prompt's leading special tokens,
e.g. BOS, followed by the window that ends with its last token, or starts at its response
when the response alone is longer: the middle of the prompt is cut, so a long document is
best put before its question or instruction), and an instruction example left with no response token (a prompt as long as the
sequence) is dropped (a warning says how many); when every example is dropped the source is
refused with ``DataError``. A multiple-choice prompt that is too long keeps its last tokens
(a warning says how many). With ``packing=True`` the documents (each ending in EOS or the
template's end-of-turn) are concatenated, labels alongside ids, and cut into blocks of
``sequence_length``; the last block may be shorter, and a block without any loss token (all
prompt) is dropped. Packed documents attend to each other, as in the usual causal-LM packing.
With ``packing="per-document"`` they do not: each example also carries ``position_ids``
that restart at every document, and the label of each document's first token is -100, so
a model given the positions without an attention mask (``collate_lm`` does so) computes
every document's losses as it would unpacked (a document cut at a block's end continues
from its position in the next block, seeing only that block's part).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import ascii_uppercase
from typing import Any, Literal

import datasets
import numpy as np
from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from dynamics.data import loading
from dynamics.data.loading import DataError, DataSource, check_columns

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
"""Label of a position without loss (the value Hugging Face models ignore)."""

Packing = bool | Literal["per-document"]
"""False: one example per document, truncated. True: documents concatenated and cut into
blocks, attending to each other. ``"per-document"``: blocks in which each document attends
only to itself."""
PACKING_MODES: tuple[Packing, ...] = (False, True, "per-document")

FALLBACK_TEMPLATE = "### {Role}:\n{content}\n\n"
"""Rendering of one message without a chat template; ``Role`` is ``System``, ``User`` or
``Assistant``. The prompt is the rendered earlier messages followed by ``"### Assistant:\\n"``;
the response is the last message's content followed by the EOS token."""
FALLBACK_GENERATION_PROMPT = "### Assistant:\n"

TOKENIZATION_VERSION = hashlib.sha256(
    Path(__file__).read_bytes() + Path(loading.__file__ or "").read_bytes()
).hexdigest()[:16]
"""A hash of the source of this module and of ``loading``: part of the cache key of
``tokenize_rows``. ``datasets`` fingerprints a module-level function by its name only, so
without it a change of the prompt format, masking or truncation code would read the tokens
cached by the old code."""


@dataclass(frozen=True, eq=False)
class LMExample:
    """A language-modelling example; ``labels[t] = -100`` where no loss is taken.

    Labels are *not* shifted: the model predicts ``labels[t + 1]`` from position ``t``.
    """

    input_ids: np.ndarray  # int32, shape (T,)
    labels: np.ndarray  # int32, shape (T,)
    position_ids: np.ndarray | None = None
    """Per-document positions of a ``packing="per-document"`` block (None otherwise)."""

    def __post_init__(self) -> None:
        if self.input_ids.shape != self.labels.shape or self.input_ids.ndim != 1:
            raise ValueError(
                f"input_ids {self.input_ids.shape} and labels {self.labels.shape} must be equal 1-d"
            )
        if self.position_ids is not None and self.position_ids.shape != self.input_ids.shape:
            raise ValueError(
                f"position_ids {self.position_ids.shape} must match input_ids {self.input_ids.shape}"
            )

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True, eq=False)
class ChoiceExample:
    """A multiple-choice question: the prediction is the argmax of the next-token logits
    after the last prompt token, restricted to ``choice_token_ids`` (one letter per choice).

    A question of an lm-eval task (``sequence_lengths`` set) is scored by continuation, as
    lm-eval's ``acc``: ``input_ids`` holds its K choices' token sequences (context and
    continuation) one after another, ``sequence_lengths`` their lengths and
    ``continuation_lengths`` how many tokens at the end of each are the continuation; the
    prediction is the choice whose continuation tokens have the largest summed
    log-likelihood (divided by ``score_divisors``, each choice's length in characters, for
    lm-eval's ``acc_norm``), and ``choice_token_ids`` is empty."""

    input_ids: np.ndarray  # int32, shape (T,)
    choice_token_ids: np.ndarray  # int32, shape (K,)
    answer_index: int
    sequence_lengths: np.ndarray | None = None  # int32, shape (K,)
    continuation_lengths: np.ndarray | None = None  # int32, shape (K,)
    score_divisors: np.ndarray | None = None  # float32, shape (K,); None divides by 1

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


Example = LMExample | ChoiceExample


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The tokenizer's pad id, or its EOS id when it has no pad token (padding is masked)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise DataError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token")
    return int(pad)


def _eos_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    if tokenizer.eos_token_id is None:
        raise DataError(
            "the tokenizer has no EOS token, needed to end documents; set tokenizer.eos_token"
        )
    return int(tokenizer.eos_token_id)


def letter_token_ids(tokenizer: PreTrainedTokenizerBase, num_letters: int) -> list[int]:
    """Token ids of the answer letters " A", " B", ... as the model writes them after "Answer:".

    Each letter is tokenized with its leading space and the *last* token is taken (a
    SentencePiece tokenizer may emit a separate space token first). That token must decode
    to exactly the letter (so the letters are distinct tokens); otherwise accuracy cannot be
    read from one next-token distribution and ``DataError`` is raised.
    """
    if not 1 <= num_letters <= len(ascii_uppercase):
        raise DataError(f"{num_letters} choices: between 1 and 26 are supported")
    ids = []
    for letter in ascii_uppercase[:num_letters]:
        encoded = tokenizer(" " + letter, add_special_tokens=False)["input_ids"]
        token = int(encoded[-1]) if encoded else -1
        decoded = str(tokenizer.decode([token])).strip() if encoded else ""
        if decoded != letter:
            raise DataError(
                f"answer letter {letter!r} is not a single token of this tokenizer (' {letter}' "
                f"ends in token {token} = {decoded!r}); letter-restricted accuracy needs one "
                "token per letter: use a loss metric for this domain or another tokenizer"
            )
        ids.append(token)
    return ids


# ---------------------------------------------------------------------------------------
# Rows -> conversations
# ---------------------------------------------------------------------------------------


def _string(value: Any, column: str, index: int, source: DataSource) -> str:
    if not isinstance(value, str):
        raise DataError(
            f"{source.description}, row {index}: column {column!r} must hold a string, got "
            f"{type(value).__name__}"
        )
    return value


def _messages(value: Any, column: str, index: int, source: DataSource) -> list[dict[str, Any]]:
    """A column's chat list as chat-template messages (ShareGPT keys and roles read too)."""
    if not isinstance(value, list) or not value:
        raise DataError(
            f"{source.description}, row {index}: {column!r} must be a non-empty list of "
            "{'role', 'content'} messages"
        )
    return [_message(message, column, index, source) for message in value]


def _message(message: Any, column: str, index: int, source: DataSource) -> dict[str, Any]:
    """One message as ``{"role", "content", ...}``: its other keys (``tool_calls``,
    ``reasoning_content``, a tool message's ``name``, ...) go to the chat template as they are,
    except those whose value is null (``datasets`` writes a null where only another row's
    message has the key; ``apply_chat_template`` leaves such keys out too). An assistant
    message that only calls tools may have a null or no content (OpenAI's shape): it is ``""``."""
    keys = _message_keys(message)
    if keys is None:
        raise DataError(
            f"{source.description}, row {index}: every message needs 'role' and "
            f"'content' keys (or ShareGPT's 'from' and 'value'), got {message!r}"
        )
    role = _string(message[keys[0]], keys[0], index, source)
    content = message.get(keys[1])
    if content is None and message.get("tool_calls"):
        content = ""
    others = {key: value for key, value in message.items() if key not in keys and value is not None}
    return {
        **others,
        "role": SHAREGPT_ROLES.get(role, role),
        "content": _string(content, column, index, source),
    }


def _with_system(
    conversation: list[dict[str, Any]], row: Mapping[str, Any], index: int, source: DataSource
) -> list[dict[str, Any]]:
    """``conversation`` after the row's non-empty system prompt, unless it starts with one."""
    if source.system_column is None or not row[source.system_column]:
        return conversation
    if conversation and conversation[0]["role"] == "system":
        return conversation
    system = _string(row[source.system_column], source.system_column, index, source)
    return [{"role": "system", "content": system}, *conversation]


def _tools(row: Mapping[str, Any], index: int, source: DataSource) -> list[Any] | None:
    """The row's tool schemas (``source.tools_column``: a list of JSON schemas or its JSON
    text, as TRL's SFTTrainer reads its ``tools`` column), or None where it has none."""
    value = row.get(source.tools_column)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise DataError(
                f"{source.description}, row {index}: {source.tools_column!r} is not valid JSON ({err}); give a "
                "list of tool schemas or its JSON text"
            ) from None
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(tool, Mapping) for tool in value):
        raise DataError(
            f"{source.description}, row {index}: {source.tools_column!r} must hold a list of tool schemas "
            f"(JSON objects) or its JSON text, got {type(value).__name__}"
        )
    return [dict(tool) for tool in value]


@dataclass(frozen=True)
class _Chat:
    """One instruction row as a conversation for the chat template."""

    messages: list[dict[str, Any]]
    """The messages, the last one the assistant's."""
    tools: list[Any] | None
    """The row's tool schemas (JSON objects), passed as ``apply_chat_template(tools=...)``;
    None without."""
    response_start: int
    """Index of the response's first message: the last message, or the first message of a
    conversational prompt/completion pair's completion."""
    assistant_start: int
    """Index from which ``loss_on="all-assistant"`` trains the assistant turns: 0, or the
    completion's first message."""


def _conversation(
    row: Mapping[str, Any], index: int, source: DataSource, use_messages: bool
) -> _Chat:
    """The row as a conversation whose last message is the assistant's."""
    tools = _tools(row, index, source)
    if use_messages:
        conversation = _with_system(
            _messages(row[source.messages_column], source.messages_column, index, source),
            row,
            index,
            source,
        )
        if conversation[-1]["role"] != "assistant":
            raise DataError(
                f"{source.description}, row {index}: the last message is the response and must "
                f"have role 'assistant', not {conversation[-1]['role']!r}"
            )
        return _Chat(conversation, tools, len(conversation) - 1, 0)
    response_column = source.response_key(row.keys())
    prompt, response = row[source.prompt_column], row[response_column]
    if isinstance(prompt, list) or isinstance(response, list):
        # TRL's conversational prompt/completion: two chat lists, the completion the assistant's.
        if not (isinstance(prompt, list) and isinstance(response, list)):
            raise DataError(
                f"{source.description}, row {index}: {source.prompt_column!r} and {response_column!r} must both "
                "be strings or both be lists of {'role', 'content'} messages (conversational prompt/completion)"
            )
        prompt_messages = _with_system(
            _messages(prompt, source.prompt_column, index, source), row, index, source
        )
        completion = _messages(response, response_column, index, source)
        if completion[0]["role"] != "assistant":
            raise DataError(
                f"{source.description}, row {index}: {response_column!r} is the response and must start with a "
                f"message of role 'assistant', not {completion[0]['role']!r}"
            )
        if completion[-1]["role"] != "assistant":
            raise DataError(
                f"{source.description}, row {index}: {response_column!r} must end with a message of role "
                f"'assistant', not {completion[-1]['role']!r}"
            )
        return _Chat(
            [*prompt_messages, *completion], tools, len(prompt_messages), len(prompt_messages)
        )
    conversation = _with_system(
        [
            {"role": "user", "content": _string(prompt, source.prompt_column, index, source)},
            {"role": "assistant", "content": _string(response, response_column, index, source)},
        ],
        row,
        index,
        source,
    )
    return _Chat(conversation, tools, len(conversation) - 1, 0)


SHAREGPT_ROLES = {"human": "user", "gpt": "assistant"}
"""ShareGPT speaker names (``from``) -> chat roles; ``system`` stays ``system``."""


def _message_keys(message: Any) -> tuple[str, str] | None:
    """The (role, content) keys of one chat message, or None when it has neither pair (a
    message with ``tool_calls`` needs no content)."""
    if not isinstance(message, Mapping):
        return None
    for keys in (("role", "content"), ("from", "value")):
        if keys[0] in message and (keys[1] in message or message.get("tool_calls")):
            return keys
    return None


def _encode(tokenizer: PreTrainedTokenizerBase, texts: list[str], special: bool) -> list[list[int]]:
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=special)["input_ids"]]


# ---------------------------------------------------------------------------------------
# Conversations -> token examples
# ---------------------------------------------------------------------------------------


def source_chat_template(tokenizer: PreTrainedTokenizerBase, source: DataSource) -> str | None:
    """The Jinja template an instruction source's rows are rendered with, or None for the
    tokenizer's own (``FALLBACK_TEMPLATE`` where it has none): the file at
    ``source.chat_template_path`` when set; with ``loss_on="all-assistant"``, a template with
    ``{% generation %}`` blocks (``_assistant_template``)."""
    template = loading.read_chat_template(source) if source.chat_template_path is not None else None
    if source.loss_on != "all-assistant" or (template is None and tokenizer.chat_template is None):
        return template
    return _assistant_template(tokenizer, template, source)


def _assistant_template(
    tokenizer: PreTrainedTokenizerBase, template: str | None, source: DataSource
) -> str | None:
    """The template whose ``{% generation %}`` blocks mark the assistant's tokens, chosen as
    TRL's ``SFTTrainer`` chooses it with ``assistant_only_loss=True``: ``template`` (None: the
    tokenizer's own) when it has such blocks, else TRL's training template of its model
    family (``get_training_chat_template``: Qwen3, Llama 3, Gemma, ...). As TRL, a warning
    says when the blocks leave out the assistant's end-of-turn token. Without TRL installed
    the template is kept; a row it marks no token of is refused (``_assistant_document``)."""
    try:
        from trl.chat_template_utils import (
            has_generation_markers,
            is_chat_template_stop_token_trained,
        )
    except ImportError:
        return template
    rendering = copy.copy(tokenizer)  # TRL reads the template from the tokenizer
    if template is not None:
        rendering.chat_template = template
    chosen = (
        template
        if has_generation_markers(rendering.chat_template)
        else _training_template(rendering, source)
    )
    if not is_chat_template_stop_token_trained(rendering, chat_template=chosen):
        logger.warning(
            "%s: the chat template's {%% generation %%} blocks leave out the assistant's end-of-turn token, so "
            "the model is not trained to stop; put the end-of-turn token inside {%% generation %%}...{%% "
            "endgeneration %%} (chat_template_path)",
            source.description,
        )
    return chosen


def _training_template(tokenizer: PreTrainedTokenizerBase, source: DataSource) -> str | None:
    """TRL's training template (with ``{% generation %}`` blocks) of the tokenizer's template."""
    from trl.chat_template_utils import get_training_chat_template

    try:
        return get_training_chat_template(tokenizer)
    except ValueError:
        raise DataError(
            f"{source.description}: loss_on='all-assistant' trains the tokens that the chat template's "
            "{% generation %} blocks mark, and this template has none and is not one TRL has a training template "
            "for; set chat_template_path to a copy of it with {% generation %}...{% endgeneration %} around each "
            "assistant turn (TRL's trl/chat_templates/*_training.jinja show how), or use loss_on='last-assistant'"
        ) from None


def _render(
    tokenizer: PreTrainedTokenizerBase,
    chat: _Chat,
    messages: list[dict[str, Any]],
    template: str | None,
    source: DataSource,
    index: int,
    **options: Any,
) -> Any:
    """``apply_chat_template`` of ``messages`` (``chat``'s, or the first of them) with the
    row's tools and the source's ``chat_template_kwargs``; a template's error names the row."""
    try:
        return tokenizer.apply_chat_template(
            messages,
            tools=chat.tools,
            chat_template=template,
            **source.chat_template_kwargs,
            **options,
        )
    except (TemplateError, TypeError) as err:
        raise DataError(
            f"{source.description}, row {index}: the chat template cannot render this row: {loading.one_line(err)}"
        ) from None


def _apply_template(
    tokenizer: PreTrainedTokenizerBase,
    chat: _Chat,
    messages: list[dict[str, Any]],
    template: str | None,
    source: DataSource,
    index: int,
    generation_prompt: bool,
) -> str:
    text = _render(
        tokenizer,
        chat,
        messages,
        template,
        source,
        index,
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )
    if not isinstance(text, str):
        raise DataError(f"apply_chat_template returned {type(text).__name__}, expected a string")
    return text


def _fallback_document(
    tokenizer: PreTrainedTokenizerBase, chat: _Chat, index: int, source: DataSource
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
        encoded = _encode(tokenizer, [text], special=number == 0)[0]
        ids += encoded
        labels += encoded if loss else [IGNORE_INDEX] * len(encoded)
    eos = _eos_token_id(tokenizer)
    array = np.asarray([*ids, eos], dtype=np.int32)
    return LMExample(input_ids=array, labels=np.asarray([*labels, eos], dtype=np.int32))


def _check_fallback(chat: _Chat, index: int, source: DataSource) -> None:
    """Refuse what ``FALLBACK_TEMPLATE`` would drop: tools, tool calls, reasoning."""
    unrendered = ["tools"] if chat.tools is not None else []
    unrendered += sorted(
        {key for m in chat.messages for key in ("tool_calls", "reasoning_content") if key in m}
    )
    if unrendered:
        raise DataError(
            f"{source.description}, row {index}: its {', '.join(unrendered)} need a chat template, and the "
            "tokenizer has none; set chat_template_path to the model's Jinja chat template"
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


def _response_documents(
    tokenizer: PreTrainedTokenizerBase,
    chats: list[_Chat],
    template: str | None,
    source: DataSource,
    start: int,
) -> list[LMExample]:
    """``loss_on="last-assistant"``: the loss on the tokens after the prompt's rendering with
    the generation prompt (see the module docstring)."""
    fulls = [
        _apply_template(tokenizer, c, c.messages, template, source, start + i, False)
        for i, c in enumerate(chats)
    ]
    prompts = [
        _apply_template(
            tokenizer, c, c.messages[: c.response_start], template, source, start + i, True
        )
        for i, c in enumerate(chats)
    ]
    prompt_ids = _encode(tokenizer, prompts, special=False)
    full_ids = _encode(tokenizer, fulls, special=False)
    documents = []
    for index, (prompt, full, p_ids, f_ids) in enumerate(
        zip(prompts, fulls, prompt_ids, full_ids, strict=True)
    ):
        if f_ids[: len(p_ids)] == p_ids:
            documents.append(_masked(p_ids, f_ids[len(p_ids) :]))
        elif full.startswith(prompt):
            # The tokenizer merged tokens across the boundary: tokenize the two texts apart.
            rest = _encode(tokenizer, [full[len(prompt) :]], special=False)[0]
            documents.append(_masked(p_ids, rest))
        else:
            raise _not_a_prefix(source, start + index)
    return documents


def _assistant_document(
    tokenizer: PreTrainedTokenizerBase,
    chat: _Chat,
    template: str | None,
    source: DataSource,
    index: int,
) -> LMExample:
    """``loss_on="all-assistant"``: the conversation tokenized by ``apply_chat_template`` with
    ``return_assistant_tokens_mask=True``, a token carrying the loss where the template's
    ``{% generation %}`` blocks mark it, as TRL's ``assistant_only_loss``; for a
    prompt/completion pair only from where the prompt's tokens (rendered with the generation
    prompt) and the conversation's diverge, as TRL's ``completion_only_loss``."""
    encoded = _render(
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
        prompt = _render(
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
        trained[: _common_prefix_length(prompt, ids.tolist())] = False
    if not trained.any():
        raise DataError(
            f"{source.description}, row {index}: the chat template marks none of its tokens as the assistant's "
            "({% generation %} blocks), which loss_on='all-assistant' trains; set chat_template_path to a template "
            "with {% generation %}...{% endgeneration %} around each assistant turn, install TRL "
            "(pip install 'dynamics[trl]') for its training template of this model family, or use "
            "loss_on='last-assistant'"
        )
    return LMExample(input_ids=ids, labels=np.where(trained, ids, IGNORE_INDEX).astype(np.int32))


def _common_prefix_length(ids: list[int], other_ids: list[int]) -> int:
    """How many leading tokens the two share (TRL's ``common_prefix_length``)."""
    differences = (i for i, (a, b) in enumerate(zip(ids, other_ids, strict=False)) if a != b)
    return next(differences, min(len(ids), len(other_ids)))


def _instruction_documents(
    rows: list[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    source: DataSource,
    start: int,
    template: str | None,
) -> list[LMExample]:
    """Each row as a conversation rendered with ``template`` (``source_chat_template``)."""
    use_messages = bool(rows) and source.messages_column in rows[0]
    chats = [_conversation(row, start + i, source, use_messages) for i, row in enumerate(rows)]
    if template is None and tokenizer.chat_template is None:
        if source.chat_template_kwargs:
            raise DataError(
                f"{source.description}: chat_template_kwargs are passed to a chat template, and the tokenizer has "
                "none; set chat_template_path to the model's Jinja chat template, or remove chat_template_kwargs"
            )
        return [
            _fallback_document(tokenizer, chat, start + i, source) for i, chat in enumerate(chats)
        ]
    if source.loss_on == "last-assistant":
        return _response_documents(tokenizer, chats, template, source, start)
    if not tokenizer.is_fast:
        raise DataError(
            f"{source.description}: loss_on='all-assistant' locates the assistant's tokens by their character "
            "offsets, which only a fast tokenizer gives; load a fast tokenizer (use_fast=True) or use "
            "loss_on='last-assistant'"
        )
    return [
        _assistant_document(tokenizer, chat, template, source, start + i)
        for i, chat in enumerate(chats)
    ]


def _masked(prompt_ids: Sequence[int], response_ids: Sequence[int]) -> LMExample:
    ids = np.asarray([*prompt_ids, *response_ids], dtype=np.int32)
    labels = ids.copy()
    labels[: len(prompt_ids)] = IGNORE_INDEX
    return LMExample(input_ids=ids, labels=labels)


def _text_documents(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource, start: int
) -> list[LMExample]:
    texts = [
        _string(row[source.text_column], source.text_column, start + i, source)
        for i, row in enumerate(rows)
    ]
    nonempty = [t for t in texts if t.strip()]
    if len(nonempty) < len(texts):
        logger.warning(
            "%s: skipped %d empty documents", source.description, len(texts) - len(nonempty)
        )
    eos = _eos_token_id(tokenizer)
    documents = []
    for ids in _encode(tokenizer, nonempty, special=True):
        if not ids or ids[-1] != eos:
            ids.append(eos)
        array = np.asarray(ids, dtype=np.int32)
        documents.append(LMExample(input_ids=array, labels=array.copy()))
    return documents


# ---------------------------------------------------------------------------------------
# Documents -> fixed-length examples
# ---------------------------------------------------------------------------------------


def _truncate(
    documents: list[LMExample],
    sequence_length: int,
    source: DataSource,
    special_ids: frozenset[int] = frozenset(),
) -> list[LMExample]:
    examples = []
    for doc in documents:
        # Left truncation keeps the prompt's leading special tokens (BOS, a template's
        # start-of-turn) and cuts what follows them; a response longer than the rest of the
        # sequence keeps its first tokens.
        head, start = 0, 0
        if source.truncation_side == "left" and len(doc) > sequence_length:
            response_start = int(np.argmax(doc.labels != IGNORE_INDEX))
            while (
                head < min(response_start, sequence_length - 1)
                and int(doc.input_ids[head]) in special_ids
            ):
                head += 1
            start = max(head, min(response_start, len(doc) - (sequence_length - head)))
        window = np.r_[0:head, start : min(len(doc), start + sequence_length - head)]
        labels = doc.labels[window]
        if not (labels != IGNORE_INDEX).any():
            continue
        # Copies (fancy indexing), so that the long documents' arrays are freed.
        examples.append(LMExample(input_ids=doc.input_ids[window], labels=labels))
    dropped = len(documents) - len(examples)
    if dropped and examples:  # with none left, build_examples refuses the source instead
        logger.warning(
            "%s: dropped %d of %d examples whose response starts after %d tokens",
            source.description,
            dropped,
            len(documents),
            sequence_length,
        )
    return examples


def _pack(documents: list[LMExample], sequence_length: int, per_document: bool) -> list[LMExample]:
    if not documents:
        return []
    ids = np.concatenate([d.input_ids for d in documents])
    labels = np.concatenate([d.labels for d in documents])
    positions = None
    if per_document:
        # Unpacked, a document's first token is never predicted; packed, it would be
        # predicted from the previous document's last token.
        starts = np.cumsum([0, *(len(d) for d in documents[:-1])])
        labels[starts] = IGNORE_INDEX
        positions = np.concatenate([np.arange(len(d), dtype=np.int32) for d in documents])
    return [
        LMExample(
            input_ids=ids[start : start + sequence_length],
            labels=labels[start : start + sequence_length],
            position_ids=None if positions is None else positions[start : start + sequence_length],
        )
        for start in range(0, len(ids), sequence_length)
        if (labels[start : start + sequence_length] != IGNORE_INDEX).any()
    ]


def _choice_loss_documents(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource, start: int
) -> list[LMExample]:
    """Each question as prompt ``"{question}\\nAnswer:"`` and response ``" {correct choice}"``."""
    prompts: list[str] = []
    answers: list[str] = []
    for index, row in enumerate(rows, start):
        question, choices, correct = _question(row, index, source)
        prompts.append(f"{question}\nAnswer:")
        answers.append(" " + choices[correct])
    prompt_ids = _encode(tokenizer, prompts, special=True)
    answer_ids = _encode(tokenizer, answers, special=False)
    return [_masked(p, a) for p, a in zip(prompt_ids, answer_ids, strict=True)]


def _choice_questions(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource, start: int
) -> dict[str, list[Any]]:
    """The whole prompt's ids, the letters' token ids and the answer of each question."""
    prompts: list[str] = []
    choice_counts: list[int] = []
    answers: list[int] = []
    for index, row in enumerate(rows, start):
        question, choices, correct = _question(row, index, source)
        answers.append(correct)
        lines = [
            question,
            *(f"{ascii_uppercase[k]}. {c}" for k, c in enumerate(choices)),
            "Answer:",
        ]
        prompts.append("\n".join(lines))
        choice_counts.append(len(choices))
    letters = letter_token_ids(tokenizer, max(choice_counts)) if choice_counts else []
    return {
        "input_ids": _encode(tokenizer, prompts, special=True),
        "choice_token_ids": [letters[:count] for count in choice_counts],
        "answer_index": answers,
    }


def _choice_examples(
    encoded: datasets.Dataset, source: DataSource, sequence_length: int
) -> list[ChoiceExample]:
    """Tokenized questions as examples; a prompt longer than ``sequence_length`` keeps its end."""
    prompts = encoded["input_ids"]
    cut = sum(len(ids) > sequence_length for ids in prompts)
    if cut:
        logger.warning(
            "%s: kept the last %d tokens of %d questions longer than that",
            source.description,
            sequence_length,
            cut,
        )
    return [
        ChoiceExample(
            input_ids=np.asarray(ids[-sequence_length:], dtype=np.int32),
            choice_token_ids=np.asarray(letters, dtype=np.int32),
            answer_index=int(answer),
        )
        for ids, letters, answer in zip(
            prompts, encoded["choice_token_ids"], encoded["answer_index"], strict=True
        )
    ]


def _continuation_pairs(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource
) -> list[list[tuple[list[int], list[int]]]]:
    """Each lm-eval row's (context ids, continuation ids) per choice, encoded as lm-eval encodes them."""
    from dynamics.data.lm_eval_tasks import encode_pairs, render_chats

    contexts = [c for row in rows for c in row["contexts"]]
    if source.lm_eval_apply_chat_template:
        contexts = render_chats(tokenizer, contexts)
    continuations = [c for row in rows for c in row["continuations"]]
    encoded = encode_pairs(tokenizer, contexts, continuations)
    pairs, start = [], 0
    for row in rows:
        pairs.append(encoded[start : start + len(row["contexts"])])
        start += len(row["contexts"])
    return pairs


def _continuation_questions(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource
) -> dict[str, list[Any]]:
    """Each lm-eval row's K token sequences, their continuations' lengths and its answer."""
    pairs = _continuation_pairs(rows, tokenizer, source)
    return {
        "sequences": [[context + continuation for context, continuation in row] for row in pairs],
        "continuation_lengths": [[len(continuation) for _, continuation in row] for row in pairs],
        "answer_index": [int(row["answer"]) for row in rows],
        "score_divisors": [_score_divisors(row, source) for row in rows],
    }


def _score_divisors(row: Mapping[str, Any], source: DataSource) -> list[float]:
    """What each choice's summed log-likelihood is divided by: its length in characters
    for lm-eval's ``acc_norm`` (``process_results``), 1 for ``acc``."""
    if source.lm_eval_metric == "acc_norm":
        return [float(length) for length in row["choice_lengths"]]
    return [1.0] * len(row["contexts"])


def _continuation_documents(
    rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, source: DataSource
) -> list[LMExample]:
    """Each lm-eval row's correct choice: its context, then its continuation carrying the loss."""
    pairs = _continuation_pairs(rows, tokenizer, source)
    return [
        _masked(*row_pairs[int(row["answer"])]) for row, row_pairs in zip(rows, pairs, strict=True)
    ]


def _continuation_examples(
    encoded: datasets.Dataset, source: DataSource, sequence_length: int
) -> list[ChoiceExample]:
    """Tokenized lm-eval questions as examples; a sequence longer than ``sequence_length``
    keeps its last tokens (lm-eval cuts its model's max_length the same way), with a warning."""
    _warn_cut_documents(
        source, [max(map(len, sequences)) for sequences in encoded["sequences"]], sequence_length
    )
    examples = []
    for index, (sequences, lengths, answer, divisors) in enumerate(
        zip(
            encoded["sequences"],
            encoded["continuation_lengths"],
            encoded["answer_index"],
            encoded["score_divisors"],
            strict=True,
        )
    ):
        if max(lengths) >= sequence_length:
            raise DataError(
                f"{source.description}, question {index}: a continuation of {max(lengths)} tokens does not fit "
                f"after a context within sequence_length={sequence_length}; raise sequence_length "
                "(training.sequence_length in a run config)"
            )
        kept = [np.asarray(ids[-sequence_length:], dtype=np.int32) for ids in sequences]
        examples.append(
            ChoiceExample(
                input_ids=np.concatenate(kept),
                choice_token_ids=np.zeros(0, dtype=np.int32),
                answer_index=int(answer),
                sequence_lengths=np.asarray([len(ids) for ids in kept], dtype=np.int32),
                continuation_lengths=np.asarray(lengths, dtype=np.int32),
                score_divisors=np.asarray(divisors, dtype=np.float32),
            )
        )
    return examples


def _warn_cut_documents(source: DataSource, longest: Sequence[int], sequence_length: int) -> None:
    """One warning with the count of lm-eval documents whose context and continuation do not
    fit in ``sequence_length``: their contexts lose their first tokens, so their scores are no
    longer lm-eval's (unless lm-eval's model cuts at the same length)."""
    cut = sum(length > sequence_length for length in longest)
    if cut:
        logger.warning(
            "%s: %d of %d documents have a context and continuation longer than sequence_length=%d; their "
            "contexts keep their last tokens, so their scores differ from lm-eval's (raise "
            "training.sequence_length)",
            source.description,
            cut,
            len(longest),
            sequence_length,
        )


def _question(row: Mapping[str, Any], index: int, source: DataSource) -> tuple[str, list[str], int]:
    """A row's question, its choices (shuffled when ``source.shuffle_choices``) and the index
    of the correct one among them."""
    question = _string(row[source.question_column], source.question_column, index, source)
    choices, labels = _choices(row[source.choices_column], index, source)
    correct = _answer_index(row[source.answer_column], labels, len(choices), index, source)
    if source.shuffle_choices:
        order = choice_order(question, choices)
        choices, correct = [choices[k] for k in order], order.index(correct)
    return question, choices, correct


def choice_order(question: str, choices: list[str]) -> list[int]:
    """A permutation of ``choices``, seeded by the question and its choices (a SHA-256 of
    them), so one question is shuffled the same way on every run and every machine."""
    digest = hashlib.sha256(json.dumps([question, choices], ensure_ascii=False).encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    return [int(k) for k in rng.permutation(len(choices))]


def _choices(value: Any, index: int, source: DataSource) -> tuple[list[str], list[str]]:
    """Choice texts and their dataset labels (ARC-style dicts carry labels, lists do not)."""
    column = source.choices_column
    if isinstance(value, Mapping) and "text" in value:
        texts, labels = list(value["text"]), [str(v) for v in value.get("label") or []]
    elif isinstance(value, list):
        texts, labels = value, []
    else:
        raise DataError(
            f"{source.description}, row {index}: {column!r} must be a list of choices or a "
            f"{{'text': [...], 'label': [...]}} dict, got {type(value).__name__}"
        )
    if not 2 <= len(texts) <= len(ascii_uppercase):
        raise DataError(f"{source.description}, row {index}: {len(texts)} choices; need 2 to 26")
    return [_string(t, column, index, source) for t in texts], labels


def _answer_index(
    value: Any, labels: list[str], num_choices: int, index: int, source: DataSource
) -> int:
    """The 0-based correct choice: a dataset label (ARC's "A" or "1"), a letter, or an index."""
    if isinstance(value, str) and value in labels:
        return labels.index(value)
    if isinstance(value, str) and len(value) == 1 and value.upper() in ascii_uppercase:
        answer = ascii_uppercase.index(value.upper())
    elif isinstance(value, str) and value.strip().isdecimal():
        answer = int(value)
    elif isinstance(value, int | np.integer) and not isinstance(value, bool):
        answer = int(value)
    elif isinstance(value, list) and sorted(value) == [0] * (len(value) - 1) + [1]:
        if len(value) != num_choices:
            raise DataError(
                f"{source.description}, row {index}: {len(value)} answer flags in "
                f"{source.answer_column!r} for {num_choices} choices; give one flag per choice"
            )
        answer = value.index(1)
    else:
        raise DataError(
            f"{source.description}, row {index}: answer {value!r} in {source.answer_column!r} "
            "is neither a 0-based index, a letter, one of the choice labels, nor a list of 0/1 "
            "flags with a single 1"
        )
    if not 0 <= answer < num_choices:
        raise DataError(
            f"{source.description}, row {index}: answer {value!r} in {source.answer_column!r} "
            f"is outside the {num_choices} choices"
        )
    return answer


_LM_FEATURES = datasets.Features(
    {
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "labels": datasets.Sequence(datasets.Value("int32")),
    }
)
_CHOICE_FEATURES = datasets.Features(
    {
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "choice_token_ids": datasets.Sequence(datasets.Value("int32")),
        "answer_index": datasets.Value("int32"),
    }
)
_CONTINUATION_FEATURES = datasets.Features(
    {
        "sequences": datasets.Sequence(datasets.Sequence(datasets.Value("int32"))),
        "continuation_lengths": datasets.Sequence(datasets.Value("int32")),
        "answer_index": datasets.Value("int32"),
        "score_divisors": datasets.Sequence(datasets.Value("float32")),
    }
)


def _encode_batch(
    batch: dict[str, list[Any]],
    indices: list[int],
    tokenizer: PreTrainedTokenizerBase,
    source: DataSource,
    version: str,
    chat_template: str | None = None,
) -> dict[str, list[Any]]:
    """``Dataset.map`` function: one batch of rows to token ids (see ``tokenize_rows``;
    ``version``, ``TOKENIZATION_VERSION``, only keys the cache; ``chat_template`` is
    ``source_chat_template``'s, read once per source)."""
    rows = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
    start = indices[0] if indices else 0
    if source.lm_eval_task is not None and source.metric == "accuracy":
        return _continuation_questions(rows, tokenizer, source)
    if source.format == "multiple_choice" and source.metric == "accuracy":
        return _choice_questions(rows, tokenizer, source, start)
    if source.lm_eval_task is not None:
        documents = _continuation_documents(rows, tokenizer, source)
    elif source.format == "multiple_choice":
        documents = _choice_loss_documents(rows, tokenizer, source, start)
    elif source.format == "text":
        documents = _text_documents(rows, tokenizer, source, start)
    else:
        documents = _instruction_documents(rows, tokenizer, source, start, chat_template)
    return {"input_ids": [d.input_ids for d in documents], "labels": [d.labels for d in documents]}


def tokenize_rows(
    rows: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, source: DataSource
) -> datasets.Dataset:
    """Every row's token ids, through ``Dataset.map`` (batched): ``input_ids`` and ``labels``
    (whole documents, before truncation or packing), or for a question scored by accuracy
    ``input_ids`` (the whole prompt), ``choice_token_ids`` and ``answer_index``.

    Rows read from files are mapped into ``datasets``' cache next to their Arrow files, keyed
    by the rows, the tokenizer, the source's settings, the text of its chat template
    (``source_chat_template``) and ``TOKENIZATION_VERSION`` (the code of this module and of
    ``loading``): a second run on the same machine, or
    a second process once the first has finished (``Accelerator.local_main_process_first``),
    reads the tokens instead of tokenizing again. Rows in memory are tokenized in memory.
    """
    choice = source.format == "multiple_choice" and source.metric == "accuracy"
    features = _CHOICE_FEATURES if choice else _LM_FEATURES
    if choice and source.lm_eval_task is not None:
        features = _CONTINUATION_FEATURES
    return rows.map(
        _encode_batch,
        batched=True,
        with_indices=True,
        # The in-memory rows of a source are not part of what is tokenized (the rows are), but
        # its description ("rows in memory") stays in the error messages.
        fn_kwargs={
            "tokenizer": tokenizer,
            "source": dataclasses.replace(
                source,
                rows=None,
                origin="rows in memory" if source.rows is not None else source.origin,
            ),
            "version": TOKENIZATION_VERSION,
            # The template's text, not its path, so that an edited file is tokenized again.
            "chat_template": source_chat_template(tokenizer, source)
            if source.format == "instruction"
            else None,
        },
        remove_columns=rows.column_names,
        features=features,
        desc=f"tokenizing {source.name or 'rows'}",
    )


def build_examples(
    rows: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    source: DataSource,
    *,
    sequence_length: int,
    packing: Packing = False,
) -> list[LMExample] | list[ChoiceExample]:
    """Tokenize every row of ``rows`` once (see the module docstring for the formats).

    ``sequence_length`` is the most tokens of one example. ``packing`` (False, True or
    ``"per-document"``) applies to ``text`` and ``instruction`` sources; a
    ``multiple_choice`` source is always one example per question, so one packing setting
    can serve every source of a run.
    """
    if packing not in PACKING_MODES:
        raise DataError(f"packing={packing!r}: use false, true or 'per-document'")
    if sequence_length < 1:
        raise DataError(f"sequence_length={sequence_length}: must be >= 1")
    check_columns(rows, source)
    encoded = tokenize_rows(rows, tokenizer, source)
    if source.lm_eval_task is not None and source.metric == "accuracy":
        return _continuation_examples(encoded, source, sequence_length)
    if source.format == "multiple_choice" and source.metric == "accuracy":
        return _choice_examples(encoded, source, sequence_length)
    documents = [
        LMExample(
            input_ids=np.asarray(ids, dtype=np.int32), labels=np.asarray(labels, dtype=np.int32)
        )
        for ids, labels in zip(encoded["input_ids"], encoded["labels"], strict=True)
    ]
    # A question scored by loss stays one example, as one scored by accuracy does.
    pack = packing and source.format != "multiple_choice"
    if source.lm_eval_task is not None:
        _warn_cut_documents(source, [len(document) for document in documents], sequence_length)
        source = dataclasses.replace(
            source, truncation_side="left"
        )  # a long context keeps its continuation
    examples = (
        _pack(documents, sequence_length, per_document=packing == "per-document")
        if pack
        else _truncate(documents, sequence_length, source, frozenset(tokenizer.all_special_ids))
    )
    if documents and not examples:
        raise DataError(
            f"{source.description}: no example keeps a response token within "
            f"sequence_length={sequence_length}: every prompt fills the sequence; raise "
            "sequence_length (training.sequence_length in a run config)"
        )
    return examples
