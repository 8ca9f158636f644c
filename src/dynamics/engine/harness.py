"""lm-evaluation-harness on a run folder: the base model and the best checkpoint (docs/lm-eval.md).

Public API:

- ``evaluate_run(run_dir, tasks, *, limit=None, include_path=None, base=None,
  batch_size=8, device=None, options=None) -> dict``: ``lm_eval.simple_evaluate`` with its
  ``hf`` model, once on the base model and once on ``best_checkpoint/``, and the result
  written atomically to ``RUN_DIR/lm_eval.json``. A LoRA run's checkpoint is an adapter,
  evaluated as ``pretrained=<base>, peft=<best_checkpoint>``; a full fine-tuning run's
  checkpoint holds whole weights, evaluated as ``pretrained=<best_checkpoint>``. The base is
  the run config's ``model.name_or_path`` (with its revision), or ``base`` (a run of the
  Trainer callback, or of a model passed in Python, names none). Both use the run's
  tokenizer. A run whose base was loaded quantized (``model.quantization``) is evaluated
  quantized: the base is loaded by the run's own loader (``load_causal_lm``, the same
  bitsandbytes settings), the adapter put on it with peft, and the model handed to lm-eval's
  ``HFLM``. ``options`` are ``simple_evaluate``'s prompt options, passed as they are:
  ``num_fewshot``, ``apply_chat_template``, ``fewshot_as_multiturn``, ``system_instruction``
  (``EVAL_OPTIONS``).
- ``LM_EVAL_FILE``: ``lm_eval.json``. Its shape::

      {"tasks": [...], "limit": null, "lm_eval_version": "0.4.13", "options": {...},
       "models": {"base": {"model_args": {...}, "quantization": null,
                           "results": {task: {"acc,none": .., "acc_stderr,none": .., ...}},
                           "n-shot": {...}, "n-samples": {...}, "higher_is_better": {...},
                           "versions": {...}, "configs": {...}},
                  "best_checkpoint": {...}}}

  ``results`` is lm-eval's own per-task dictionary (metric and filter names as lm-eval
  writes them, its stderr beside each metric), ``versions`` and ``configs`` lm-eval's task
  versions and task configs (what was evaluated); a value that is not a finite number is
  null, one that is not JSON (a function of a task config) its text.
- ``HarnessError``: a run folder or a task that cannot be evaluated, with the fix.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynamics.runs import rundir

if TYPE_CHECKING:
    from dynamics.engine.config import QuantizationConfig, RunConfig

LM_EVAL_FILE = rundir.LM_EVAL_FILE
EVAL_OPTIONS = ("num_fewshot", "apply_chat_template", "fewshot_as_multiturn", "system_instruction")
"""``simple_evaluate``'s arguments that shape the prompts, given by ``dynamics eval``'s options."""
RECORDED = ("results", "n-shot", "n-samples", "higher_is_better", "versions", "configs")
"""What ``lm_eval.json`` keeps of each ``simple_evaluate`` output."""


class HarnessError(ValueError):
    """A run folder or task that lm-eval cannot evaluate; the message says what to change."""


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, int | str | bool) or value is None:
        return value
    return str(value)


def _run_config(run_dir: Path) -> RunConfig:
    from dynamics.engine.config import ConfigError, RunConfig

    try:
        return RunConfig.from_yaml(run_dir / rundir.CONFIG_FILE)
    except ConfigError as err:
        raise HarnessError(f"{run_dir} is not a run folder ({err})") from None


def model_args(run_dir: Path, base: str | None = None) -> dict[str, dict[str, Any]]:
    """lm-eval's ``hf`` model arguments of the base model and of the best checkpoint."""
    config = _run_config(run_dir)
    checkpoint = rundir.best_checkpoint_dir(run_dir)
    if not checkpoint.is_dir():
        raise HarnessError(
            f"{run_dir} has no {rundir.CHECKPOINT_DIR}/: the run has not reached a feasible "
            "evaluation, so there is no checkpoint to compare with the base model"
        )
    pretrained = base if base is not None else config.model.name_or_path
    if pretrained is None:
        raise HarnessError(
            f"{run_dir}: the run's base model is not a hub id or folder (model.init_config, "
            "or a model passed in Python): give --base with the base model's hub id or folder"
        )
    shared: dict[str, Any] = {
        "dtype": config.model.dtype,
        "tokenizer": config.model.tokenizer or pretrained,
        "trust_remote_code": config.model.trust_remote_code,
    }
    before: dict[str, Any] = {"pretrained": pretrained, **shared}
    if base is None and config.model.revision is not None:
        before["revision"] = config.model.revision
    adapter = (checkpoint / "adapter_config.json").is_file()
    after = (
        {**before, "peft": str(checkpoint)}
        if adapter
        else {"pretrained": str(checkpoint), **shared}
    )
    return {"base": before, "best_checkpoint": after}


def quantized_model(
    args: dict[str, Any], quantization: QuantizationConfig, batch_size: int | str
) -> Any:
    """lm-eval's ``HFLM`` on the model ``args`` names, its base weights loaded quantized by
    the run's own loader, its adapter (``peft``) put on them. ``HFLM`` cannot be given the
    quantization through ``model_args``: transformers takes it as a ``quantization_config``
    object only, which ``HFLM`` passes on from the checkpoint's own config alone."""
    from lm_eval.models.huggingface import HFLM

    from dynamics.engine.config import ModelConfig
    from dynamics.engine.model import load_causal_lm

    base = ModelConfig(
        name_or_path=args["pretrained"],
        revision=args.get("revision"),
        dtype=args["dtype"],
        trust_remote_code=args["trust_remote_code"],
        quantization=quantization,
    )
    model: Any = load_causal_lm(base)
    if "peft" in args:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args["peft"])
    return HFLM(
        pretrained=model,
        tokenizer=args["tokenizer"],
        trust_remote_code=args["trust_remote_code"],
        batch_size=batch_size,
    )


def evaluate_run(
    run_dir: str | Path,
    tasks: Sequence[str],
    *,
    limit: int | float | None = None,
    include_path: str | None = None,
    base: str | None = None,
    batch_size: int | str = 8,
    device: str | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate the base model and the best checkpoint; write and return ``lm_eval.json``."""
    folder = Path(run_dir)
    if not tasks:
        raise HarnessError("no tasks: name lm-eval tasks, e.g. --tasks tinyMMLU,tinyHellaswag")
    options = dict(options or {})
    unknown_options = sorted(set(options) - set(EVAL_OPTIONS))
    if unknown_options:
        raise HarnessError(f"unknown lm-eval options {unknown_options}; use {list(EVAL_OPTIONS)}")
    arguments = model_args(folder, base)
    quantization = _run_config(folder).model.quantization
    try:
        import lm_eval
    except ImportError:
        raise HarnessError(
            "dynamics eval needs lm-evaluation-harness: "
            "pip install 'dynamics[lm-eval]' (or lm_eval==0.4.13)"
        ) from None
    import torch

    from dynamics.data.lm_eval_tasks import task_manager

    manager = task_manager(tasks, include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        where = (
            f" (nor in {include_path})"
            if include_path
            else " (a local task: --include-path its folder)"
        )
        raise HarnessError(f"lm-eval knows no task {unknown}{where}; `lm_eval ls tasks` lists them")
    chosen_device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    models = {}
    for name, args in arguments.items():
        model = "hf" if quantization is None else quantized_model(args, quantization, batch_size)
        output = lm_eval.simple_evaluate(
            model=model,
            model_args=dict(args) if quantization is None else None,
            tasks=list(tasks),
            task_manager=manager,
            limit=limit,
            batch_size=batch_size,
            device=chosen_device,
            log_samples=False,
            **options,
        )
        if output is None:  # only ranks other than 0 get None
            raise HarnessError(
                "lm_eval.simple_evaluate returned no results; run dynamics eval as one process"
            )
        models[name] = {
            "model_args": args,
            "quantization": None if quantization is None else quantization.model_dump(),
            **{key: output.get(key, {}) for key in RECORDED},
        }
    record = _finite(
        {
            "tasks": list(tasks),
            "limit": limit,
            "lm_eval_version": metadata.version("lm_eval"),
            "options": options,
            "models": models,
        }
    )
    rundir.atomic_write_text(
        folder / LM_EVAL_FILE, json.dumps(record, indent=2, allow_nan=False) + "\n"
    )
    return dict(record)
