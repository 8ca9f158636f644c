"""A user's Trainer script with DynamicsCallback, launched by the tests under torchrun:
``python -m torch.distributed.run --nproc_per_node N
tests/integrations/trainer_script.py CONFIG``."""

from __future__ import annotations

import faulthandler
import sys

import torch
from accelerate.utils import set_seed
from transformers import Trainer

from dynamics import DynamicsCallback, RunConfig
from dynamics.engine.model import load_causal_lm, load_tokenizer, prepare_model
from tests.integrations.test_trainer import HANG_SECONDS, trainer_args


def main(path: str) -> None:
    config = RunConfig.from_yaml(path)
    set_seed(config.training.seed)
    tokenizer = load_tokenizer(config.model)
    model = prepare_model(load_causal_lm(config.model), config.lora, False)
    callback = DynamicsCallback(config, tokenizer)
    trainer = Trainer(
        model=model,
        args=trainer_args(f"{config.output_dir}-hf", config),
        train_dataset=callback.train_dataset,
        data_collator=callback.data_collator,
        callbacks=[callback],
    )
    trainer.train()
    if torch.distributed.is_initialized():
        # As a user's script should: without it a process can abort at exit under torchrun
        # (gloo's threads outlive the interpreter, "terminate called without an active exception").
        # The barrier first, so that no rank tears the group down while another still uses it.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    # Under the test's launcher: if the processes hang (torch.distributed's teardown does,
    # now and then, after a finished run), every thread's stack goes to stderr for the test
    # to report, before the launcher's timeout.
    faulthandler.dump_traceback_later(HANG_SECONDS)
    main(sys.argv[1])
    faulthandler.cancel_dump_traceback_later()
