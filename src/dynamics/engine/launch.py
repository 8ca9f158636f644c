"""Which process this is, under ``torchrun`` or ``accelerate launch``, before any
Accelerator exists (both set ``RANK`` and ``WORLD_SIZE`` for every process; a plain
``python`` run is rank 0 of 1)."""

from __future__ import annotations

import os


def process_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return process_rank() == 0
