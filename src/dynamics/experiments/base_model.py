"""The demo's base model: a tiny byte-level Llama pretrained offline on the general domains.

Public API:

- ``ensure_base_model(cache_dir=None, *, quick=False, spec=None, progress=True,
  pretrain=False) -> Path``: the folder of a pretrained base model, built on first use and
  reused afterwards. The default build is installed from the weights shipped with the
  package (``SHIPPED_DIR``: seconds); ``pretrain=True``, or any other spec, pretrains here.
  ``AutoModelForCausalLM.from_pretrained(folder)`` and
  ``AutoTokenizer.from_pretrained(folder)`` load it offline; ``domain_paths(folder)`` are
  the offline domains' JSON-lines files (in ``folder / "domains"``) and ``folder /
  "pretraining.json"`` holds what pretraining measured.
- ``BaseModelSpec`` (``DEFAULT_SPEC``, ``QUICK_SPEC``): everything the model depends on;
  ``spec.cache_key()`` names its cache folder.
- ``byte_tokenizer()``: the byte-level tokenizer with a ChatML chat template.
- ``pretraining_held_out(config, name, num_rows)``: the ``code``/``prose`` rows pretraining
  did not see, for measuring forgetting on unseen text.
- ``default_cache_dir()``: ``$XDG_CACHE_HOME/dynamics`` or ``~/.cache/dynamics``.
- ``base_model_summary(folder) -> str``: which base model a folder holds (the SHA-256 of its
  weights, and whether they are the shipped ones) and what pretraining measured, for
  reports: two CPUs whose float32 sums round differently (other vector instructions,
  another number of threads) pretrain different base models from the same data and seed.

Why ship the weights: the data are the same everywhere (a pinned corpus and seeded
generators), but pretraining is 1,200 float32 AdamW steps, and the last digits that
another CPU rounds differently grow over them into another model, whose fine-tuning
results differ by many points. The shipped weights are the default build as pretrained on
one 2-core CPU (``pretraining.json`` beside them says what it measured); every machine
that installs them starts from the same model, in seconds instead of minutes.

Why pretrain at all: the demo needs forgetting to be real. A random-init model has nothing
to forget, so the base model first learns the general domains (stdlib ``code`` and
``prose``, and the quiz ``facts``) and the demo then fine-tunes it on domains it has not
seen (``arithmetic``, ``toolcall``) under constraints on what it knows.

Why pretraining has its own loop and not the engine's: the engine's optimizer and schedule
(one AdamW weight decay for every parameter, norms included; transformers' schedules, which
warm up from LR 0 and decay to 0) and its mixture sampler would each change this model, and
although ``engine.steps.OptimizerSteps`` driven by this loop's optimizer, schedule and batch
order (``engine.training_state.adopted_training_state``) gives the same weights bit for bit
(checked on ``QUICK_SPEC``), it steps through an accelerate ``Accelerator``, whose
process-wide state the demo's runs in the same process would then inherit (its device and
mixed precision: a bf16 run refuses to start), while the engine's evaluation averages
per-batch means where ``pretraining.json`` holds token-weighted ones.

The default build (``DEFAULT_SPEC``; measured on a 2-core CPU, torch 2.13, Python 3.11):
886,912 parameters (hidden 128, 4 layers, 4 heads, MLP 384, 264-token vocabulary, tied
embeddings); 1,200 AdamW steps of 16 packed 256-byte sequences (4.9M tokens, ~2.4 passes
over 8,004 blocks: code and prose, 2.0 MB, and 16 shuffled copies of the facts, 34% of
the blocks); 270 s from nothing to the saved folder (data 1 s, measurement ~10 s).
Losses in nats per byte: held-out code 1.163, held-out prose 1.365, and on the unlearned
instruction domains' responses arithmetic 2.638, toolcall 2.585; quiz accuracy 0.875
(chance 0.25).

Pretraining learning rate, chosen as the paper chooses its fine-tuning LR (appendix G: a
sweep, best validation loss): the same 1,200-step build at each peak LR (warmup 50 steps,
cosine to 10% of the peak), held-out losses and quiz accuracy::

    peak LR   code    prose   quiz
    1e-3      1.191   1.408   0.694
    2e-3      1.160   1.371   0.778
    3e-3      1.163   1.365   0.875   <- chosen: lowest code + prose, best quiz
    5e-3      1.194   1.402   0.826
    1e-2      1.405   1.621   0.326

Fine-tuning learning rate for the demo (a sweep on the general data alone: the 3e-3 base
model fine-tuned on the training rows of code and prose, 200 steps of 8 x 256 bytes,
constant LR, no warmup, AdamW as the engine builds it). Held-out code / prose loss after
25 and 200 steps (base 1.163 / 1.365) and quiz accuracy after 200 steps (base 0.875)::

    full fine-tuning   step 25          step 200         quiz
    1e-4               1.154 / 1.360    1.141 / 1.341    0.868
    3e-4               1.166 / 1.376    1.146 / 1.348    0.833
    1e-3               1.246 / 1.479    1.206 / 1.413    0.431
    3e-3               1.452 / 1.726    1.340 / 1.568    0.250
    LoRA r=8, alpha=16
    1e-4               1.160 / 1.364    1.153 / 1.356    0.840
    3e-4               1.157 / 1.363    1.149 / 1.349    0.847
    1e-3               1.155 / 1.361    1.146 / 1.347    0.875
    3e-3               1.162 / 1.369    1.151 / 1.354    0.792

Pretraining ended at LR 3e-4. Full fine-tuning at 1e-4 keeps both general losses below the
base model's at every step; at 3e-4 they first rise above it (steps 25-50) and only then
fall below, the transient that short probes extrapolate; at 1e-3 and above they stay above
it, so no mixture could be feasible. With LoRA r=8 every LR up to 1e-3 keeps them below.
Recommended: 1e-4 for full fine-tuning, 1e-3 for LoRA r=8.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tqdm.auto import tqdm
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from dynamics.data.formatting import (
    IGNORE_INDEX,
    ChoiceExample,
    LMExample,
    build_examples,
    pad_token_id,
)
from dynamics.data.loading import DataSource
from dynamics.data.offline import (
    DATA_VERSION,
    DOMAIN_FORMATS,
    GENERAL_DOMAINS,
    STDLIB_CORPUS_SHA256,
    DomainSizes,
    write_offline_domains,
)

logger = logging.getLogger(__name__)

EOS = "<|endoftext|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOS, PAD, IM_START, IM_END)
"""Ids 256-259, after the 256 bytes."""
ANSWER_LETTERS = "ABCD"
"""" A".." D" are single tokens, ids 260-263 (``byte_tokenizer`` says why)."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, the template of Qwen and SmolLM2: the prompt of a turn is a prefix of the whole
conversation, which the data layer's response-only loss mask relies on."""

BUILD_VERSION = 1
"""Bumped whenever the tokenizer or the pretraining code changes, so caches are rebuilt."""
DOMAINS_DIR = "domains"
WEIGHTS_FILE = "model.safetensors"
SHIPPED_DIR = Path(__file__).resolve().parent / "demo_base_model"
"""The default build's weights and pretraining report, as pretrained on one machine."""
SHIPPED_RECIPE = "f2f22b0aacd296e9"
"""``DEFAULT_SPEC.recipe_key()`` of the shipped weights: they are installed only for it."""
SHIPPED_WEIGHTS_SHA256 = "53e0484a841c549a166941307b7290aadb9d043a88f66184c49999e9d8d91982"
REPORT_FILE = "pretraining.json"


# ---------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------


def _byte_characters() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (what ``ByteLevel`` maps to)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    characters = {b: chr(b) for b in printable}
    unprintable = [b for b in range(256) if b not in characters]
    characters.update({b: chr(256 + k) for k, b in enumerate(unprintable)})
    return characters


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: token id = byte value for the 256 bytes, the special tokens
    ``SPECIAL_TOKENS`` (ids 256-259), and one merge per answer letter, " A" to " D" (ids
    260-263); no BOS; ChatML chat template. Every text round-trips exactly.

    Why the four merges: the data layer scores a multiple-choice prompt ending in "Answer:"
    by the next token's logits for the *last* token of " A".." D". With bytes alone that
    next token is always the space, and the letter comes one position later; with " A" a
    single token, the model's next token after "Answer:" is the answer, as with the
    SentencePiece and BPE tokenizers of real models.
    """
    characters = _byte_characters()
    vocab = {character: b for b, character in characters.items()}
    vocab.update({token: 256 + k for k, token in enumerate(SPECIAL_TOKENS)})
    space = characters[ord(" ")]
    merges = [(space, letter) for letter in ANSWER_LETTERS]
    vocab.update({space + letter: 260 + k for k, letter in enumerate(ANSWER_LETTERS)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
    )
    wrapped.chat_template = CHATML_TEMPLATE
    return wrapped


# ---------------------------------------------------------------------------------------
# The spec and its cache key
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PretrainingConfig:
    """The pretraining loop: AdamW, linear warmup then cosine decay to a floor."""

    steps: int = 1200
    """Optimizer steps."""
    batch_size: int = 16
    """Packed sequences per step."""
    sequence_length: int = 256
    """Tokens (bytes) per packed sequence."""
    lr: float = 3e-3
    """Peak learning rate: the best of a sweep over 1e-3..1e-2 (module docstring)."""
    final_lr_ratio: float = 0.1
    """The cosine ends at ``final_lr_ratio * lr``."""
    warmup_steps: int = 50
    """Linear warmup from 0 to ``lr``."""
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    facts_repeat: int = 16
    """Copies of the ``facts`` rows in the pool, each packed in a fresh order. The facts
    are 2% of the general text; at 2 copies the quiz stayed near chance, at 16 (a third of
    the blocks, each fact seen ~38 times) the base model answers 0.875 of it."""
    validation_fraction: float = 0.05
    """Rows of ``code`` and ``prose`` held out of pretraining to measure its losses
    (``facts`` keeps every row: the quiz measures it)."""
    seed: int = 0
    """Seed of the initialisation, the held-out rows and the batch order."""


@dataclass(frozen=True)
class ModelShape:
    """The shape of the Llama-style decoder (``LlamaConfig`` fields; embeddings are tied)."""

    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 256
    """The longest sequence, in tokens (bytes)."""


@dataclass(frozen=True)
class BaseModelSpec:
    """Everything the cached base model depends on (with the Python and torch versions)."""

    model: ModelShape = field(default_factory=ModelShape)
    pretraining: PretrainingConfig = field(default_factory=PretrainingConfig)
    data_seed: int = 0
    """Seed of ``write_offline_domains``."""
    sizes: DomainSizes = field(default_factory=DomainSizes)

    def cache_key(self) -> str:
        """``base-`` and 16 hex digits of a hash of the recipe and the torch version: the
        folder of a base model pretrained here."""
        return "base-" + _short_hash({**self._recipe(), "torch": torch.__version__})

    def recipe_key(self) -> str:
        """16 hex digits of a hash of the spec, the data and build versions and the pinned
        corpus's digest: what the data and the model to pretrain are made from."""
        return _short_hash(self._recipe())

    def _recipe(self) -> dict[str, Any]:
        return {
            "spec": asdict(self),
            "data_version": DATA_VERSION,
            "build_version": BUILD_VERSION,
            "corpus": STDLIB_CORPUS_SHA256,
        }

    def llama_config(self, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
        """The model's config, with the tokenizer's vocabulary size and special ids."""
        return LlamaConfig(
            vocab_size=len(tokenizer),
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=True,
            **asdict(self.model),
        )


def _short_hash(content: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


DEFAULT_SPEC = BaseModelSpec()
QUICK_SPEC = BaseModelSpec(
    model=ModelShape(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,  # the demo fine-tunes on 256-token sequences
    ),
    pretraining=PretrainingConfig(steps=4, batch_size=4, sequence_length=64, warmup_steps=1),
    sizes=DomainSizes(code=24, prose=24, arithmetic=16, toolcall=16, quiz=12),
)
"""A seconds-long build for tests and smoke runs: the same pipeline, nothing learned."""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dynamics``, or ``~/.cache/dynamics``."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "dynamics"


def domain_paths(folder: str | os.PathLike[str]) -> dict[str, Path]:
    """The offline domains' files of a base-model folder, by domain name."""
    return {name: Path(folder) / DOMAINS_DIR / f"{name}.jsonl" for name in DOMAIN_FORMATS}


def ensure_base_model(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    quick: bool = False,
    spec: BaseModelSpec | None = None,
    progress: bool = True,
    pretrain: bool = False,
) -> Path:
    """The folder of the base model under ``cache_dir``, built first if absent. ``quick``
    selects ``QUICK_SPEC`` (unless ``spec`` is given).

    The default build is installed from the shipped weights into ``shipped-<16 hex digits
    of their SHA-256>``; ``pretrain``, or a spec the shipped weights were not made for,
    pretrains here into ``spec.cache_key()``. The folder is built in a temporary sibling and
    renamed into place, so it is either complete or absent; if another process finished it
    first, its folder is kept.
    """
    spec = spec if spec is not None else (QUICK_SPEC if quick else DEFAULT_SPEC)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    shipped = not pretrain and spec.recipe_key() == SHIPPED_RECIPE
    folder = root / (f"shipped-{SHIPPED_WEIGHTS_SHA256[:16]}" if shipped else spec.cache_key())
    if folder.is_dir():
        return folder
    if not shipped:
        logger.info(
            "pretraining the demo's base model in %s (once; minutes on a laptop CPU)", folder
        )
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{folder.name}."))
    try:
        if shipped:
            install_shipped_base_model(tmp, spec)
        else:
            build_base_model(tmp, spec, progress=progress)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not folder.is_dir():
                raise
            shutil.rmtree(tmp)  # another process built it meanwhile; theirs is as good
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def install_shipped_base_model(folder: Path, spec: BaseModelSpec) -> None:
    """Write the domains, the tokenizer and the model's config into ``folder``, and copy the
    shipped weights and pretraining report beside them, checked against their SHA-256."""
    weights = SHIPPED_DIR / WEIGHTS_FILE
    digest = weights_sha256(weights) if weights.is_file() else "missing"
    if digest != SHIPPED_WEIGHTS_SHA256:
        raise ValueError(
            f"the shipped base model {weights} is damaged (SHA-256 {digest[:16]}, "
            f"expected {SHIPPED_WEIGHTS_SHA256[:16]}): reinstall dynamics, or pretrain the base "
            "model on this machine (dynamics demo --pretrain)"
        )
    write_offline_domains(folder / DOMAINS_DIR, spec.data_seed, spec.sizes)
    tokenizer = byte_tokenizer()
    config = spec.llama_config(tokenizer)
    config.architectures, config.dtype = (
        ["LlamaForCausalLM"],
        torch.float32,
    )  # as save_pretrained writes them
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    shutil.copyfile(weights, folder / WEIGHTS_FILE)
    shutil.copyfile(SHIPPED_DIR / REPORT_FILE, folder / REPORT_FILE)


# ---------------------------------------------------------------------------------------
# Building: data, pretraining, measurement
# ---------------------------------------------------------------------------------------


def weights_sha256(path: Path) -> str:
    """The SHA-256 of a weights file, in hex: what names a base model."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def base_model_summary(folder: Path) -> str:
    """One line naming the base model in ``folder`` by the SHA-256 of its weights file (and
    whether they are the shipped ones), with the quiz accuracy and held-out losses
    pretraining measured (``pretraining.json``)."""
    digest = weights_sha256(folder / WEIGHTS_FILE)
    report = json.loads((folder / REPORT_FILE).read_text())
    losses = report["losses"]
    origin = (
        "shipped with dynamics"
        if digest == SHIPPED_WEIGHTS_SHA256
        else "pretrained on this machine"
    )
    return (
        f"weights SHA-256 {digest[:16]} ({origin}), quiz accuracy {report['quiz_accuracy']:.3f}, "
        f"held-out code / prose {losses['code']:.3f} / {losses['prose']:.3f} nats"
    )


def build_base_model(folder: Path, spec: BaseModelSpec, *, progress: bool = True) -> dict:
    """Write the domains, pretrain, measure and save into ``folder``; return the report."""
    start = time.perf_counter()
    if not progress:
        import datasets

        datasets.disable_progress_bars()  # its per-domain tokenizing bars
    config = spec.pretraining
    paths = write_offline_domains(folder / DOMAINS_DIR, spec.data_seed, spec.sizes)
    tokenizer = byte_tokenizer()
    rows = {name: _read_jsonl(path) for name, path in paths.items()}
    train_blocks, validation = _pretraining_data(rows, tokenizer, config)

    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(spec.llama_config(tokenizer))
    curve = pretrain(model, train_blocks, config, progress=progress)
    losses, quiz_accuracy = measure_base_model(model, tokenizer, rows, validation, config)
    report = {
        "cache_key": spec.cache_key(),
        "spec": asdict(spec),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens": config.steps * config.batch_size * config.sequence_length,
        "losses": losses,
        "quiz_accuracy": quiz_accuracy,
        "loss_curve": curve,
        "seconds": round(time.perf_counter() - start, 1),
    }
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def _held_out(num_rows: int, fraction: float, seed: int) -> set[int]:
    count = math.ceil(fraction * num_rows)
    return set(np.random.default_rng(seed).permutation(num_rows)[:count].tolist())


def pretraining_held_out(config: PretrainingConfig, name: str, num_rows: int) -> set[int]:
    """Indices of the rows of general domain ``name`` (``code`` or ``prose``, ``num_rows``
    rows) that pretraining held out: a seeded ``validation_fraction`` of them, rounded up.
    A fine-tuning run can measure forgetting on exactly the text the model never saw."""
    if name not in GENERAL_DOMAINS or name == "facts":
        raise ValueError(f"{name!r}: pretraining holds out rows of code and prose only")
    seed = config.seed + GENERAL_DOMAINS.index(name)
    return _held_out(num_rows, config.validation_fraction, seed)


def _examples(
    rows: list[dict[str, Any]],
    name: str,
    tokenizer: PreTrainedTokenizerBase,
    sequence_length: int,
    packing: bool,
) -> list[LMExample] | list[ChoiceExample]:
    source = DataSource(path=f"{name}.jsonl", format=DOMAIN_FORMATS[name])
    return build_examples(
        datasets.Dataset.from_list(rows),
        tokenizer,
        source,
        sequence_length=sequence_length,
        packing=packing,
    )


def _blocks(
    rows: list[dict[str, Any]], name: str, tokenizer: PreTrainedTokenizerBase, length: int
) -> list[np.ndarray]:
    """The rows packed into blocks of ``length`` tokens; the last, partial block is dropped."""
    packed = _examples(rows, name, tokenizer, length, packing=True)
    return [example.input_ids for example in packed if len(example) == length]


def _pretraining_data(
    rows: dict[str, list[dict[str, Any]]],
    tokenizer: PreTrainedTokenizerBase,
    config: PretrainingConfig,
) -> tuple[torch.Tensor, dict[str, list[LMExample]]]:
    """Packed full-length training blocks ``(n, sequence_length)`` of the general domains,
    and the held-out ``code``/``prose`` rows as packed validation examples."""
    blocks: list[np.ndarray] = []
    validation: dict[str, list[LMExample]] = {}
    for name in GENERAL_DOMAINS:
        if name == "facts":
            # Each copy packs the rows in a fresh order, so a fact's neighbours change.
            rng = np.random.default_rng(config.seed)
            for _ in range(config.facts_repeat):
                shuffled = [rows[name][i] for i in rng.permutation(len(rows[name]))]
                blocks.extend(_blocks(shuffled, name, tokenizer, config.sequence_length))
            continue
        held_out = pretraining_held_out(config, name, len(rows[name]))
        train_rows = [r for i, r in enumerate(rows[name]) if i not in held_out]
        blocks.extend(_blocks(train_rows, name, tokenizer, config.sequence_length))
        validation_rows = [rows[name][i] for i in sorted(held_out)]
        validation[name] = _examples(  # type: ignore[assignment]
            validation_rows, name, tokenizer, config.sequence_length, packing=True
        )
    return torch.from_numpy(np.stack(blocks).astype(np.int64)), validation


def pretraining_lr(step: int, config: PretrainingConfig) -> float:
    """The learning rate of optimizer step ``step`` (0-based): linear warmup over
    ``warmup_steps``, then a half cosine from ``lr`` to ``final_lr_ratio * lr``."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    floor = config.final_lr_ratio
    return config.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def pretrain(
    model: PreTrainedModel,
    blocks: torch.Tensor,
    config: PretrainingConfig,
    *,
    progress: bool = True,
) -> list[tuple[int, float]]:
    """Train ``model`` on random batches of ``blocks`` (a fresh seeded order each epoch);
    return ``(step, mean training loss)`` every 50 steps and at the end."""
    generator = torch.Generator().manual_seed(config.seed)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]  # norms: decaying them hurts
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=(0.9, 0.95),
    )
    model.train()
    order = torch.randperm(len(blocks), generator=generator)
    cursor = 0
    curve: list[tuple[int, float]] = []
    window: list[float] = []
    bar = tqdm(range(config.steps), desc="pretraining the base model", disable=not progress)
    for step in bar:
        if cursor + config.batch_size > len(order):
            order, cursor = torch.randperm(len(blocks), generator=generator), 0
        batch = blocks[order[cursor : cursor + config.batch_size]]
        cursor += config.batch_size
        for group in optimizer.param_groups:
            group["lr"] = pretraining_lr(step, config)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        window.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % 50 == 0 or step + 1 == config.steps:
            curve.append((step + 1, round(float(np.mean(window)), 4)))
            window = []
    model.eval()
    return curve


@torch.no_grad()
def mean_loss(model: PreTrainedModel, examples: Sequence[LMExample], batch_size: int = 16) -> float:
    """Token-weighted mean cross-entropy (nats per token) over ``examples``."""
    total, count = 0.0, 0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        length = max(len(e) for e in chunk)
        input_ids = torch.zeros(len(chunk), length, dtype=torch.long)
        labels = torch.full((len(chunk), length), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros(len(chunk), length, dtype=torch.long)
        for row, example in enumerate(chunk):
            input_ids[row, : len(example)] = torch.from_numpy(example.input_ids)
            labels[row, : len(example)] = torch.from_numpy(example.labels)
            mask[row, : len(example)] = 1
        logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1]
        targets = labels[:, 1:]
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            targets.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        total += float(losses)
        count += int((targets != IGNORE_INDEX).sum())
    return total / max(count, 1)


@torch.no_grad()
def choice_accuracy(
    model: PreTrainedModel, examples: Sequence[ChoiceExample], pad_id: int, batch_size: int = 32
) -> float:
    """Letter-restricted argmax accuracy (paper appendix M): the share of questions whose
    answer letter has the highest next-token logit among the choices' letters."""
    correct = 0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        length = max(len(e) for e in chunk)
        input_ids = torch.full((len(chunk), length), pad_id, dtype=torch.long)
        mask = torch.zeros(len(chunk), length, dtype=torch.long)
        for row, example in enumerate(chunk):
            input_ids[row, : len(example)] = torch.from_numpy(example.input_ids)
            mask[row, : len(example)] = 1
        logits = model(input_ids=input_ids, attention_mask=mask).logits
        for row, example in enumerate(chunk):
            scores = logits[row, len(example) - 1, torch.from_numpy(example.choice_token_ids)]
            correct += int(int(scores.argmax()) == example.answer_index)
    return correct / max(len(examples), 1)


def measure_base_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: dict[str, list[dict[str, Any]]],
    validation: dict[str, list[LMExample]],
    config: PretrainingConfig,
    sample: int = 200,
) -> tuple[dict[str, float], float]:
    """Losses (nats per token) on the held-out ``code``/``prose`` rows and on the first
    ``sample`` rows of the unlearned instruction domains (response tokens only), and the
    quiz's accuracy (share of questions answered right; chance is 0.25)."""
    losses = {name: round(mean_loss(model, examples), 4) for name, examples in validation.items()}
    for name in ("arithmetic", "toolcall"):
        examples = _examples(rows[name][:sample], name, tokenizer, config.sequence_length, False)
        losses[name] = round(mean_loss(model, examples), 4)  # type: ignore[arg-type]
    quiz = _examples(rows["quiz"], "quiz", tokenizer, config.sequence_length, packing=False)
    accuracy = choice_accuracy(model, quiz, pad_token_id(tokenizer))  # type: ignore[arg-type]
    return losses, round(accuracy, 4)
