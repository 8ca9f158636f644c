"""``python -m tests.engine.ranks_draw POINT N CLI-ARGS...``: ``tests.engine.kill_run`` (the
``dynamics`` CLI, SIGKILLed at the N-th POINT; ``none 0``: never) in a process whose random
number generators draw a different amount on each rank before every stretch of main-run
training: rank r draws r + 1 numbers from torch's CPU generator, python's and numpy's.

So the ranks' RNG states differ at every resume point, as they do wherever the ranks' work
differs, and a resume that gave every rank rank 0's state would change the dropout masks of
every rank but rank 0.
"""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import torch

from dynamics.cli import main as cli_main
from dynamics.engine.learner import HFLearner
from tests.engine.kill_run import arm


def draw_per_rank() -> None:
    rank = int(os.environ.get("RANK", "0"))
    train = HFLearner.train

    def drawing(self, *args, **kwargs):
        torch.rand(rank + 1)
        for _ in range(rank + 1):
            random.random()
        np.random.rand(rank + 1)  # noqa: NPY002 (the legacy generator RNGState saves)
        return train(self, *args, **kwargs)

    HFLearner.train = drawing


if __name__ == "__main__":
    draw_per_rank()
    arm(sys.argv[1], int(sys.argv[2]))  # the kill comes before the draws of the N-th stretch
    sys.exit(cli_main(sys.argv[3:]))
