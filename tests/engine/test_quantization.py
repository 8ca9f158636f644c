"""QLoRA (``model.quantization``): the config, the bitsandbytes settings built from it, and
the refusals where it cannot run. Loading a quantized model needs a CUDA GPU and
bitsandbytes, so no model is loaded here: what runs is everything before the load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from dynamics.cli import main as cli_main
from dynamics.engine import preflight as preflight_module
from dynamics.engine.config import ConfigError, QuantizationConfig, RunConfig
from dynamics.engine.model import bnb_config, is_quantized, prepare_model
from tests.engine.test_run import tiny_config

HUB_MODEL = "some-org/some-model"  # never loaded: every refusal comes before the model is read


def quantized_config(
    tokenizer_dir: Path, out: Path, bits: int = 4, **changes: Any
) -> dict[str, Any]:
    data = tiny_config(tokenizer_dir, out)
    data["model"] = {
        "name_or_path": HUB_MODEL,
        "tokenizer": str(tokenizer_dir),
        "quantization": {"bits": bits},
    }
    data.update(changes)
    return data


def refusal(data: dict[str, Any], tmp_path: Path, capsys) -> str:
    """Run the CLI on ``data``: exit code 2, one line on stderr, no run folder; the line."""
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(data))
    capsys.readouterr()
    code = cli_main(["run", str(config_path), "--no-progress"])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    lines = captured.err.rstrip("\n").split("\n")
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("dynamics run: error: ")
    assert not Path(data["output_dir"]).exists()
    return lines[0].removeprefix("dynamics run: error: ")


def test_bits_4_is_nf4_with_double_quantization_and_bf16_compute():
    config = bnb_config(QuantizationConfig(bits=4))
    assert config.load_in_4bit and not config.load_in_8bit
    assert config.bnb_4bit_quant_type == "nf4"
    assert config.bnb_4bit_use_double_quant is True
    assert config.bnb_4bit_compute_dtype == torch.bfloat16
    assert config.quant_method == "bitsandbytes"


def test_bits_8_is_llm_int8():
    config = bnb_config(QuantizationConfig(bits=8))
    assert config.load_in_8bit and not config.load_in_4bit


def test_the_config_takes_bits_4_or_8_and_saves_them(tokenizer_dir, tmp_path):
    for bits in (4, 8):
        config = RunConfig.from_dict(quantized_config(tokenizer_dir, tmp_path / "run", bits=bits))
        assert config.model.quantization == QuantizationConfig(bits=bits)
        again = RunConfig.model_validate(
            yaml.safe_load(yaml.safe_dump(config.model_dump(mode="json")))
        )
        assert again == config
    assert (
        RunConfig.from_dict(tiny_config(tokenizer_dir, tmp_path / "run")).model.quantization is None
    )


@pytest.mark.parametrize(
    ("quantization", "expect"),
    [
        ({"bits": 2}, ("model.quantization.bits", "4 or 8")),
        ({}, ("model.quantization.bits", "missing")),
        ({"bits": 4, "type": "nf4"}, ("model.quantization.type", "unknown field")),
    ],
)
def test_bad_quantization_settings_name_the_field(quantization, expect, tokenizer_dir, tmp_path):
    data = quantized_config(tokenizer_dir, tmp_path / "run")
    data["model"]["quantization"] = quantization
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(data)
    for text in expect:
        assert text in str(err.value)


def test_quantization_of_a_randomly_initialised_model_is_refused(tokenizer_dir, tmp_path):
    data = tiny_config(tokenizer_dir, tmp_path / "run")
    data["model"]["quantization"] = {"bits": 4}
    with pytest.raises(
        ConfigError, match=r"model.quantization .* model.init_config .* remove model.quantization"
    ):
        RunConfig.from_dict(data)


def test_without_cuda_the_run_is_refused_at_start(tokenizer_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(preflight_module, "_cuda_available", lambda: False)
    message = refusal(quantized_config(tokenizer_dir, tmp_path / "run"), tmp_path, capsys)
    assert message == (
        "model.quantization needs a CUDA GPU and bitsandbytes; "
        "remove it to train in full precision on this machine"
    )


def test_without_bitsandbytes_the_run_is_refused_at_start(
    tokenizer_dir, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(preflight_module, "_cuda_available", lambda: True)
    real_find_spec = preflight_module.importlib.util.find_spec
    monkeypatch.setattr(
        preflight_module.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "bitsandbytes" else real_find_spec(name, *args),
    )
    message = refusal(quantized_config(tokenizer_dir, tmp_path / "run", bits=8), tmp_path, capsys)
    assert message.startswith(
        "model.quantization needs the bitsandbytes package, which is not installed"
    )
    assert "pip install 'dynamics[qlora]'" in message and "remove model.quantization" in message


def test_full_fine_tuning_of_a_quantized_model_is_refused(tokenizer_dir, tmp_path, capsys):
    message = refusal(
        quantized_config(tokenizer_dir, tmp_path / "run", lora=None), tmp_path, capsys
    )
    assert message.startswith("model.quantization (bits: 4) with lora: null")
    assert "set lora" in message and "remove model.quantization" in message


def test_a_sharded_launch_of_a_quantized_model_is_refused(
    tokenizer_dir, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    message = refusal(quantized_config(tokenizer_dir, tmp_path / "run"), tmp_path, capsys)
    assert message.startswith("model.quantization under FSDP (ACCELERATE_USE_FSDP=true)")
    assert "torchrun" in message


def test_a_model_marked_quantized_trains_only_its_adapter(monkeypatch):
    """prepare_model on a model that says it was loaded in 4 bits (a tiny float model with
    the flag bitsandbytes' loader sets): PEFT's k-bit preparation freezes every base weight,
    and only the LoRA adapter is trainable, so snapshots hold only the adapter."""
    from dynamics.engine.config import LoraConfig
    from tests.engine.conftest import tiny_model

    model = tiny_model("llama")
    model.is_loaded_in_4bit = True
    assert is_quantized(model)
    with pytest.raises(ValueError, match=r"model\.quantization"):
        prepare_model(model, None)
    trained = prepare_model(model, LoraConfig(rank=2, alpha=4, target_modules=["q_proj"]))
    trainable = [name for name, p in trained.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
