"""The base model's own model card, as far as it is on this machine: its license, which a
fine-tuned model inherits and so its card repeats.

The card is the base's ``README.md``: in its folder when the run loaded a local folder, or
in the Hugging Face cache (``try_to_load_from_cache``, at the run's revision) when it loaded
a hub id. Nothing is downloaded: a card that is not on disk means an unknown license.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LICENSE_FIELDS = ("license", "license_name", "license_link")
"""The model-card metadata that says a model's license (``license_name`` and
``license_link`` name one the Hub does not list, ``license: other``)."""


def base_card_path(model: dict[str, Any]) -> Path | None:
    """The base model's ``README.md`` on disk, for the run config's ``model`` section; None
    when the run names no base (``init_config``, a model passed in Python) or its card is
    neither in its folder nor in the Hugging Face cache."""
    name = model.get("name_or_path")
    if not isinstance(name, str):
        return None
    folder = Path(name).expanduser()
    if folder.is_dir():
        card = folder / "README.md"
        return card if card.is_file() else None
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(
            name, "README.md", revision=model.get("revision"), repo_type="model"
        )
    except (HFValidationError, ValueError):  # not a hub id either: nothing to read
        return None
    return Path(cached) if isinstance(cached, str) else None


def base_license(model: dict[str, Any]) -> dict[str, str]:
    """The license fields of the base model's card (``LICENSE_FIELDS`` it sets), for the run
    config's ``model`` section; empty when the card is not on disk, sets none, or cannot be
    parsed (a card is another project's file: an unreadable one is no reason to fail)."""
    path = base_card_path(model)
    if path is None:
        return {}
    import yaml
    from huggingface_hub import ModelCard

    try:
        data = ModelCard.load(path, ignore_metadata_errors=True).data
    except (
        OSError,
        ValueError,
        yaml.YAMLError,
    ):  # unreadable, not UTF-8, or a malformed front matter
        return {}
    return {field: str(data.get(field)) for field in LICENSE_FIELDS if data.get(field)}
