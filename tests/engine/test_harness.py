"""``dynamics eval``: lm-eval on a run folder's base model and best checkpoint, LoRA and full.

The run folders are written by hand in the layout of ``dynamics run`` (``config.yaml`` and
``best_checkpoint/``): the base is the tiny Llama saved to a folder, the checkpoint a LoRA
adapter with non-zero weights or the whole model with its weights changed. lm-eval's
``acc`` on each must equal the project's accuracy on the same model (the scoring the
lm-eval constraint uses), so the adapter, or the full weights, were the ones evaluated.
"""

from __future__ import annotations

import json

import pytest
import torch

from dynamics.cli import main as cli_main
from dynamics.data.formatting import build_examples, pad_token_id
from dynamics.data.loading import load_rows
from dynamics.engine.batches import collate_choice
from dynamics.engine.config import RunConfig
from dynamics.engine.learner import choice_logits
from dynamics.report.lm_eval import lm_eval_table, read_lm_eval
from tests.data.test_lm_eval_tasks import INCLUDE, TASK, _source, in_repo, model_dir  # noqa: F401

pytest.importorskip("lm_eval")


def _accuracy_and_scores(model, tokenizer, **lm_eval):
    source = _source("accuracy", **lm_eval)
    examples = build_examples(load_rows(source), tokenizer, source, sequence_length=256)
    batch = collate_choice(examples, pad_token_id(tokenizer))
    with torch.no_grad():
        scores = choice_logits(model.eval(), batch)
    return float((scores.argmax(dim=-1) == batch["answer_index"]).double().mean()), scores


def _run_folder(tmp_path, model_dir, lora: bool, quantization: dict | None = None):  # noqa: F811
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / ("lora" if lora else "full")
    config = RunConfig.from_dict(
        {
            "model": {
                "name_or_path": str(model_dir),
                "dtype": "float32",
                "quantization": quantization,
            },
            "lora": {"rank": 4, "alpha": 8} if lora else None,
            "datasets": [
                {"name": "math", "path": "tests/fixtures/metamath.jsonl", "role": "target"}
            ],
            "output_dir": str(run),
        }
    )
    run.mkdir()
    (run / "config.yaml").write_text(config.to_yaml())
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if lora:
        model = get_peft_model(
            model,
            LoraConfig(
                r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
            ),
        )
    else:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(run / "best_checkpoint")
    model.save_pretrained(run / "best_checkpoint")
    return run, model


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_eval_compares_the_base_model_and_the_best_checkpoint(
    tmp_path,
    model_dir,  # noqa: F811
    in_repo,  # noqa: F811
    lora,
    capsys,
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, tuned = _run_folder(tmp_path, model_dir, lora)
    code = cli_main(
        [
            "eval",
            str(run),
            "--tasks",
            TASK,
            "--include-path",
            INCLUDE,
            "--batch-size",
            "4",
            "--device",
            "cpu",
        ]
    )
    assert code == 0
    record = json.loads((run / "lm_eval.json").read_text())
    assert record["tasks"] == [TASK] and record["lm_eval_version"] == "0.4.13"
    args = record["models"]["best_checkpoint"]["model_args"]
    assert (args.get("peft"), args["pretrained"]) == (
        (str(run / "best_checkpoint"), str(model_dir))
        if lora
        else (None, str(run / "best_checkpoint"))
    )

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    base_accuracy, base_scores = _accuracy_and_scores(
        AutoModelForCausalLM.from_pretrained(model_dir), tokenizer
    )
    tuned_accuracy, tuned_scores = _accuracy_and_scores(tuned, tokenizer)
    assert not torch.allclose(
        base_scores, tuned_scores, atol=1e-3
    )  # the checkpoint is another model
    assert record["models"]["base"]["results"][TASK]["acc,none"] == base_accuracy
    assert record["models"]["best_checkpoint"]["results"][TASK]["acc,none"] == tuned_accuracy
    assert isinstance(record["models"]["base"]["results"][TASK]["acc_stderr,none"], float)
    # lm-eval's task versions and configs: what was evaluated.
    assert record["models"]["base"]["versions"][TASK] == 1.0
    assert (
        record["models"]["base"]["configs"][TASK]["doc_to_text"]
        == "Question: {{question}}\nAnswer:"
    )

    table = lm_eval_table(read_lm_eval(run))
    row = next(line for line in table if line.startswith(TASK))
    assert f"{base_accuracy:.4f} ± " in row and f"{tuned_accuracy:.4f} ± " in row
    assert f"{tuned_accuracy - base_accuracy:+.4f}" in row
    assert row in capsys.readouterr().out


def test_eval_refuses_a_run_without_a_named_base_model(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    config = RunConfig.from_dict(
        {
            "model": {
                "init_config": {"model_type": "llama"},
                "tokenizer": "examples/tiny-tokenizer",
            },
            "datasets": [
                {"name": "math", "path": "tests/fixtures/metamath.jsonl", "role": "target"}
            ],
        }
    )
    (run / "config.yaml").write_text(config.to_yaml())
    (run / "best_checkpoint").mkdir()
    assert cli_main(["eval", str(run), "--tasks", TASK]) == 2
    assert "give --base with the base model's hub id or folder" in capsys.readouterr().err
    assert not (run / "lm_eval.json").exists()
    assert read_lm_eval(run) is None


def test_eval_passes_prompt_options_as_simple_evaluate_takes_them(tmp_path, model_dir, in_repo):  # noqa: F811
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, tuned = _run_folder(tmp_path, model_dir, lora=True)
    instruction = "Answer the question."
    code = cli_main(
        [
            "eval",
            str(run),
            "--tasks",
            TASK,
            "--include-path",
            INCLUDE,
            "--batch-size",
            "4",
            "--device",
            "cpu",
            "--num-fewshot",
            "3",
            "--system-instruction",
            instruction,
        ]
    )
    assert code == 0
    record = json.loads((run / "lm_eval.json").read_text())
    assert record["options"] == {"num_fewshot": 3, "system_instruction": instruction}
    assert record["models"]["base"]["n-shot"][TASK] == 3
    # The same prompts as a dataset with the same options: the same acc.
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    options = {"lm_eval_num_fewshot": 3, "lm_eval_system_instruction": instruction}
    base_accuracy, _ = _accuracy_and_scores(
        AutoModelForCausalLM.from_pretrained(model_dir), tokenizer, **options
    )
    tuned_accuracy, _ = _accuracy_and_scores(tuned, tokenizer, **options)
    assert record["models"]["base"]["results"][TASK]["acc,none"] == base_accuracy
    assert record["models"]["best_checkpoint"]["results"][TASK]["acc,none"] == tuned_accuracy


def test_chat_options_reach_simple_evaluate_by_its_names():
    import argparse

    from dynamics.commands import eval as eval_command

    parser = argparse.ArgumentParser()
    eval_command.add_arguments(parser)

    def parse(*extra):
        return eval_command._prompt_options(parser.parse_args(["runs/x", "--tasks", TASK, *extra]))

    assert parse() == {}
    assert parse("--apply-chat-template", "--no-fewshot-as-multiturn") == {
        "apply_chat_template": True,
        "fewshot_as_multiturn": False,
    }
    from dynamics.commands.errors import UsageError

    with pytest.raises(
        UsageError, match="--fewshot-as-multiturn shapes a chat: give --apply-chat-template"
    ):
        parse("--fewshot-as-multiturn")


def test_a_quantized_run_is_evaluated_quantized(tmp_path, model_dir, in_repo, monkeypatch):  # noqa: F811
    # bitsandbytes needs a GPU: the weights are loaded without it here, and the test checks
    # that the run's own quantization settings reach from_pretrained for both models.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import dynamics.engine.model as model_module

    loads = []

    class Recording:
        @staticmethod
        def from_pretrained(name, **kwargs):
            loads.append((name, kwargs.pop("quantization_config"), kwargs.pop("device_map")))
            return AutoModelForCausalLM.from_pretrained(name, **kwargs)

    monkeypatch.setattr(model_module, "AutoModelForCausalLM", Recording)
    run, tuned = _run_folder(tmp_path, model_dir, lora=True, quantization={"bits": 4})
    code = cli_main(
        ["eval", str(run), "--tasks", TASK, "--include-path", INCLUDE, "--batch-size", "4"]
    )
    assert code == 0
    assert [name for name, _, _ in loads] == [
        str(model_dir),
        str(model_dir),
    ]  # the base, then under the adapter
    for _, quantized, device_map in loads:
        assert (
            quantized.load_in_4bit
            and quantized.bnb_4bit_quant_type == "nf4"
            and quantized.bnb_4bit_use_double_quant
        )
        assert device_map == {"": 0}
    record = json.loads((run / "lm_eval.json").read_text())
    assert record["models"]["best_checkpoint"]["quantization"] == {"bits": 4}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tuned_accuracy, _ = _accuracy_and_scores(tuned, tokenizer)
    assert record["models"]["best_checkpoint"]["results"][TASK]["acc,none"] == tuned_accuracy
