"""Building the model, optimizer and LR schedule of a fine-tuning run.

The paper fine-tunes with LoRA (rank 32, no warmup, constant LR; section 4.2 and appendix
E) but nothing in the method depends on it, so full fine-tuning is the same code with
``lora=None``. The optimizer only ever sees trainable parameters, which is also what a
probe snapshots and restores.

QLoRA (``model.quantization``) loads the base weights quantized by bitsandbytes, frozen,
and trains a LoRA adapter on them: the adapter is still all that is trainable, so probes
move only the adapter and its optimizer state, as with LoRA on full-precision weights.
"""

from __future__ import annotations

import os
from typing import Any

import peft
import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    get_scheduler,
)
from transformers.loss.loss_utils import fixed_cross_entropy

from dynamics.engine.config import LoraConfig, ModelConfig, OptimizerConfig, QuantizationConfig

_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def load_causal_lm(config: ModelConfig) -> PreTrainedModel:
    """The base model: loaded from the hub / a folder, or randomly initialised from
    ``config.init_config`` (tests and the offline demo). A float64 model also computes its
    loss in float64 (``float64_causal_lm_loss``)."""
    model = _load_causal_lm(config)
    if resolve_dtype(config.dtype) == torch.float64:
        model.loss_function = float64_causal_lm_loss
    return model


def float64_causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int,
    num_items_in_batch: torch.Tensor | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' causal-LM loss (``ForCausalLMLoss``) without its cast of the logits to
    float32, so that float64 logits give a float64 loss: a float32 reduction over the
    vocabulary rounds differently with the CPU's vector instructions."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return fixed_cross_entropy(
        logits.reshape(-1, vocab_size),
        shift_labels.reshape(-1).to(logits.device),
        num_items_in_batch,
        ignore_index,
        **kwargs,
    )


def _load_causal_lm(config: ModelConfig) -> PreTrainedModel:
    dtype = resolve_dtype(config.dtype)
    if config.init_config is not None:
        init = dict(config.init_config)
        model_config = AutoConfig.for_model(init.pop("model_type"), **init)
        model: PreTrainedModel = AutoModelForCausalLM.from_config(
            model_config,
            dtype=dtype,
            trust_remote_code=config.trust_remote_code,
            attn_implementation=config.attn_implementation,
        )
        return model
    assert config.name_or_path is not None  # the config validates that exactly one source is set
    quantized: dict[str, Any] = {}
    if config.quantization is not None:
        # bitsandbytes layers live on one GPU: each process loads its whole (quantized) copy
        # onto its own device, which is also where accelerate expects a k-bit model to be.
        quantized = {
            "quantization_config": bnb_config(config.quantization),
            "device_map": {"": int(os.environ.get("LOCAL_RANK", "0"))},
        }
    return AutoModelForCausalLM.from_pretrained(
        config.name_or_path,
        revision=config.revision,
        dtype=dtype,
        trust_remote_code=config.trust_remote_code,
        attn_implementation=config.attn_implementation,
        **quantized,
    )


def bnb_config(quantization: QuantizationConfig) -> BitsAndBytesConfig:
    """transformers' bitsandbytes settings for ``model.quantization``: QLoRA's 4-bit NF4 with
    double quantization (the quantization constants quantized again) and bfloat16 compute,
    or LLM.int8(). Building it needs neither bitsandbytes nor a GPU; loading with it needs both."""
    if quantization.bits == 4:
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def is_quantized(model: nn.Module) -> bool:
    """Whether ``model`` was loaded with bitsandbytes 4-bit or 8-bit weights."""
    return bool(
        getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
    )


def resolve_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``model.dtype``; ``auto`` is bfloat16 on a GPU that computes in
    it natively, float32 elsewhere."""
    if name != "auto":
        return _DTYPES[name]
    # bf16 weights halve memory where the hardware computes in bf16 natively; CPUs and
    # older GPUs would emulate it slowly, so they keep float32.
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def prepare_model(
    model: PreTrainedModel, lora: LoraConfig | None, gradient_checkpointing: bool = False
) -> nn.Module:
    """Wrap ``model`` with a LoRA adapter (``lora`` given) or leave every weight trainable
    (``lora=None``, full fine-tuning). The base model is modified in place by PEFT. A model
    loaded quantized (``model.quantization``) is first prepared for k-bit training: every
    base weight frozen, the unquantized ones (norms, embeddings) cast to float32."""
    quantized = is_quantized(model)
    if quantized and lora is None:
        raise ValueError(
            "the model is loaded quantized (model.quantization), so its weights cannot be "
            "trained: set lora to train an adapter on them, "
            "or remove model.quantization for full fine-tuning"
        )
    if gradient_checkpointing:
        # Non-reentrant checkpointing lets gradients reach LoRA weights even though the
        # frozen embedding output does not require grad, and it replays the saved RNG
        # state, so dropout masks (and hence probes) stay reproducible.
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
        model.config.use_cache = False
    if lora is None:
        model.requires_grad_(True)
        return model
    if quantized:
        # Checkpointing, when asked for, is the non-reentrant kind enabled above, which needs
        # no input gradients; PEFT's own (reentrant by default) is left off.
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    target_modules = (
        lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    )
    adapter = peft.LoraConfig(
        r=lora.rank,
        # peft annotates an int, but only ever uses alpha / r as a float scale.
        lora_alpha=lora.alpha,  # type: ignore[arg-type]
        lora_dropout=lora.dropout,
        target_modules=target_modules,
        task_type="CAUSAL_LM",
    )
    peft_model: nn.Module = peft.get_peft_model(model, adapter)
    return peft_model


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters the optimizer updates, in ``model.parameters()`` order (tied weights once)."""
    return [p for p in model.parameters() if p.requires_grad]


def build_optimizer(parameters: list[nn.Parameter], config: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters only (frozen LoRA base weights get no state)."""
    if not parameters:
        raise ValueError("the model has no trainable parameters; check lora.target_modules")
    return torch.optim.AdamW(
        parameters,
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        weight_decay=config.weight_decay,
    )


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, config: OptimizerConfig, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """The LR schedule over ``total_steps`` optimizer steps, stepped once per optimizer step.

    ``constant`` (the paper's choice) keeps ``config.lr``; ``linear`` and ``cosine`` decay to
    0 at ``total_steps``; all three warm up linearly over ``config.warmup_steps``.
    """
    name: str = config.lr_schedule
    if name == "constant" and config.warmup_steps > 0:
        name = "constant_with_warmup"
    scheduler: torch.optim.lr_scheduler.LRScheduler = get_scheduler(
        name, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=total_steps
    )
    return scheduler


def load_tokenizer(model: ModelConfig) -> PreTrainedTokenizerBase:
    """The run's tokenizer: ``model.tokenizer``, or the model's own."""
    name = model.tokenizer or model.name_or_path
    assert name is not None  # validated: init_config models name a tokenizer
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
        name, revision=model.revision, trust_remote_code=model.trust_remote_code
    )
    return tokenizer
