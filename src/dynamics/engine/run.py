"""One fine-tuning run from a config: build, train with the configured mixture policy,
write the run folder (docs/method.md, "The run folder"). The recipe reads top to bottom:

    setup  -> tokenizer, model (+LoRA), data, evaluation batches, learner, policy
              (:func:`dynamics.engine.components.build_run`)
    train  -> ask ``core.controller.MixtureController`` what to do next and train the
              stretches it asks for; :class:`RunFolderWriter` keeps the folder up to date
    finish -> summary.json with the paper's metrics and the cost model's prediction

Under several processes (``torchrun`` / ``accelerate launch``) every rank builds the same
data (the first process of each machine tokenizes into datasets' cache, the others read
it); each optimizer step draws one global batch from one dataset and every rank trains
on its own slice of it; the fixed evaluation batches are shared out among the ranks
(batch b to rank b mod P) and the per-batch values gathered; the policy decides
on every rank (probes are collective training) and rank 0's decision is broadcast, so
all ranks hold identical weights and slopes. Only rank 0 writes files; a resume point holds
each rank's RNG state, gathered to rank 0, and a resume restores each rank's own. A
refusal that one rank finds while the run starts (the output folder, the data, a damaged
resume point, a resume under another number of processes) reaches every rank
(:func:`agree_on_refusal`), so no rank is left waiting for the others.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import datasets
import transformers
import yaml
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dynamics.core.controller import Finished, LoopCallbacks, MixtureController
from dynamics.engine import tracking
from dynamics.engine.components import (
    RunComponents,
    agree_on_refusal,
    attempt,
    build_run,
    controlled_learner,
)
from dynamics.engine.config import RunConfig
from dynamics.engine.launch import is_main_process, world_size
from dynamics.engine.learner import TrainingSnapshot, load_snapshot
from dynamics.engine.preflight import RunSetupError, preflight
from dynamics.engine.run_folder import RunFolderWriter, ShardedSaves
from dynamics.engine.training_state import load_rng_state
from dynamics.runs import rundir
from dynamics.runs import state as run_state

logger = logging.getLogger(__name__)


def checkpoint_steps(total_steps: int, interval: int | None, eval_interval: int) -> list[int]:
    """The resume points: every ``training.checkpoint_interval`` (``interval``) steps before
    ``training.total_steps``; by default (None) at every main evaluation, every
    ``evaluation.interval``; none for 0."""
    if interval is None:
        interval = eval_interval
    return list(range(interval, total_steps, interval)) if interval else []


def run(
    config: RunConfig,
    progress: bool = True,
    resume: bool = False,
    *,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    data: Mapping[str, datasets.Dataset] | None = None,
) -> dict[str, Any]:
    """Train ``config`` and write its run folder; returns the summary.

    With ``resume``, continue the run in ``config.output_dir`` from its last complete
    resume point (``last_checkpoint/``); the config must be the one it started with. A
    finished run is not trained again: its summary is returned as it is.

    From a notebook, ``model`` and ``tokenizer`` (together) replace the config's ``model``
    section: the model is fine-tuned in place (LoRA adapters, if ``lora`` is set, are added
    to it). ``data`` maps dataset names to ``datasets.Dataset`` rows for the datasets whose
    config gives no path or hub id. A resume must pass the same objects again.
    """
    started = time.perf_counter()
    # Our own bar shows the run's progress; the libraries' per-file bars (dataset splits,
    # weight loading, checkpoint shards) would only interleave with it.
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    out = Path(config.output_dir)
    choice = _start_on_every_rank(config, data, model is not None, resume)
    if resume and (out / rundir.SUMMARY_FILE).is_file():
        return dict(json.loads((out / rundir.SUMMARY_FILE).read_text()))
    resume_point = choice.path if choice is not None else None
    parts = build_run(config, model=model, tokenizer=tokenizer, data=data)
    # Created only once setup succeeded: a data or model error leaves no folder behind.
    _prepare_folder_on_every_rank(config, choice if resume else None)
    accelerator = parts.accelerator
    if config.trackers:
        tracking.start_trackers(accelerator, config)
    writer = RunFolderWriter(
        parts, out, progress and accelerator.is_main_process, f"dynamics run --resume {out}"
    )
    # Every rank takes part in rank 0's saves: each rank's RNG state goes into a resume point
    # (and under sharding, every shard into the whole tensors).
    sharded_saves = (
        ShardedSaves(parts)
        if accelerator.num_processes > 1 and not accelerator.is_main_process
        else None
    )
    if accelerator.is_main_process:
        callbacks = writer.callbacks()
    else:
        callbacks = sharded_saves.callbacks() if sharded_saves is not None else LoopCallbacks()
    training, evaluation, method = config.training, config.evaluation, config.method
    controller = MixtureController(
        controlled_learner(parts.learner, evaluation.relative_noise, evaluation.noise_seed),
        parts.policy,
        targets=parts.targets,
        constraints=parts.constraints,
        eval_interval=evaluation.interval,
        reduced_batches=evaluation.reduced_batches,
        callbacks=callbacks,
        max_backtracks=method.backtrack,
        backtrack_patience=method.backtrack_patience,
        checkpoint_steps=checkpoint_steps(
            training.total_steps, training.checkpoint_interval, evaluation.interval
        ),
    )
    if resume_point is not None:
        resume_from(resume_point, controller, parts, writer, sharded_saves)
    writer.train_started = time.perf_counter()
    while not isinstance(request := controller.next(), Finished):
        parts.learner.train(request.steps, request.weights)
        if callbacks.on_train is not None:
            callbacks.on_train(request.steps, request.until)
    summary = writer.finish(
        request.history, time.perf_counter() - started + writer.train_seconds_before
    )
    if config.trackers:
        accelerator.end_training()
    accelerator.wait_for_everyone()
    return summary


def _start_on_every_rank(
    config: RunConfig,
    data: Mapping[str, datasets.Dataset] | None,
    model_given: bool,
    resume: bool,
) -> run_state.ResumeChoice | None:
    """:func:`_check_start` on every rank. Checked before anything is written, so a bad
    request leaves no half-made run folder; a refusal found by one rank (only rank 0 checks
    the output folder) stops every rank."""
    main = is_main_process()
    choice, error = attempt(lambda: _check_start(config, data, model_given, resume, main))
    agree_on_refusal(error)
    return choice


def _prepare_folder_on_every_rank(config: RunConfig, choice: run_state.ResumeChoice | None) -> None:
    """:func:`_prepare_folder` on rank 0; a failure there stops every rank."""
    main = is_main_process()
    agree_on_refusal(attempt(lambda: _prepare_folder(config, choice) if main else None)[1])


def _prepare_folder(config: RunConfig, choice: run_state.ResumeChoice | None) -> None:
    """A new run folder with its config, or for a resume (``choice``) the folder cleared of
    what the interrupted run left half-made (and of damaged resume points)."""
    out = Path(config.output_dir)
    if choice is not None:
        run_state.clear_unfinished(
            out, keep=choice.path, damaged=[path for path, _ in choice.damaged]
        )
    else:
        rundir.prepare_run_dir(out)
        rundir.atomic_write_text(out / rundir.CONFIG_FILE, config.to_yaml())


def resume_from(
    point: Path,
    controller: MixtureController,
    parts: RunComponents,
    writer: RunFolderWriter,
    sharded_saves: ShardedSaves | None,
) -> None:
    """Put the learner, the controller and the run folder back where the resume point
    ``point`` stands (under sharding, each rank cuts its shards from the whole tensors;
    under several processes, each rank takes its own RNG state)."""
    learner = parts.learner
    saved = run_state.read_loop_file(point)
    rank = parts.accelerator.process_index
    per_rank = int(saved.get("processes") or 1) > 1

    def own(snapshot: TrainingSnapshot, name: str) -> TrainingSnapshot:
        if not per_rank:
            return snapshot  # one process: its RNG state is the snapshot's
        rng = load_rng_state(point / run_state.RNG_DIR, run_state.rank_rng_name(name, rank))
        return dataclasses.replace(snapshot, rng=rng)

    learner.load_training_state(own(load_snapshot(point, "learner"), "learner"))
    loop = saved["loop"]
    feasible = (
        None
        if loop["feasible"] is None
        else learner.cut_into_shards(own(load_snapshot(point, "feasible"), "feasible"))
    )
    controller.load_state_dict(loop, feasible)
    writer.resume(controller.history, controller.step, saved, point)
    if sharded_saves is not None:
        sharded_saves.resume(controller.history)


def _check_start(
    config: RunConfig,
    data: Mapping[str, datasets.Dataset] | None,
    model_given: bool,
    resume: bool,
    main: bool,
) -> run_state.ResumeChoice | None:
    """The refusals a run checks before its setup (raised), and for a resume the resume
    point it goes on from (None when the run is finished)."""
    missing = tracking.trackers_missing(config.trackers)
    if missing:
        raise RunSetupError(
            f"trackers {missing} are not installed: pip install {' '.join(missing)}, or remove them"
        )
    preflight(config, data, model_given=model_given)  # refusals raise; warnings are logged
    out = Path(config.output_dir)
    if not resume:
        if main:
            rundir.check_run_dir(out)  # fail before minutes of setup, not after
        return None
    if (out / rundir.SUMMARY_FILE).is_file():
        return None
    check_same_config(config, out)
    choice = run_state.choose_resume_point(out)
    if choice.path is None and choice.damaged:
        raise rundir.RunDirError(
            f"{out} has no usable resume point ({choice.describe_damaged()}): its files were "
            "changed or cut short after they were written; restore them from a copy, or start the "
            f"run again in a new folder: dynamics run {out / rundir.CONFIG_FILE} --out NEW_DIR"
        )
    if choice.path is not None:
        check_same_processes(choice.path, out)
    if not main:
        return choice
    if choice.path is None:
        # Stopped before its first resume point: nothing trained is lost by starting over.
        logger.warning(
            "%s holds no complete resume point yet: the run starts again from step 0", out
        )
    elif choice.damaged:
        logger.warning(
            "%s: %s; resuming from %s/ (step %s) instead, and removing the damaged folder",
            out,
            choice.describe_damaged(),
            choice.path.name,
            choice.step,
        )
    else:
        logger.info("%s: resuming from %s/ (step %s)", out, choice.path.name, choice.step)
    return choice


def check_same_processes(point: Path, out: Path) -> None:
    """A resume goes on with the number of processes that saved ``point``: the global batch
    is ``training.batch_size`` rows per process, the probes are shared out among the ranks,
    and each rank restores its own RNG state, so another number would train another run."""
    saved = run_state.saved_processes(point)
    here = world_size()
    if saved is None or saved == here:
        return

    def count(n: int) -> str:
        return f"{n} process" if n == 1 else f"{n} processes"

    raise RunSetupError(
        f"the resume point {point} was saved by {count(saved)} but this run has {here}: resume "
        f"with the same number of processes (torchrun --nproc-per-node {saved} -m dynamics.cli "
        f"run --resume {out}, or over several machines {saved} processes in all)"
    )


def check_same_config(config: RunConfig, out: Path, how: str | None = None) -> None:
    """A resumed run must go on with the config it started with (saved in ``out``); ``how``
    says how to resume with the saved one (by default ``dynamics run --resume``). Where the
    folder was when the run started does not matter: a run folder can be moved or copied."""
    path = out / rundir.CONFIG_FILE
    if not path.is_file():
        raise RunSetupError(f"{path} is missing: {out} is not a run folder that can be resumed")
    saved = RunConfig.model_validate(yaml.safe_load(path.read_text()))
    saved = saved.model_copy(update={"output_dir": config.output_dir})
    if saved != config:
        mine, theirs = config.model_dump(mode="json"), saved.model_dump(mode="json")
        changed = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        raise RunSetupError(
            f"the config differs from the one {out} started with (in {', '.join(changed)}): "
            f"resume with the saved {path}, {how or f'e.g. dynamics run --resume {out}'}"
        )
