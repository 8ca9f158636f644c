"""A LoRA or QLoRA run's best checkpoint merged into its base model: whole weights that
load with transformers alone (``dynamics push --merge``).

The base is the one ``dynamics eval`` loads (``dynamics.engine.harness.model_args``): the
run config's ``model.name_or_path`` at its revision, or the base given when the config
names none. It is loaded unquantized, in the run's ``model.dtype`` (``auto``: the dtype its
weights are stored in), so a QLoRA adapter is merged into full-precision weights. PEFT
merges the adapter (``merge_and_unload``); transformers saves the result in safetensors,
with the run's tokenizer (the one ``best_checkpoint/`` holds).
"""

from __future__ import annotations

from pathlib import Path

from dynamics.engine.harness import HarnessError, model_args
from dynamics.runs import rundir
from dynamics.runs.model_card import ADAPTER_CONFIG


class MergeError(ValueError):
    """A run whose best checkpoint cannot be merged; the message says what to do instead."""


def merge_adapter(run_dir: str | Path, out: str | Path, base: str | None = None) -> Path:
    """Save the best checkpoint of the LoRA/QLoRA run in ``run_dir`` merged into its base
    model, with the tokenizer, into the folder ``out``; return ``out``. ``base``: the base
    model's hub id or folder when the run config names none (as ``dynamics eval --base``)."""
    folder = Path(run_dir)
    checkpoint = rundir.best_checkpoint_dir(folder)
    if checkpoint.is_dir() and not (checkpoint / ADAPTER_CONFIG).is_file():
        raise MergeError(
            f"--merge: {checkpoint} holds whole weights (a full fine-tuning run), "
            "so there is no adapter to merge: push without --merge"
        )
    try:
        arguments = model_args(folder, base)["base"]
    except HarnessError as err:
        raise MergeError(f"--merge: {err}") from None

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        arguments["pretrained"],
        revision=arguments.get("revision"),
        dtype=arguments["dtype"],
        trust_remote_code=arguments["trust_remote_code"],
    )
    merged = PeftModel.from_pretrained(model, str(checkpoint)).merge_and_unload()
    target = Path(out)
    merged.save_pretrained(target)  # safetensors: transformers' only format
    AutoTokenizer.from_pretrained(
        checkpoint, trust_remote_code=arguments["trust_remote_code"]
    ).save_pretrained(target)
    return target
