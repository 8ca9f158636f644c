"""The base of every run-config section, and the error a config that cannot be used raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the field and the fix."""


class ConfigSection(BaseModel):
    """A section of the run config: unknown fields refused, frozen once validated."""

    # NaN and infinity are never meaningful settings (a NaN weight or learning rate would
    # only surface as NaN losses minutes into the run), so every float field refuses them.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
