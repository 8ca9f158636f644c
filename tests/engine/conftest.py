"""Tiny random-init causal LMs and hand-built batches for the engine tests (no network).

Models have 2 layers, hidden size 32 and a byte-level vocabulary of 260 tokens; a train
step takes a few milliseconds on CPU. The data contract is the one ``HFLearner`` expects
from ``dynamics.data``: right-padded batches of ``input_ids`` / ``attention_mask`` /
``labels``, and multiple-choice batches with ``choice_token_ids`` / ``answer_index``.
"""

from __future__ import annotations

import os

# Before transformers / huggingface_hub read it: nothing here may touch the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from dynamics.engine.config import LoraConfig, OptimizerConfig
from dynamics.engine.learner import HFLearner
from dynamics.engine.model import prepare_model

VOCAB_SIZE = 260
CHOICE_TOKEN_IDS = (65, 66, 67, 68)  # the bytes of "A".."D"
TINY_CONFIGS = {
    "llama": lambda: LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    ),
    "qwen2": lambda: Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    ),
}
MODEL_CLASSES = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM}


def tiny_model(arch: str, seed: int = 0) -> PreTrainedModel:
    """A randomly initialised tiny model; the same seed gives the same weights."""
    torch.manual_seed(seed)
    model: PreTrainedModel = MODEL_CLASSES[arch](TINY_CONFIGS[arch]())
    return model


def lm_batch(
    generator: torch.Generator, tokens: tuple[int, int], batch_size: int = 4, length: int = 12
) -> dict:
    """Right-padded token sequences drawn uniformly from ``range(*tokens)``; every row keeps
    at least half its length, labels are -100 on padding."""
    input_ids = torch.randint(*tokens, (batch_size, length), generator=generator)
    lengths = torch.randint(length // 2, length + 1, (batch_size,), generator=generator)
    attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    input_ids = input_ids * attention_mask  # pad id 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def choice_batch(generator: torch.Generator, batch_size: int = 4, length: int = 10) -> dict:
    """Right-padded multiple-choice prompts with four letter choices and random answers."""
    batch = lm_batch(generator, (70, 256), batch_size, length)
    return {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "choice_token_ids": torch.tensor([CHOICE_TOKEN_IDS] * batch_size),
        "answer_index": torch.randint(0, len(CHOICE_TOKEN_IDS), (batch_size,), generator=generator),
    }


class ListSampler:
    """The sampler contract on fixed batch lists: dataset j with probability w_j (numpy
    Generator), batches of each dataset in a cycle."""

    def __init__(self, datasets: Sequence[Sequence[dict]], seed: int = 0) -> None:
        self.datasets = datasets
        self.rng = np.random.default_rng(seed)
        self.cursors = [0] * len(datasets)
        # Probes read each dataset from the back, so probe batches differ from main ones.
        self.probe_cursors = [0] * len(datasets)

    def probe_batch(self, dataset: int) -> dict:
        batches = self.datasets[dataset]
        batch = batches[-1 - self.probe_cursors[dataset] % len(batches)]
        self.probe_cursors[dataset] += 1
        return batch

    def next_batch(self, weights: np.ndarray) -> tuple[int, dict]:
        j = int(self.rng.choice(len(self.datasets), p=weights))
        batch = self.datasets[j][self.cursors[j] % len(self.datasets[j])]
        self.cursors[j] += 1
        return j, batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "cursors": list(self.cursors),
            "rng": self.rng.bit_generator.state,
            "probe_streams": list(self.probe_cursors),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursors = list(state["cursors"])
        self.probe_cursors = list(state["probe_streams"])
        self.rng.bit_generator.state = state["rng"]


@dataclass(frozen=True)
class Domain:
    name: str
    metric: str
    eval_batches: list[dict] = field(default_factory=list)
    test_batches: list[dict] = field(default_factory=list)


# Two fine-tuning datasets over disjoint token ranges, so training on one moves the
# other's loss differently; evaluation domains mirror them, plus a multiple-choice one.
DATASET_TOKENS = ((1, 130), (130, 256))


def standard_data(
    num_eval_batches: int = 4, seed: int = 0
) -> tuple[list[list[dict]], list[Domain]]:
    generator = torch.Generator().manual_seed(seed)
    datasets = [[lm_batch(generator, tokens) for _ in range(6)] for tokens in DATASET_TOKENS]
    domains = [
        Domain(
            f"domain{j}",
            "loss",
            [lm_batch(generator, tokens) for _ in range(num_eval_batches)],
            [lm_batch(generator, tokens) for _ in range(num_eval_batches)],
        )
        for j, tokens in enumerate(DATASET_TOKENS)
    ]
    domains.append(
        Domain(
            "letters",
            "accuracy",
            [choice_batch(generator) for _ in range(num_eval_batches)],
            [choice_batch(generator) for _ in range(num_eval_batches)],
        )
    )
    return datasets, domains


DEFAULT_LORA = LoraConfig(rank=4, alpha=8.0, dropout=0.1)
# A warmup + linear decay so the LR changes every step and a forgotten scheduler restore
# would show; a large LR so a few steps visibly move a tiny model.
DEFAULT_OPTIMIZER = OptimizerConfig(
    lr=1e-2, lr_schedule="linear", warmup_steps=2, max_grad_norm=1.0
)


@pytest.fixture
def make_learner() -> Callable[..., HFLearner]:
    """Factory for a tiny learner; the same arguments always build the same learner."""

    def build(
        arch: str = "llama",
        lora: LoraConfig | None = DEFAULT_LORA,
        optimizer: OptimizerConfig = DEFAULT_OPTIMIZER,
        datasets: list[list[dict]] | None = None,
        domains: list[Domain] | None = None,
        gradient_accumulation: int = 1,
        gradient_checkpointing: bool = False,
        total_steps: int = 20,
        accelerator: Accelerator | None = None,
    ) -> HFLearner:
        default_datasets, default_domains = standard_data()
        datasets = default_datasets if datasets is None else datasets
        domains = default_domains if domains is None else domains
        model = prepare_model(tiny_model(arch), lora, gradient_checkpointing)
        # LoRA's A matrices are drawn from the global RNG: reseed so that two builds start
        # from the same RNG state as well as the same weights.
        torch.manual_seed(1)
        return HFLearner(
            model,
            ListSampler(datasets),
            [f"dataset{j}" for j in range(len(datasets))],
            domains,
            optimizer,
            total_steps=total_steps,
            gradient_accumulation=gradient_accumulation,
            accelerator=accelerator,
        )

    return build


@pytest.fixture
def bf16_accelerator():
    """An Accelerator with bf16 autocast (CPU autocast here, the GPU path of real runs).
    Accelerate keeps one process-wide state, so it is reset around the test, the way
    accelerate's own tests do."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield Accelerator(mixed_precision="bf16")
    AcceleratorState._reset_state(reset_partial_state=True)
