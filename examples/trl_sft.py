"""A TRL SFTTrainer script with LoRA and DynaMiCS added: the lines marked "dynamics".

Runs offline in well under a minute on CPU: a tiny random-initialised Llama, the tokenizer
and data files of examples/tiny-run.yaml. The run config tokenizes and formats the data
(prompt/response loss masks, chat template), so SFTTrainer's own dataset preparation is
skipped.

    python examples/trl_sft.py --out runs/trl-example
    dynamics report runs/trl-example
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import yaml
from peft import LoraConfig
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from dynamics import DynamicsCallback, RunConfig  # dynamics

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", required=True, type=Path, help="run folder to create (must not exist)"
    )
    args = parser.parse_args()

    spec = yaml.safe_load((HERE / "tiny-run.yaml").read_text())
    tokenizer = AutoTokenizer.from_pretrained(HERE / "tiny-tokenizer")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**spec["model"]["init_config"]))

    # dynamics: the datasets, their roles and the method come from a run config.
    config = RunConfig.from_yaml(HERE / "tiny-run.yaml", overrides=[f"output_dir={args.out}"])
    dynamics = DynamicsCallback(config, tokenizer)

    sft_args = SFTConfig(
        output_dir=str(args.out / "trainer"),
        max_steps=config.training.total_steps,  # dynamics: the config's schedule spans these steps
        per_device_train_batch_size=config.training.batch_size,  # dynamics: one dataset per batch
        dataset_kwargs={"skip_prepare_dataset": True},  # dynamics: batches come tokenized
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        bf16=torch.cuda.is_available(),  # SFTConfig asks for bf16 by default, which a CPU lacks
        logging_steps=8,
        save_strategy="no",
        report_to=[],
    )
    trainer = SFTTrainer(
        model=model,
        args=sft_args,
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
        ),
        train_dataset=dynamics.train_dataset,  # dynamics
        data_collator=dynamics.data_collator,  # dynamics
        callbacks=[dynamics],  # dynamics
    )
    trainer.train()
    if torch.distributed.is_initialized():
        # Under torchrun, without this a process can abort at exit (gloo's threads outlive Python);
        # the barrier first, so that no rank tears the group down while another still uses it.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()

    summary = dynamics.summary
    print(
        f"feasible: {summary['feasible']}, constrained perplexity reduction: "
        f"{summary['constrained_ppl_reduction']:.1%}; run folder: {args.out}"
    )


if __name__ == "__main__":
    main()
