"""The model card of a run's best checkpoint: ``best_checkpoint/README.md`` in the Hugging
Face Hub's format (YAML metadata, then Markdown), written from the run folder's files only
(``config.yaml``, ``summary.json``, ``metrics.jsonl``, ``controller.jsonl``, and
``lm_eval.json`` once ``dynamics eval`` wrote it), so any driver that wrote the folder, and
``dynamics push``, can write it.

The metadata is huggingface_hub's ``ModelCardData``: ``base_model``, the base's ``license``
(read from the base model's own card when it is on disk, ``dynamics.runs.base_card``),
``library_name``, ``datasets``, ``tags`` and, from ``lm_eval.json``, a ``model-index`` of
the best checkpoint's lm-evaluation-harness results (``EvalResult``). The body says what the
checkpoint was trained for (targets, constraints and their metrics), how the mixture moved
(the weights chosen at each update, the final ones), what it achieved at the chosen step
(each constraint's slack, the targets' test perplexity reduction), the lm-evaluation-harness
results against the base model, how to load it and how it was trained.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import ModelCard, ModelCardData

from dynamics.core.records import EvaluationLine
from dynamics.runs.base_card import base_license
from dynamics.runs.card_lm_eval import eval_results, lm_eval_record, lm_eval_section
from dynamics.runs.rundir import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    RunDirError,
    RunRecords,
    atomic_write_text,
    best_checkpoint_dir,
    read_run,
)

CARD_FILE = "README.md"
# The first line of the body: how a card this module wrote is told from one written by hand.
MARKER = "<!-- model card written by dynamics from the run folder (dynamics.runs.model_card) -->"
# What PEFT's and transformers' save_pretrained leave when no card is given: an empty template.
_TEMPLATE_SIGN = "[More Information Needed]"
# What PEFT saves beside an adapter's weights: how a folder of adapter weights is told from
# whole ones.
ADAPTER_CONFIG = "adapter_config.json"
_METHOD_TAGS = {"fixed": "fixed-mixture", "gradient-alignment": "gradient-alignment"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# The card: the metadata as huggingface_hub writes it, then the body.
_TEMPLATE = "---\n{{ card_data }}\n---\n\n{{ body }}\n"


def write_model_card(
    run_folder: Path, repo_id: str | None = None, weights_folder: Path | None = None
) -> Path:
    """Write the model card of the finished run in ``run_folder`` (atomically) and return its
    path. ``repo_id``: the Hub repository the checkpoint goes to, named in the loading
    snippet (by default the snippet loads the local folder). ``weights_folder``: the folder
    whose weights the card describes and where it is written, ``best_checkpoint/`` by default
    (``dynamics push --merge`` writes the card of the merged weights into their own folder);
    the card loads them as an adapter when the folder holds one (``adapter_config.json``),
    as whole weights otherwise."""
    folder = Path(run_folder)
    records = read_run(folder)
    checkpoint = best_checkpoint_dir(folder)
    if records.best_checkpoint is None or not checkpoint.is_dir():
        raise RunDirError(
            f"{folder} has no {CHECKPOINT_DIR}/: no evaluation of the run was feasible, so there "
            f"is no "
            "checkpoint to describe (dynamics report shows how close it came)"
        )
    try:
        config = yaml.safe_load((folder / CONFIG_FILE).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise RunDirError(
            f"{folder / CONFIG_FILE} cannot be read ({err}): the run folder is damaged"
        ) from None
    weights = checkpoint if weights_folder is None else Path(weights_folder)
    path = weights / CARD_FILE
    adapter = (weights / ADAPTER_CONFIG).is_file()
    card = model_card(
        records, config, where=repo_id or str(weights), name=repo_id or folder.name, adapter=adapter
    )
    atomic_write_text(path, str(card))
    return path


def card_is_missing(path: Path) -> bool:
    """Whether ``path`` lacks a model card of its own: absent, PEFT's empty template, or one
    this module wrote (rewriting it changes nothing but the repository it names). A card
    written by hand is kept."""
    if not path.is_file():
        return True
    text = path.read_text(errors="replace")
    return MARKER in text or _TEMPLATE_SIGN in text


# --- the text ----------------------------------------------------------------------------------


def _display(value: float, metric: str) -> str:
    # Values are lower-is-better: accuracy is stored as -accuracy.
    return f"accuracy {0.0 - value:.3f}" if metric == "accuracy" else f"loss {value:.4f}"


def _slack(value: float, metric: str) -> str:
    # slack = reference - value: nats for a loss, accuracy points (above the base) for accuracy.
    return f"{value:+.3f} accuracy" if metric == "accuracy" else f"{value:+.4f} nats"


def _source(dataset: dict[str, Any]) -> str:
    if dataset.get("hub_id"):
        split = dataset.get("split") or "train"
        config_name = f" ({dataset['config_name']})" if dataset.get("config_name") else ""
        hub_id = dataset["hub_id"]
        link = f"[{hub_id}](https://huggingface.co/datasets/{hub_id})"
        return f"{link}{config_name}, split {split}"
    if dataset.get("lm_eval_task"):
        return f"lm-evaluation-harness task {dataset['lm_eval_task']}"
    if dataset.get("path"):
        return f"local file {Path(str(dataset['path'])).name}"
    return "rows passed in Python"


def _base_model(config: dict[str, Any]) -> str | None:
    """The base model's hub id, when the run loaded one (a local folder is not a hub id)."""
    name = (config.get("model") or {}).get("name_or_path")
    if isinstance(name, str) and _HUB_ID.match(name) and not Path(name).expanduser().is_dir():
        return name
    return None


def card_data(
    records: RunRecords,
    config: dict[str, Any],
    name: str,
    lm_eval: dict[str, Any] | None,
    *,
    adapter: bool,
) -> ModelCardData:
    """The card's metadata (the Hub's model-card fields); ``name``: the model's name in the
    ``model-index``, made of ``lm_eval`` (``lm_eval.json``) when the run was evaluated;
    ``adapter``: whether the weights are a PEFT adapter (else whole weights)."""
    lora = config.get("lora") is not None
    model = config.get("model") or {}
    method = str(records.summary.get("method", (config.get("method") or {}).get("name", "")))
    tags = ["dynamics", "data-mixture", "constrained-fine-tuning"]
    tags += [_METHOD_TAGS[method]] if method in _METHOD_TAGS else []
    if lora:
        tags += ["lora", "qlora"] if model.get("quantization") else ["lora"]
    else:
        tags.append("full-fine-tuning")
    hub_ids = list(
        dict.fromkeys(d["hub_id"] for d in config.get("datasets", []) if d.get("hub_id"))
    )
    evaluations = eval_results(lm_eval) if lm_eval is not None else []
    license = base_license(model)
    return ModelCardData(
        base_model=_base_model(config),
        license=license.get("license"),
        license_name=license.get("license_name"),
        license_link=license.get("license_link"),
        library_name="peft" if adapter else "transformers",
        datasets=hub_ids or None,
        tags=tags,
        pipeline_tag="text-generation",
        model_name=name if evaluations else None,
        eval_results=evaluations or None,
    )


def _evaluation_at(records: RunRecords, step: int) -> EvaluationLine | None:
    lines = [line for line in records.kept_evaluations if line.step == step]
    return lines[-1] if lines else None


def _domains_section(records: RunRecords, config: dict[str, Any], step: int) -> list[str]:
    summary = records.summary
    names = records.domain_names
    metrics = dict(zip(names, summary["domain_metrics"], strict=True))
    roles = {d["name"]: d for d in config.get("datasets", [])}
    targets = {names[i] for i in records.targets}
    start = _evaluation_at(records, 0)
    chosen = _evaluation_at(records, step)
    lines = [
        "## Targets and constraints",
        "",
        "Targets are trained on and their loss minimised; constraints are evaluated only and must "
        "not end worse than the base model (step 0). Values on the eval split; slack = base - "
        "value "
        "for a loss, value - base for accuracy (>= 0: the constraint holds).",
        "",
        "| domain | role | metric | data | base (step 0) | chosen step | slack |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in names:
        metric = metrics[name]
        base = _display(start.eval[name], metric) if start else "-"
        now = _display(chosen.eval[name], metric) if chosen else "-"
        slack = (
            _slack(chosen.constraint_slack[name], metric)
            if chosen and name not in targets and name in chosen.constraint_slack
            else ""
        )
        role = "target" if name in targets else "constraint"
        lines.append(
            f"| {name} | {role} | {metric} | {_source(roles.get(name, {}))} | {base} | {now} | "
            f"{slack} |"
        )
    others = [d for d in config.get("datasets", []) if d.get("role") == "non-target"]
    if others:
        lines += [
            "",
            "Also trained on (non-target): "
            + "; ".join(f"{d['name']} ({_source(d)})" for d in others)
            + ".",
        ]
    return lines


def _results_section(records: RunRecords, step: int) -> list[str]:
    summary = records.summary
    names = records.domain_names
    metrics = dict(zip(names, summary["domain_metrics"], strict=True))
    constraints = [names[i] for i in records.constraints]
    chosen = _evaluation_at(records, step)
    lines = [
        "## Results",
        "",
        f"- Chosen checkpoint: step {step} of {summary['total_steps']}, the feasible main "
        f"evaluation after "
        "step 0 with the lowest summed target loss (eval split).",
        f"- Target perplexity reduction against the base model (test split): "
        f"{100 * float(summary['constrained_ppl_reduction']):.1f}%.",
    ]
    if constraints and chosen is not None:
        slack = chosen.constraint_slack
        worst = min(constraints, key=lambda c: slack[c])
        lines.append(
            f"- Worst constraint slack at step {step}: {worst}, "
            f"{_slack(slack[worst], metrics[worst])} "
            "(eval split)."
        )
    elif not constraints:
        lines.append("- No constraints.")
    return lines


def _trajectory_section(records: RunRecords, config: dict[str, Any], step: int) -> list[str]:
    datasets = records.dataset_names
    lines = ["## Mixture trajectory", ""]
    if not records.updates:
        start = _evaluation_at(records, 0)
        weights = start.weights if start else (config.get("method") or {}).get("weights") or {}
        shown = _weights(weights) or "as configured"
        return [*lines, f"Fixed weights over the whole run: {shown}."]
    lines += [
        "The training mixture chosen at each update (from controller.jsonl); it holds until the "
        "next one.",
        "",
        "| step | " + " | ".join(datasets) + " | |",
        "| --- | " + " | ".join("---" for _ in datasets) + " | --- |",
    ]
    for update in records.updates:
        weights = [f"{float(w):.3f}" for w in update.weights]
        note = "abandoned by a backtrack" if update.abandoned else ""
        lines.append(f"| {update.step} | " + " | ".join(weights) + f" | {note} |")
    kept = records.kept_updates
    if kept:
        final = dict(zip(datasets, kept[-1].weights, strict=True))
        lines += [
            "",
            f"Final mixture (update at step {kept[-1].step}, in force to the end of the run): "
            f"{_weights(final)}.",
        ]
    chosen = _evaluation_at(records, step)
    if chosen is not None and chosen.weights:
        lines.append(f"Mixture trained on at the chosen step {step}: {_weights(chosen.weights)}.")
    return lines


def _weights(weights: dict[str, Any]) -> str:
    return ", ".join(f"{name} {float(w):.3f}" for name, w in weights.items())


def _loading_section(config: dict[str, Any], where: str, adapter: bool) -> list[str]:
    quantization = (config.get("model") or {}).get("quantization")
    base = _base_model(config)
    lines = ["## How to load", ""]
    if adapter and base is not None:
        lines += [
            "```python",
            "from peft import AutoPeftModelForCausalLM",
            "from transformers import AutoTokenizer",
            "",
            f'model = AutoPeftModelForCausalLM.from_pretrained("{where}")  # loads {base}, then '
            f"the adapter",
            f'tokenizer = AutoTokenizer.from_pretrained("{where}")',
            "```",
        ]
        if quantization:
            lines += [
                "",
                f"The adapter was trained on the base weights quantized to {quantization['bits']} "
                f"bits "
                "(bitsandbytes; 4 bits: NF4, double quantization, bfloat16 compute); pass the same "
                "`quantization_config` to load the base as it was trained, or load it in full "
                "precision.",
            ]
    elif adapter:
        lines += [
            "```python",
            "from peft import PeftModel",
            "",
            "base = ...  # the base model the run trained (its config.yaml, model section)",
            f'model = PeftModel.from_pretrained(base, "{where}")',
            "```",
        ]
    else:
        lines += [
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'model = AutoModelForCausalLM.from_pretrained("{where}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{where}")',
            "```",
        ]
        if config.get("lora") is not None:
            lines += [
                "",
                "The weights are the base model's with the trained LoRA adapter merged in (peft's "
                "`merge_and_unload`, on the base loaded unquantized), so loading them needs no "
                "peft.",
            ]
    return lines


def _training_section(records: RunRecords, config: dict[str, Any]) -> list[str]:
    summary = records.summary
    method = config.get("method") or {}
    training = config.get("training") or {}
    optimizer = config.get("optimizer") or {}
    model = config.get("model") or {}
    lora = config.get("lora")
    name = str(method.get("name", summary.get("method")))
    if name == "dynamics":
        how = (
            f"DynaMiCS, variant {method.get('variant', 'paper')}, schedule "
            f"{method.get('schedule')}, "
            f"predictor {method.get('predictor', 'linear')}"
        )
        if method.get("backtrack"):
            how += f", backtracking {method['backtrack']}"
    elif name == "fixed":
        how = "a fixed mixture"
    else:
        how = name
    if lora is not None:
        targets = lora.get("target_modules")
        shown = targets if isinstance(targets, str) else ", ".join(targets or [])
        adapter = f"LoRA rank {lora.get('rank')}, alpha {lora.get('alpha')}, on {shown}"
        if model.get("quantization"):
            adapter = f"QLoRA ({model['quantization']['bits']}-bit base weights), " + adapter
    else:
        adapter = "full fine-tuning"
    base = _base_model(config) or (
        "a model built from model.init_config" if model.get("init_config") else "a local model"
    )
    batch = f"{training.get('batch_size')} x {training.get('gradient_accumulation', 1)} sequences"
    lines = [
        "## How it was trained",
        "",
        f"- Method: {how} ({summary.get('num_updates', len(records.updates))} mixture updates).",
        f"- Model: {base}, {adapter}.",
        f"- Steps: {summary['total_steps']} optimizer steps of {batch} of "
        f"{training.get('sequence_length')} "
        f"tokens, AdamW at learning rate {optimizer.get('lr')} "
        f"({optimizer.get('lr_schedule', 'constant')} "
        f"schedule), seed {training.get('seed')}.",
    ]
    if summary.get("predicted_cost") is not None:
        lines.append(
            f"- Compute: {float(summary['predicted_cost']):.2f}x one fixed-mixture run "
            f"({summary.get('cost_assumption', '')})."
        )
    lines.append(
        "- Trained with dynamics, which fine-tunes on a dynamic data mixture under performance "
        "constraints (DynaMiCS); the run folder's config.yaml holds every setting."
    )
    return lines


def model_card(
    records: RunRecords, config: dict[str, Any], *, where: str, name: str, adapter: bool
) -> ModelCard:
    """The card of ``records``' best checkpoint; ``where``: what the loading snippet loads,
    ``name``: the model's name in the metadata's ``model-index``, ``adapter``: whether the
    weights are a PEFT adapter (else whole weights: full fine-tuning, or an adapter merged)."""
    lm_eval = lm_eval_record(records.path)
    best = records.best_checkpoint
    assert best is not None  # write_model_card describes a run with a best checkpoint
    step = best.step
    base = _base_model(config)
    title = f"{base} fine-tuned with dynamics" if base else "A model fine-tuned with dynamics"
    names = records.domain_names
    targets = [names[i] for i in records.targets]
    constraints = [names[i] for i in records.constraints]
    intro = (
        f"Trained to improve {', '.join(targets)} while keeping "
        f"{', '.join(constraints) if constraints else 'no constraint'} no worse than in the base "
        f"model, "
        "on a training mixture re-chosen during the run."
    )
    body = [
        MARKER,
        "",
        f"# {title}",
        "",
        intro,
        "",
        *_domains_section(records, config, step),
        "",
        *_results_section(records, step),
        "",
        *([*lm_eval_section(lm_eval), ""] if lm_eval is not None else []),
        *_trajectory_section(records, config, step),
        "",
        *_loading_section(config, where, adapter),
        "",
        *_training_section(records, config),
    ]
    data = card_data(records, config, name, lm_eval, adapter=adapter)
    return ModelCard.from_template(data, template_str=_TEMPLATE, body="\n".join(body))
