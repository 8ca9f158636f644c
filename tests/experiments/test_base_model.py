"""The demo's base model: byte tokenizer, pretraining schedule, cached build and its key."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dynamics.data import IGNORE_INDEX, DataSource, build_examples, letter_token_ids
from dynamics.data.offline import DOMAIN_FORMATS, DomainSizes
from dynamics.experiments import base_model
from dynamics.experiments.base_model import (
    DEFAULT_SPEC,
    QUICK_SPEC,
    ModelShape,
    PretrainingConfig,
    byte_tokenizer,
    domain_paths,
    ensure_base_model,
    pretraining_lr,
)
from robustness import nudged_model


def test_byte_tokenizer_round_trips_bytes() -> None:
    tokenizer = byte_tokenizer()
    text = "def f(x):\n\treturn x ≤ 2  # naïve ✓\r\n"
    ids = tokenizer(text)["input_ids"]
    assert ids == list(text.encode("utf-8"))  # id = byte value, no BOS/EOS added
    assert tokenizer.decode(ids) == text
    assert len(tokenizer) == 264
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (256, 257)
    assert tokenizer("<|im_start|>x<|im_end|>")["input_ids"] == [258, ord("x"), 259]


def test_answer_letters_are_single_tokens() -> None:
    tokenizer = byte_tokenizer()
    # The token after "Answer:" is the answer itself, as the data layer scores it.
    assert letter_token_ids(tokenizer, 4) == [260, 261, 262, 263]
    text = "Answer: C, or B. A BAD Example"
    ids = tokenizer(text)["input_ids"]
    assert ids[:8] == [*b"Answer:", 262] and tokenizer.decode(ids) == text


def test_chat_template_masks_the_prompt() -> None:
    tokenizer = byte_tokenizer()
    rows = datasets.Dataset.from_list([{"prompt": "What is 2 + 3?", "response": "5"}])
    source = DataSource(path="arithmetic.jsonl", format="instruction")
    (example,) = build_examples(rows, tokenizer, source, sequence_length=256)
    labelled = example.labels[example.labels != IGNORE_INDEX].tolist()
    assert tokenizer.decode(labelled) == "5<|im_end|>\n"
    assert tokenizer.decode(example.input_ids.tolist()) == (
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n"
    )


def test_pretraining_lr_warms_up_then_decays_to_its_floor() -> None:
    config = PretrainingConfig(steps=100, lr=1e-3, warmup_steps=10, final_lr_ratio=0.1)
    lrs = np.array([pretraining_lr(step, config) for step in range(config.steps + 1)])
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert np.all(np.diff(lrs[:10]) > 0) and np.all(np.diff(lrs[10:]) <= 0)
    assert lrs[-1] == pytest.approx(1e-4)


def test_cache_key_follows_everything_the_model_depends_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = DEFAULT_SPEC.cache_key()
    assert key.startswith("base-") and len(key) == len("base-") + 16
    assert dataclasses.replace(DEFAULT_SPEC).cache_key() == key
    changed = [
        dataclasses.replace(DEFAULT_SPEC, model=ModelShape(hidden_size=64)),
        dataclasses.replace(
            DEFAULT_SPEC, pretraining=dataclasses.replace(DEFAULT_SPEC.pretraining, lr=1e-3)
        ),
        dataclasses.replace(DEFAULT_SPEC, data_seed=1),
        dataclasses.replace(DEFAULT_SPEC, sizes=DomainSizes(arithmetic=10)),
        QUICK_SPEC,
    ]
    keys = {spec.cache_key() for spec in changed}
    assert key not in keys and len(keys) == len(changed)
    assert len({spec.recipe_key() for spec in [DEFAULT_SPEC, *changed]}) == len(changed) + 1
    recipe = DEFAULT_SPEC.recipe_key()
    with monkeypatch.context() as patch:
        # Another torch pretrains here into another folder; the shipped weights still fit.
        patch.setattr(torch, "__version__", "0.0.0")
        assert DEFAULT_SPEC.cache_key() != key and DEFAULT_SPEC.recipe_key() == recipe
    with monkeypatch.context() as patch:
        # Another corpus is another base model; the Python running it is not.
        patch.setattr(base_model, "STDLIB_CORPUS_SHA256", "0" * 64)
        assert DEFAULT_SPEC.cache_key() != key and DEFAULT_SPEC.recipe_key() != recipe
    with monkeypatch.context() as patch:
        patch.setattr(sys, "version_info", (3, 99, 0))
        assert DEFAULT_SPEC.cache_key() == key


def test_quick_base_model_is_built_once_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = ensure_base_model(tmp_path, quick=True, progress=False)
    assert folder == tmp_path / QUICK_SPEC.cache_key()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left over

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.config.hidden_size == QUICK_SPEC.model.hidden_size
    assert tokenizer("hi")["input_ids"] == [104, 105] and tokenizer.chat_template
    assert sorted(domain_paths(folder)) == sorted(DOMAIN_FORMATS)
    assert all(path.is_file() for path in domain_paths(folder).values())
    report = json.loads((folder / base_model.REPORT_FILE).read_text())
    assert set(report["losses"]) == {"code", "prose", "arithmetic", "toolcall"}
    assert 0.0 <= report["quiz_accuracy"] <= 1.0
    assert report["loss_curve"][-1][0] == QUICK_SPEC.pretraining.steps
    # Reports name the base model by its weights: weights one part in a million apart (what
    # two CPUs' pretraining can give) are told apart; what pretraining measured is shown.
    summary = base_model.base_model_summary(folder)
    nudged = base_model.base_model_summary(nudged_model(folder, tmp_path / "nudged", seed=0))
    assert summary.split(",")[0] != nudged.split(",")[0]
    assert summary.split(",", 1)[1] == nudged.split(",", 1)[1]
    assert f"quiz accuracy {report['quiz_accuracy']:.3f}" in summary

    # The second call finds the folder and trains nothing.
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cached base model was rebuilt")

    monkeypatch.setattr(base_model, "build_base_model", fail)
    assert ensure_base_model(tmp_path, quick=True, progress=False) == folder


def test_the_shipped_weights_are_the_default_builds() -> None:
    assert DEFAULT_SPEC.recipe_key() == base_model.SHIPPED_RECIPE, (
        "the default build changed, so the shipped weights are no longer its: pretrain it "
        "(ensure_base_model(pretrain=True)), copy model.safetensors and pretraining.json into "
        "SHIPPED_DIR, and set SHIPPED_RECIPE and SHIPPED_WEIGHTS_SHA256"
    )
    weights = (base_model.SHIPPED_DIR / base_model.WEIGHTS_FILE).read_bytes()
    assert hashlib.sha256(weights).hexdigest() == base_model.SHIPPED_WEIGHTS_SHA256
    report = json.loads((base_model.SHIPPED_DIR / base_model.REPORT_FILE).read_text())
    assert report["spec"] == dataclasses.asdict(DEFAULT_SPEC)


@pytest.mark.slow
def test_the_default_base_model_is_installed_from_the_shipped_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("the default base model was pretrained")

    monkeypatch.setattr(base_model, "build_base_model", fail)
    folder = ensure_base_model(tmp_path, progress=False)
    assert folder == tmp_path / f"shipped-{base_model.SHIPPED_WEIGHTS_SHA256[:16]}"
    assert "(shipped with dynamics)" in base_model.base_model_summary(folder)
    # The installed folder holds the model pretraining measured, on the data it measured it on.
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rows = {name: base_model._read_jsonl(path) for name, path in domain_paths(folder).items()}
    config = DEFAULT_SPEC.pretraining
    _, validation = base_model._pretraining_data(rows, tokenizer, config)
    losses, quiz = base_model.measure_base_model(model, tokenizer, rows, validation, config)
    report = json.loads((folder / base_model.REPORT_FILE).read_text())
    assert losses == pytest.approx(report["losses"], abs=2e-3)
    assert quiz == pytest.approx(report["quiz_accuracy"], abs=1 / 144 + 1e-9)
    assert ensure_base_model(tmp_path, progress=False) == folder


def test_pretrain_builds_the_default_base_model_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[Path] = []
    monkeypatch.setattr(
        base_model, "build_base_model", lambda folder, spec, progress: built.append(folder)
    )
    folder = ensure_base_model(tmp_path, progress=False, pretrain=True)
    assert folder == tmp_path / DEFAULT_SPEC.cache_key() and folder.is_dir() and len(built) == 1


def test_damaged_shipped_weights_are_refused_and_leave_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for name in (base_model.WEIGHTS_FILE, base_model.REPORT_FILE):
        (shipped / name).write_bytes((base_model.SHIPPED_DIR / name).read_bytes())
    with (shipped / base_model.WEIGHTS_FILE).open("r+b") as handle:
        handle.seek(-4, 2)
        handle.write(b"\x00\x00\x00\x01")
    monkeypatch.setattr(base_model, "SHIPPED_DIR", shipped)
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match=r"damaged .*\(dynamics demo --pretrain\)"):
        ensure_base_model(cache, progress=False)
    assert list(cache.iterdir()) == []


def test_a_failed_build_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(folder: Path, *args: object, **kwargs: object) -> None:
        (folder / "model.safetensors").write_text("half written")
        raise RuntimeError("killed")

    monkeypatch.setattr(base_model, "build_base_model", crash)
    with pytest.raises(RuntimeError, match="killed"):
        ensure_base_model(tmp_path, quick=True, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_default_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert base_model.default_cache_dir() == tmp_path / "dynamics"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert base_model.default_cache_dir() == Path.home() / ".cache" / "dynamics"
