"""Instruction rows as conversations for a chat template: a ``messages`` list (ShareGPT's
keys and roles read too), a prompt/response pair, or TRL's prompt/completion pair (two
strings, or two message lists), with the row's system prompt and tool schemas."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynamics.data.errors import DataError
from dynamics.data.rows import row_string

if TYPE_CHECKING:
    from dynamics.data.source import DataSource

SHAREGPT_ROLES = {"human": "user", "gpt": "assistant"}
"""ShareGPT speaker names (``from``) -> chat roles; ``system`` stays ``system``."""


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
    role = row_string(message[keys[0]], keys[0], index, source)
    content = message.get(keys[1])
    if content is None and message.get("tool_calls"):
        content = ""
    others = {key: value for key, value in message.items() if key not in keys and value is not None}
    return {
        **others,
        "role": SHAREGPT_ROLES.get(role, role),
        "content": row_string(content, column, index, source),
    }


def _with_system(
    conversation: list[dict[str, Any]], row: Mapping[str, Any], index: int, source: DataSource
) -> list[dict[str, Any]]:
    """``conversation`` after the row's non-empty system prompt, unless it starts with one."""
    if source.system_column is None or not row[source.system_column]:
        return conversation
    if conversation and conversation[0]["role"] == "system":
        return conversation
    system = row_string(row[source.system_column], source.system_column, index, source)
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
                f"{source.description}, row {index}: {source.tools_column!r} is not valid JSON "
                f"({err}); give a list of tool schemas or its JSON text"
            ) from None
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(tool, Mapping) for tool in value):
        raise DataError(
            f"{source.description}, row {index}: {source.tools_column!r} must hold a list of tool "
            f"schemas (JSON objects) or its JSON text, got {type(value).__name__}"
        )
    return [dict(tool) for tool in value]


@dataclass(frozen=True)
class Chat:
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


def as_chat(row: Mapping[str, Any], index: int, source: DataSource, use_messages: bool) -> Chat:
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
        return Chat(conversation, tools, len(conversation) - 1, 0)
    response_column = source.response_key(row.keys())
    prompt, response = row[source.prompt_column], row[response_column]
    if isinstance(prompt, list) or isinstance(response, list):
        # TRL's conversational prompt/completion: two chat lists, the completion the assistant's.
        if not (isinstance(prompt, list) and isinstance(response, list)):
            raise DataError(
                f"{source.description}, row {index}: {source.prompt_column!r} and "
                f"{response_column!r} must both be strings or both be lists of {{'role', "
                "'content'} messages (conversational prompt/completion)"
            )
        prompt_messages = _with_system(
            _messages(prompt, source.prompt_column, index, source), row, index, source
        )
        completion = _messages(response, response_column, index, source)
        if completion[0]["role"] != "assistant":
            raise DataError(
                f"{source.description}, row {index}: {response_column!r} is the response and must "
                f"start with a message of role 'assistant', not {completion[0]['role']!r}"
            )
        if completion[-1]["role"] != "assistant":
            raise DataError(
                f"{source.description}, row {index}: {response_column!r} must end with a message "
                f"of role 'assistant', not {completion[-1]['role']!r}"
            )
        return Chat(
            [*prompt_messages, *completion], tools, len(prompt_messages), len(prompt_messages)
        )
    conversation = _with_system(
        [
            {"role": "user", "content": row_string(prompt, source.prompt_column, index, source)},
            {"role": "assistant", "content": row_string(response, response_column, index, source)},
        ],
        row,
        index,
        source,
    )
    return Chat(conversation, tools, len(conversation) - 1, 0)


def _message_keys(message: Any) -> tuple[str, str] | None:
    """The (role, content) keys of one chat message, or None when it has neither pair (a
    message with ``tool_calls`` needs no content)."""
    if not isinstance(message, Mapping):
        return None
    for keys in (("role", "content"), ("from", "value")):
        if keys[0] in message and (keys[1] in message or message.get("tool_calls")):
            return keys
    return None
