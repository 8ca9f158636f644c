"""The chat template an instruction source is rendered with, and its rendering of one
conversation.

The template is the tokenizer's, or the Jinja file ``source.chat_template_path``; with
``loss_on="all-assistant"`` one with ``{% generation %}`` blocks (TRL's training template of
the model family where the chosen one has none). ``FALLBACK_TEMPLATE`` renders rows of a
tokenizer without a chat template."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2 import TemplateError

from dynamics.data.errors import DataError, one_line

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dynamics.data.conversations import Chat
    from dynamics.data.source import DataSource

logger = logging.getLogger(__name__)

FALLBACK_TEMPLATE = "### {Role}:\n{content}\n\n"
"""Rendering of one message without a chat template; ``Role`` is ``System``, ``User`` or
``Assistant``. The prompt is the rendered earlier messages followed by ``"### Assistant:\\n"``;
the response is the last message's content followed by the EOS token."""
FALLBACK_GENERATION_PROMPT = "### Assistant:\n"


def read_chat_template(source: DataSource) -> str:
    """The text of ``source.chat_template_path``; ``DataError`` when it is not a readable,
    non-empty text file."""
    path = Path(source.chat_template_path or "")
    where = f"{source.description}: chat_template_path {str(path)!r}"
    if not path.is_file():
        raise DataError(
            f"{where} is not a file; give the path of a Jinja chat template (relative paths are "
            f"read from the working directory {Path.cwd()})"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{where} cannot be read as UTF-8 text: {one_line(err)}") from None
    if not text.strip():
        raise DataError(f"{where} is empty; give a Jinja chat template")
    return text


def source_chat_template(tokenizer: PreTrainedTokenizerBase, source: DataSource) -> str | None:
    """The Jinja template an instruction source's rows are rendered with, or None for the
    tokenizer's own (``FALLBACK_TEMPLATE`` where it has none): the file at
    ``source.chat_template_path`` when set; with ``loss_on="all-assistant"``, a template with
    ``{% generation %}`` blocks (``_assistant_template``)."""
    template = read_chat_template(source) if source.chat_template_path is not None else None
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
    the template is kept; a row it marks no token of is refused (``formats.instruction``)."""
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
            "%s: the chat template's {%% generation %%} blocks leave out the assistant's "
            "end-of-turn token, so the model is not trained to stop; put the end-of-turn token "
            "inside {%% generation %%}...{%% endgeneration %%} (chat_template_path)",
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
            f"{source.description}: loss_on='all-assistant' trains the tokens that the chat "
            "template's {% generation %} blocks mark, and this template has none and is not one "
            "TRL has a training template for; set chat_template_path to a copy of it with {% "
            "generation %}...{% endgeneration %} around each assistant turn (TRL's "
            "trl/chat_templates/*_training.jinja show how), or use loss_on='last-assistant'"
        ) from None


def render(
    tokenizer: PreTrainedTokenizerBase,
    chat: Chat,
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
            f"{source.description}, row {index}: the chat template cannot "
            f"render this row: {one_line(err)}"
        ) from None


def render_text(
    tokenizer: PreTrainedTokenizerBase,
    chat: Chat,
    messages: list[dict[str, Any]],
    template: str | None,
    source: DataSource,
    index: int,
    generation_prompt: bool,
) -> str:
    text = render(
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
