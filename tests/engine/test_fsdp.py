"""The learner on a model sharded with FSDP2 (two CPU processes, gloo, one thread each):
a probe's rollback is exact, and training and evaluation follow one unsharded process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from dynamics.engine.learner import load_snapshot
from tests.engine import fsdp_script
from tests.engine.test_distributed import config, finish, start_ranks
from tests.fixtures.in_process import one_thread
from tests.fixtures.tiny_tokenizer import tiny_tokenizer

pytestmark = pytest.mark.slow


def launch(
    tmp_path: Path, name: str, nproc: int, batch_size: int, tokenizer_dir: Path, lora: bool = False
) -> list[dict]:
    data = config(tokenizer_dir, tmp_path / name / "run", batch_size)
    if not lora:
        data["lora"] = None  # full fine-tuning: every weight is sharded
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / name
    out.mkdir()
    if nproc == 1:
        with one_thread():  # the unsharded reference, without a launcher
            fsdp_script.main(str(path), str(out))
    else:
        finish(
            start_ranks("tests.engine.fsdp_script", [str(path), str(out)], nproc),
            timeout=600,
            stop_on_failure=True,
        )
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(nproc)]


def test_probing_is_exact_on_a_sharded_model(tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"
    tiny_tokenizer().save_pretrained(tokenizer_dir)
    [single] = launch(tmp_path, "single", nproc=1, batch_size=4, tokenizer_dir=tokenizer_dir)
    sharded = launch(tmp_path, "sharded", nproc=2, batch_size=2, tokenizer_dir=tokenizer_dir)
    assert single["sharded_parameters"] == 0
    for rank in sharded:
        assert rank["sharded_parameters"] == 21  # every weight of the tiny Llama is a shard
        # The probe moved the model; the rollback undid it exactly, optimizer state included.
        assert rank["probed"] != rank["before"]
        assert rank["restored"] == rank["before"]
        assert rank["retrained"] == rank["trained"]
        for name in ("start", "before", "probed", "trained"):
            np.testing.assert_allclose(rank[name], single[name], rtol=1e-5)
        # Reading the gathered state back into the shards returns to it exactly, and
        # training goes on from there as it did the first time.
        assert rank["moved_on"] != rank["retrained"]
        assert rank["reloaded"] == rank["retrained"]
        assert rank["moved_on_again"] == rank["moved_on"]
        # The same from a fresh model and optimizer, as dynamics run --resume reads it.
        assert rank["fresh_reloaded"] == rank["retrained"]
        assert rank["fresh_moved_on"] == rank["moved_on"]
    # The gathered state is the whole state: the same tensors as one unsharded process's.
    whole, reference = (
        load_snapshot(tmp_path / "sharded", "whole"),
        load_snapshot(tmp_path / "single", "whole"),
    )
    assert [t.shape for t in whole.parameters] == [t.shape for t in reference.parameters]
    # (Up to float reduction order, which moves the smallest entries most: the tolerance is
    # a thousandth of each tensor's largest entry. Misplaced shards would miss by the whole.)
    for got, want in zip(whole.parameters, reference.parameters, strict=True):
        np.testing.assert_allclose(
            got.numpy(), want.numpy(), rtol=1e-3, atol=1e-3 * want.abs().max().item()
        )
    for got, want in zip(whole.optimizer_state, reference.optimizer_state, strict=True):
        assert got.keys() == want.keys()
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_allclose(
                got[key].numpy(),
                want[key].numpy(),
                rtol=1e-3,
                atol=1e-3 * want[key].abs().max().item(),
            )
    # The whole model state (gathered at the same point) holds every weight whole: the same
    # tensors as the gathered training state's parameters, in the model's order.
    model_state = load_file(tmp_path / "sharded" / "model.safetensors")
    assert not (tmp_path / "single" / "model.safetensors").exists()  # unsharded: nothing to gather
    assert len(model_state) == len(whole.parameters) == 21
    assert single["model_state_keys"] is None
    in_order = [model_state[name] for name in sharded[0]["model_state_keys"]]
    for got, want in zip(in_order, whole.parameters, strict=True):
        assert torch.equal(got, want)
    # save_pretrained with the gathered state (as the best checkpoint is saved) writes a model
    # that loads whole.
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "sharded" / "saved").state_dict()
    for name, tensor in model_state.items():
        assert torch.equal(saved[name], tensor), name


def test_a_sharded_lora_adapter_is_saved_whole(tmp_path):
    """LoRA under FSDP2: the adapter's shards are gathered whole, the frozen base weights not
    at all, and save_pretrained (as dynamics run saves its best checkpoint) writes an adapter
    that PEFT loads."""
    tokenizer_dir = tmp_path / "tokenizer"
    tiny_tokenizer().save_pretrained(tokenizer_dir)
    sharded = launch(
        tmp_path, "lora", nproc=2, batch_size=2, tokenizer_dir=tokenizer_dir, lora=True
    )
    for rank in sharded:
        assert rank["sharded_parameters"] == 8  # lora_A and lora_B of q_proj and v_proj, 2 layers
        assert rank["restored"] == rank["before"] and rank["reloaded"] == rank["retrained"]
        assert rank["fresh_reloaded"] == rank["retrained"]
    whole = load_snapshot(tmp_path / "lora", "whole")
    gathered = load_file(tmp_path / "lora" / "model.safetensors")
    assert len(gathered) == 8 and all("lora_" in name for name in gathered)  # no frozen weights
    in_order = [gathered[name] for name in sharded[0]["model_state_keys"]]
    for got, want in zip(in_order, whole.parameters, strict=True):
        assert torch.equal(got, want)
    adapter = load_file(tmp_path / "lora" / "saved" / "adapter_model.safetensors")
    assert len(adapter) == 8
    # rank 4 on the 32-wide projections of the tiny Llama: whole matrices, not halves
    assert sorted({tuple(t.shape) for t in adapter.values()}) == [(4, 32), (16, 4), (32, 4)]
    saved = {name.replace(".default", ""): tensor for name, tensor in gathered.items()}
    for name, tensor in adapter.items():
        assert torch.equal(tensor, saved[name]), name
