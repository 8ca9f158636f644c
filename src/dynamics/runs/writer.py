"""Writing the run folder (docs/method.md, "The run folder"): ``metrics.jsonl`` and
``controller.jsonl`` as the loop goes, the best feasible checkpoint, resume points and
``summary.json``. Each line is a record of :mod:`dynamics.core.records` serialized with its
``to_dict``: :class:`~dynamics.core.records.EvaluationLine` in ``metrics.jsonl``,
:class:`~dynamics.core.records.UpdateRecord` in ``controller.jsonl``.

What goes into a checkpoint or a resume point besides the run folder's own files (the model,
the learner's training state, each rank's RNG state) is the caller's, written into the
folder it is given.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dynamics.core import metrics
from dynamics.core.records import EvaluationLine, EvaluationRecord, RunHistory
from dynamics.runs import rundir
from dynamics.runs import state as run_state
from dynamics.runs.model_card import write_model_card


def is_feasible(record: EvaluationRecord, history: RunHistory) -> bool:
    """Whether a main evaluation is a feasible checkpoint (the paper's definition)."""
    reference = history.evaluations[0]
    return record.step > 0 and metrics.checkpoint_feasible(
        record, reference, history.targets, history.constraints
    )


def evaluation_line(record: EvaluationRecord, history: RunHistory) -> EvaluationLine:
    """The ``metrics.jsonl`` line of one main evaluation (also what trackers are shown)."""
    names = history.domain_names
    slack = metrics.constraint_slack(record, history.evaluations[0], history.constraints)
    return EvaluationLine(
        step=record.step,
        eval=rundir.named(record.eval, names),
        test=rundir.named(record.test, names),
        weights=rundir.named(record.weights, history.dataset_names) if record.weights.size else {},
        target_loss_sum=float(record.eval[list(history.targets)].sum()),
        constraint_slack=rundir.named(slack, [names[i] for i in history.constraints]),
        feasible=bool(is_feasible(record, history)),
        backtracked=record.backtracked,
        wall_seconds=record.wall_seconds,
        eval_batches=None
        if record.eval_batches is None
        else _per_batch(record.eval_batches, names),
    )


def _per_batch(values: np.ndarray, names: list[str]) -> dict[str, list[float]]:
    return {name: [float(v) for v in row] for name, row in zip(names, values, strict=True)}


class BestCheckpoint:
    """The best checkpoint so far: the feasible evaluation with the lowest target loss sum,
    those clearing the selection ``margin`` first, then those closest to clearing it
    (``metrics.best_feasible_checkpoint``)."""

    def __init__(self, margin: float = 0.0) -> None:
        self.margin = margin
        self.record: EvaluationRecord | None = None
        self.rank: tuple[bool, float, float] | None = None

    def update(self, record: EvaluationRecord, history: RunHistory) -> bool:
        """Whether ``record`` is the new best (and then remember it)."""
        if not is_feasible(record, history):
            return False
        rank = metrics.selection_rank(
            record, history.evaluations[0], history.targets, history.constraints, self.margin
        )
        if self.rank is None or rank < self.rank:
            self.record, self.rank = record, rank
            return True
        return False


class RunFolder:
    """The files of the run folder ``out`` (rank 0 writes them). ``resume_how`` is the
    command that continues the run, said when a full disk stops it; ``selection_margin`` is
    the run's ``evaluation.selection_margin``, which chooses the best checkpoint."""

    def __init__(self, out: Path, resume_how: str, selection_margin: float) -> None:
        self.out = out
        self.resume_how = resume_how
        self.metrics_log = rundir.JsonlLog(out / rundir.METRICS_FILE)
        self.controller_log = rundir.JsonlLog(out / rundir.CONTROLLER_FILE)
        self.best = BestCheckpoint(selection_margin)

    @contextlib.contextmanager
    def writing(self, what: str, path: Path) -> Iterator[None]:
        """Stop the run with one line (:class:`rundir.RunStopped`) when the disk is full
        while ``what`` is written to ``path``: every write is atomic, so what was written
        before stays whole, and the last complete resume point is where the run goes on."""
        try:
            yield
        except Exception as err:
            if not rundir.out_of_space(err):
                raise
            point = run_state.choose_resume_point(self.out)
            goes_on = (
                f"it goes on from {point.path.name}/ (step {point.step})"
                if point.path is not None
                else "it has no resume point yet and starts again from step 0"
            )
            raise rundir.RunStopped(
                f"no space left on the device while writing {what} ({path}): free space "
                f"there, then continue the run with {self.resume_how} ({goes_on})"
            ) from err

    def write_updates(self, history: RunHistory) -> None:
        """``controller.jsonl``: one line per update, each with the run's dataset names."""
        # The previous update's realized losses are known only now, so the whole (small)
        # file is rewritten rather than appended to.
        with self.writing(rundir.CONTROLLER_FILE, self.controller_log.path):
            self.controller_log.rewrite(
                {"dataset_names": history.dataset_names, **u.to_dict()} for u in history.updates
            )

    def write_evaluation(self, record: EvaluationRecord, history: RunHistory) -> bool:
        """Add ``record``'s line to ``metrics.jsonl`` (after a backtrack, rewrite every line:
        those written before it may have been left behind with it); whether it is the new
        best checkpoint, which the caller then writes (:meth:`write_best_checkpoint`)."""
        with self.writing(rundir.METRICS_FILE, self.metrics_log.path):
            if record.backtracked:
                self.metrics_log.rewrite(
                    evaluation_line(r, history).to_dict() for r in history.evaluations
                )
            else:
                self.metrics_log.append(evaluation_line(record, history).to_dict())
        return self.best.update(record, history)

    def restore(self, history: RunHistory, resume_point: Path) -> None:
        """On a resume from ``resume_point``: the logs rewritten as they stood there (a crash
        may have left lines of steps about to be trained again), its best checkpoint put
        back."""
        with self.writing(rundir.METRICS_FILE, self.metrics_log.path):
            self.metrics_log.rewrite(
                evaluation_line(record, history).to_dict() for record in history.evaluations
            )
        for record in history.evaluations:
            self.best.update(record, history)
        self.write_updates(history)
        with self.writing("the best checkpoint", self.out / rundir.CHECKPOINT_DIR):
            run_state.restore_best_copy(self.out, resume_point)

    def write_best_checkpoint(self, step: int, write_model: Callable[[Path], None]) -> None:
        """``best_checkpoint/`` of ``step``: what ``write_model`` writes into the folder it
        is given (weights or adapter, tokenizer), and ``step.txt``."""

        def write(folder: Path) -> None:
            write_model(folder)
            (folder / "step.txt").write_text(f"{step}\n")

        path = self.out / rundir.CHECKPOINT_DIR
        with self.writing(f"the best checkpoint of step {step}", path):
            rundir.atomic_write_dir(path, write)

    def write_resume_point(
        self,
        root: Path,
        name: str,
        loop_file: dict[str, Any],
        config_yaml: str,
        write_state: Callable[[Path], None],
    ) -> None:
        """The resume point ``root/name`` of the step ``loop_file["loop"]["step"]``: what
        ``write_state`` writes (the learner's training state), the loop file, the config
        and a copy of the best checkpoint, with its manifest (:mod:`dynamics.runs.state`)."""

        def write(folder: Path) -> None:
            write_state(folder)
            text = json.dumps(loop_file, allow_nan=False)
            (folder / run_state.LOOP_FILE).write_text(text)
            (folder / rundir.CONFIG_FILE).write_text(config_yaml)
            run_state.save_best_copy(self.out, folder)

        step = int(loop_file["loop"]["step"])
        with self.writing(f"the resume point of step {step}", root / name):
            run_state.write_resume_point(root, step, write, name=name)

    def write_summary(self, summary: dict[str, Any], history: RunHistory) -> None:
        """The final ``controller.jsonl`` (the final evaluation closed the last horizon),
        ``summary.json``, and the best checkpoint's model card when there is one."""
        self.write_updates(history)
        with self.writing(rundir.SUMMARY_FILE, self.out / rundir.SUMMARY_FILE):
            rundir.write_json(self.out / rundir.SUMMARY_FILE, summary)
        if summary["best_checkpoint"] is not None:
            with self.writing("the model card", self.out / rundir.CHECKPOINT_DIR):
                write_model_card(self.out)
