"""``python -m tests.engine.kill_run POINT N CLI-ARGS...``: run the ``dynamics`` CLI and
SIGKILL this very process at the N-th (1-based) occurrence of POINT (``none 0``: never):

- ``probe``: as a probe starts its optimizer steps (mid-update, some datasets probed);
- ``evaluate``: as a main evaluation starts;
- ``train``: as a stretch of main-run training starts;
- ``save``: while a resume point is being saved (all files written to the temporary folder,
  not yet swapped in);
- ``swap``: in the middle of the swap (the last resume point renamed to
  ``previous_checkpoint/``, the new one not yet in place);
- ``best-new``: as a new best checkpoint replaces the one before (the new one written and
  synced to disk, not yet swapped in);
- ``best-swap``: in the middle of that swap (the new best checkpoint exchanged into
  ``best_checkpoint/``, the one before not yet deleted).

A real SIGKILL: no handler, no cleanup, no flush runs, as when a machine is lost.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from dynamics.cli import main as cli_main
from dynamics.engine.learner import HFLearner
from dynamics.runs import rundir
from dynamics.runs import state as run_state


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str, n: int) -> None:
    count = 0

    def counted(original, when=lambda *args, **kwargs: True, after=False):
        def wrapped(*args, **kwargs):
            nonlocal count
            if when(*args, **kwargs):
                count += 1
                if count == n and not after:
                    kill()
            result = original(*args, **kwargs)
            if after and count == n and when(*args, **kwargs):
                kill()
            return result

        return wrapped

    if point == "none":
        return
    if point == "probe":
        HFLearner.probe = counted(HFLearner.probe)
    elif point == "evaluate":
        HFLearner.evaluate = counted(
            HFLearner.evaluate, when=lambda self, split, num_batches=None: num_batches is None
        )
    elif point == "train":
        HFLearner.train = counted(HFLearner.train)
    elif point == "save":
        # Once every file of the new resume point is written and synced (the best
        # checkpoint's writes are synced by the same function, and not counted).
        rundir.fsync_tree = counted(
            rundir.fsync_tree,
            when=lambda folder: folder.name.startswith(
                rundir.temporary_prefix(Path(run_state.RESUME_DIR))
            ),
            after=True,
        )
    elif point == "swap":
        # The first of the save's two renames: last_checkpoint/ renamed to previous_checkpoint/.
        rundir.os.replace = counted(
            os.replace, when=lambda src, dst: str(dst).endswith(run_state.PREVIOUS_DIR), after=True
        )
    elif point in ("best-new", "best-swap"):
        # The exchange of a new best checkpoint with the one before.
        rundir.exchange = counted(
            rundir.exchange,
            when=lambda new, path: Path(path).name == rundir.CHECKPOINT_DIR,
            after=point == "best-swap",
        )
    else:
        raise SystemExit(f"unknown kill point {point!r}")


if __name__ == "__main__":
    arm(sys.argv[1], int(sys.argv[2]))
    sys.exit(cli_main(sys.argv[3:]))
