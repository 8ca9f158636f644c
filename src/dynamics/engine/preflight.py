"""Checks of a run against its environment, before anything is loaded or written.

``preflight(config)`` runs at the top of ``dynamics.engine.run.run``. A validated config can
still be unusable where it runs: a launcher that shards the model, an output folder that
cannot be created, a model, tokenizer or data file that is not there, a model whose shape
does not fit the settings. Each is refused here in one line, with the same error types the
CLI turns into exit code 2 (``RunSetupError``, ``RunDirError``, ``DataError``), in seconds
and before the weights or the data are read; nothing is created. What is legal but likely
unintended is returned (and logged) as a warning.

What is checked, cheapest first (docs/errors.md lists every refusal with its message):

- the launch: FSDP, DeepSpeed or Megatron-LM through accelerate (``ACCELERATE_USE_*``);
- precision: full fine-tuning of float16 weights under fp16 mixed precision is refused;
- quantization (``model.quantization``): only with a LoRA adapter, not under a sharded
  launch, and only where a CUDA GPU and the bitsandbytes package are there;
- the output folder: a folder, or creatable in its nearest existing parent, and writable
  (whether it is empty is ``run``'s own check, which a resumed run skips);
- every local dataset file: present, a known extension, not empty;
- the model: ``model.name_or_path`` resolves (a local folder, or a hub id, offline or not)
  or ``model.init_config`` names a known ``model_type``; the tokenizer loads; the model's
  vocabulary holds the tokenizer's; ``training.sequence_length`` fits its positions;
  ``lora.target_modules`` names modules it has (checked on a weightless meta-device copy);
- and, as a warning only, full fine-tuning under mixed precision with weights that do not
  load in float32 (see ``precision_warnings``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from dynamics.data.loading import DataError, check_path, offline, one_line
from dynamics.engine.config import LoraConfig, ModelConfig, RunConfig
from dynamics.engine.dataset_config import DatasetConfig
from dynamics.engine.model import load_tokenizer, resolve_dtype
from dynamics.runs.rundir import RunDirError


class RunSetupError(ValueError):
    """A run that cannot start as configured; the message says what to change."""


logger = logging.getLogger(__name__)

# accelerate's environment flag -> what it launches. Probes snapshot and restore each
# rank's trainable weights and optimizer state, FSDP2's shards included (DTensors); the
# flat parameters of FSDP1, DeepSpeed's partitions and Megatron-LM's are not handled.
SHARDED_LAUNCHES = {
    "ACCELERATE_USE_FSDP": "FSDP",
    "ACCELERATE_USE_DEEPSPEED": "DeepSpeed",
    "ACCELERATE_USE_MEGATRON_LM": "Megatron-LM",
}
_TRUE = ("1", "true", "yes", "y", "on", "t")


def preflight(
    config: RunConfig, data: Mapping[str, Any] | None = None, model_given: bool = False
) -> list[str]:
    """Refuse what cannot run here (raising ``RunSetupError``, ``RunDirError`` or
    ``DataError``); return the warnings, which are also logged. ``data`` holds the rows
    passed in Python by dataset name; ``model_given``: the model was passed in Python.

    The one function here that reads the whole config: each check takes the sections it
    checks."""
    model, lora, mixed_precision = config.model, config.lora, config.training.mixed_precision
    check_launch()
    check_precision(model, lora, mixed_precision)
    # Read with the precision check it belongs to; logged only once every check has passed.
    warnings = precision_warnings(model, lora, mixed_precision)
    check_quantization(model, lora)
    check_output_dir(config.output_dir)
    check_sources(config.datasets, data or {})
    if not model_given:  # the caller's own model and tokenizer need no resolving
        if model.name_or_path is None and model.init_config is None:
            raise RunSetupError(
                "the config names no model: set model.name_or_path (a hub id or folder) or "
                "model.init_config (or, from Python, pass it: dynamics.run(config, "
                "model=model, tokenizer=tokenizer))"
            )
        check_attention(model)
        check_model(model, config.training.sequence_length, lora)
    for warning in warnings:
        logger.warning(warning)
    return warnings


def check_sources(datasets: Sequence[DatasetConfig], data: Mapping[str, Any]) -> None:
    """Every dataset has rows to read: a file that exists, a hub id, or rows passed in Python."""
    names = [d.name for d in datasets]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise RunSetupError(
            f"data= names {unknown}, which are not datasets of the config ({names})"
        )
    for dataset in datasets:
        rows = data.get(dataset.name)
        if (
            rows is None
            and dataset.path is None
            and dataset.hub_id is None
            and dataset.lm_eval_task is None
        ):
            raise DataError(
                f"dataset {dataset.name!r} has no path or hub_id: set one of them (or, from "
                f"Python, pass its rows: dynamics.run(config, data={{{dataset.name!r}: rows}}))"
            )
        if rows is not None and (dataset.path is not None or dataset.hub_id is not None):
            raise RunSetupError(
                f"dataset {dataset.name!r} has a {'path' if dataset.path else 'hub_id'} in the "
                "config and rows in data=: give one of them"
            )
        check_path(dataset.data_source(rows))


def _sharded_launches() -> list[tuple[str, str, str]]:
    """``(variable, name, value)`` of each sharded launch accelerate's environment turns on."""
    return [
        (variable, name, value)
        for variable, name in SHARDED_LAUNCHES.items()
        if (value := os.environ.get(variable, "")).strip().lower() in _TRUE
    ]


def sharded_launch() -> str | None:
    """What accelerate's environment says the processes were launched under (FSDP, DeepSpeed,
    Megatron-LM, with the variable that says so), or None for plain data parallelism."""
    launches = _sharded_launches()
    if not launches:
        return None
    variable, name, value = launches[0]
    return f"{name} ({variable}={value})"


def check_launch() -> None:
    for variable, name, value in _sharded_launches():
        version = os.environ.get("FSDP_VERSION", "").strip()
        if name == "FSDP" and version == "2":
            continue
        if name == "FSDP":
            setting = f"FSDP_VERSION={version}" if version else "FSDP_VERSION unset, meaning 1"
            what = f"FSDP version {version or 1} ({variable}={value}, {setting})"
        else:
            what = f"{name} ({variable}={value})"
        raise RunSetupError(
            f"launched under {what}: dynamics snapshots and restores sharded training state only "
            "under FSDP2; launch with fsdp_version: 2 in the accelerate config (or accelerate "
            "launch --use_fsdp --fsdp_version 2), or with plain data parallelism (torchrun; a "
            "LoRA adapter's base model fits on each GPU)"
        )


def check_output_dir(output_dir: str) -> None:
    """The run folder must be a writable folder, or creatable: its nearest existing parent
    a writable folder. Nothing is left behind."""
    out = Path(output_dir)
    existing = out
    while not _exists(existing):
        existing = existing.parent
    if not existing.is_dir():
        raise RunDirError(
            f"output_dir {out}: {existing} is a file, not a folder; choose another output_dir (or "
            "--out)"
        )
    error = _creatable_in(existing)
    if error is not None:
        raise RunDirError(
            f"output_dir {out}: {existing} is not writable ({error.strerror or error}); choose a "
            "writable output_dir (or --out)"
        )


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # e.g. a parent without search permission: treat as there, then probe it
        return True


def _creatable_in(folder: Path) -> OSError | None:
    """Whether a folder can be made in ``folder``: try it, and remove it again."""
    try:
        probe = tempfile.mkdtemp(prefix=".dynamics-write-check-", dir=folder)
    except OSError as err:
        return err
    os.rmdir(probe)
    return None


# --- the model ------------------------------------------------------------------------------


def _looks_like_path(name: str) -> bool:
    # A hub id is 'name' or 'org/name'; anything else can only be meant as a folder.
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _not_found(field: str, name: str, what: str, err: BaseException) -> RunSetupError:
    """``field``'s ``name`` is no local folder and could not be loaded as a hub id."""
    if offline():
        why = (
            "and as a hub id it is not in the local cache while offline (HF_HUB_OFFLINE is set): "
            "check the path or hub id, or download it once online"
        )
    else:
        why = (
            "and it could not be loaded as a hub id: check the path or hub id (and model.revision)"
        )
    return RunSetupError(
        f"{field} {name!r} is not a local {what} folder, {why} ({one_line(err, 160)})"
    )


def _first_sentence(err: BaseException) -> str:
    return one_line(err).split(". ", 1)[0]


def model_config(model: ModelConfig) -> PretrainedConfig:
    """The transformers config of the model to train, without its weights."""
    if model.init_config is not None:
        init = dict(model.init_config)
        model_type = init.pop("model_type")
        try:
            built: PretrainedConfig = AutoConfig.for_model(model_type, **init)
        except (ValueError, TypeError, KeyError) as err:
            raise RunSetupError(
                f"model.init_config: model_type {model_type!r} cannot be built "
                f"({_first_sentence(err)}); "
                "use a transformers model type, e.g. 'llama', 'qwen2' or 'gpt2'"
            ) from None
        return built
    name = model.name_or_path
    assert name is not None  # validated: exactly one of name_or_path and init_config
    if not Path(name).expanduser().is_dir() and _looks_like_path(name):
        raise RunSetupError(
            f"model.name_or_path {name!r}: no such local folder; give a model folder (with "
            "config.json and the weights) or a hub id such as Qwen/Qwen2.5-3B"
        )
    try:
        loaded: PretrainedConfig = AutoConfig.from_pretrained(
            name, revision=model.revision, trust_remote_code=model.trust_remote_code
        )
    except (OSError, ValueError) as err:
        if Path(name).expanduser().is_dir():
            raise RunSetupError(
                f"model.name_or_path {name!r}: the folder holds no loadable model "
                f"({one_line(err, 160)}); point it at a folder with config.json and the weights"
            ) from None
        raise _not_found("model.name_or_path", name, "model", err) from None
    return loaded


def check_model(model: ModelConfig, sequence_length: int, lora: LoraConfig | None) -> None:
    """The model and tokenizer resolve and fit each other, ``training.sequence_length`` and
    ``lora.target_modules``."""
    built = model_config(model)
    tokenizer_field = "model.tokenizer" if model.tokenizer else "model.name_or_path"
    tokenizer_name = model.tokenizer or model.name_or_path or ""
    if (
        model.tokenizer
        and _looks_like_path(tokenizer_name)
        and not Path(tokenizer_name).expanduser().is_dir()
    ):
        raise RunSetupError(
            f"model.tokenizer {tokenizer_name!r}: no such local folder; give a tokenizer folder "
            "or hub id (or leave it unset to use the model's)"
        )
    try:
        tokenizer = load_tokenizer(model)
    except (OSError, ValueError, ImportError) as err:
        if Path(tokenizer_name).expanduser().is_dir():
            raise RunSetupError(
                f"{tokenizer_field} {tokenizer_name!r}: the folder holds no loadable tokenizer "
                f"({one_line(err, 160)}); point it at a tokenizer folder (tokenizer.json or the "
                "tokenizer's own files)"
            ) from None
        raise _not_found(tokenizer_field, tokenizer_name, "tokenizer", err) from None
    text_config = built.get_text_config() if hasattr(built, "get_text_config") else built
    vocab = getattr(text_config, "vocab_size", None)
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise RunSetupError(
            f"the tokenizer ({tokenizer_field}) has {len(tokenizer)} tokens but the model's "
            "vocab_size is "
            f"{vocab}: use the model's own tokenizer, or a larger vocab_size in model.init_config"
        )
    positions = getattr(text_config, "max_position_embeddings", None) or getattr(
        text_config, "n_positions", None
    )
    length = sequence_length
    if isinstance(positions, int) and length > positions:
        raise RunSetupError(
            f"training.sequence_length={length} exceeds the model's "
            f"max_position_embeddings={positions}: positions past it were never trained (or have "
            "no embedding at all); lower training.sequence_length"
        )
    if lora is not None and not isinstance(lora.target_modules, str):
        _check_lora_targets(built, list(lora.target_modules), model.trust_remote_code)


def _check_lora_targets(
    built: PretrainedConfig, targets: list[str], trust_remote_code: bool
) -> None:
    """Every name in lora.target_modules must end a module path of the model (PEFT's rule),
    checked on a meta-device copy: no weights are allocated or read."""
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(built, trust_remote_code=trust_remote_code)
    except Exception as err:  # a model the check cannot build is left to the real load
        logger.debug("lora.target_modules not checked: no meta-device copy of the model (%s)", err)
        return
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        linear = sorted(
            {
                n.rsplit(".", 1)[-1]
                for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear)
            }
            - {"lm_head"}
        )
        raise RunSetupError(
            "lora.target_modules: the model has no module named "
            f"{', '.join(repr(t) for t in missing)}; "
            f"its linear layers are {', '.join(linear[:12])} (or use 'all-linear')"
        )


# --- precision ------------------------------------------------------------------------------


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def check_quantization(model: ModelConfig, lora: LoraConfig | None) -> None:
    """``model.quantization`` freezes the base weights in bitsandbytes' 4-bit or 8-bit
    layers: only a LoRA adapter can be trained on them, each process holds its own copy (no
    sharding), and the layers compute on a CUDA GPU with the bitsandbytes package."""
    quantization = model.quantization
    if quantization is None:
        return
    if lora is None:
        raise RunSetupError(
            f"model.quantization (bits: {quantization.bits}) with lora: null: quantized weights "
            "cannot be fine-tuned in full; set lora to train an adapter on them (QLoRA), or "
            "remove model.quantization"
        )
    launch = sharded_launch()
    if launch is not None:
        raise RunSetupError(
            f"model.quantization under {launch}: a quantized model is not sharded; launch with "
            "torchrun "
            "(each process holds the quantized model and its adapter), or remove model.quantization"
        )
    if not _cuda_available():
        raise RunSetupError(
            "model.quantization needs a CUDA GPU and bitsandbytes; remove it to train in full "
            "precision on this machine"
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise RunSetupError(
            "model.quantization needs the bitsandbytes package, which is not installed: pip "
            "install 'dynamics[qlora]' (or bitsandbytes), or remove model.quantization to train "
            "in full precision"
        )


def _loaded_dtype(model: ModelConfig, loaded_dtype: torch.dtype | None) -> torch.dtype:
    return loaded_dtype if loaded_dtype is not None else resolve_dtype(model.dtype)


# attn_implementation -> the package its kernels come from.
FLASH_PACKAGES = {
    "flash_attention_2": ("flash_attn", "flash-attn"),
    "flash_attention_3": ("flash_attn_interface", "flash-attn-3"),
}


def check_attention(model: ModelConfig) -> None:
    """FlashAttention kernels need a CUDA GPU and their package."""
    chosen = model.attn_implementation
    if chosen not in FLASH_PACKAGES:
        return
    module, package = FLASH_PACKAGES[chosen]
    if not torch.cuda.is_available():
        raise RunSetupError(
            f"model.attn_implementation {chosen} needs a CUDA GPU, and none is visible; use sdpa "
            "(or leave it unset)"
        )
    if importlib.util.find_spec(module) is None:
        raise RunSetupError(
            f"model.attn_implementation {chosen} needs the {package} package: pip install "
            f"{package}, or use sdpa"
        )


def check_precision(
    model: ModelConfig,
    lora: LoraConfig | None,
    mixed_precision: str,
    loaded_dtype: torch.dtype | None = None,
) -> None:
    """Full fine-tuning of float16 weights under fp16 mixed precision
    (``training.mixed_precision``) cannot step: the fp16 loss scaler refuses to unscale
    float16 gradients."""
    dtype = _loaded_dtype(model, loaded_dtype)
    if lora is None and mixed_precision == "fp16" and dtype == torch.float16:
        raise RunSetupError(
            "full fine-tuning (lora: null) of float16 weights with training.mixed_precision fp16 "
            "cannot step: the fp16 loss scaler does not unscale float16 gradients; set "
            "model.dtype: float32 (fp32 master weights), or train a LoRA adapter"
        )


def precision_warnings(
    model: ModelConfig,
    lora: LoraConfig | None,
    mixed_precision: str,
    loaded_dtype: torch.dtype | None = None,
) -> list[str]:
    """The warning of full fine-tuning under mixed precision when the weights do not load in
    float32. accelerate's mixed precision only autocasts the forward pass: it keeps no fp32
    master copy, so AdamW updates the weights (and keeps its moments) in the dtype they were
    loaded in, ``model.dtype`` resolved by ``load_causal_lm`` ('auto' is bfloat16 on a GPU
    with bf16 support, float32 elsewhere). ``loaded_dtype`` overrides that resolution, to
    check a GPU machine's case anywhere. LoRA adapters are created in float32 by PEFT
    whatever the base weights' dtype, so they are never warned about."""
    precision = mixed_precision
    if lora is not None or precision == "no":
        return []
    dtype = _loaded_dtype(model, loaded_dtype)
    if dtype in (torch.float32, torch.float64):
        return []
    name = str(dtype).removeprefix("torch.")
    how = (
        "model.dtype 'auto' picks bfloat16 on a GPU with bf16 support"
        if model.dtype == "auto"
        else f"model.dtype {model.dtype}"
    )
    return [
        f"full fine-tuning (lora: null) with training.mixed_precision {precision}: master weights "
        f"stay fp32 only if the model is loaded in fp32, and here it is loaded in {name} ({how}), "
        f"so the optimizer updates {name} weights and small updates round away; set model.dtype: "
        "float32 for fp32 master weights"
    ]
