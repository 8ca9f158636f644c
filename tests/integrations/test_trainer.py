"""DynaMiCS inside a transformers Trainer: the callback against ``dynamics run`` on the same
tiny model, data and seed, the run folder it writes, and its refusals."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import numpy as np
import pytest
import yaml
from accelerate.utils import set_seed
from peft import PeftModel
from transformers import Trainer, TrainerCallback, TrainingArguments

from dynamics import DynamicsCallback, RunConfig, run
from dynamics.engine.model import load_causal_lm, load_tokenizer, prepare_model
from dynamics.engine.preflight import RunSetupError
from dynamics.runs.rundir import read_run
from tests.engine.test_run import tiny_config
from tests.fixtures.tiny_tokenizer import tiny_tokenizer


def trainer_args(out: Path, config: RunConfig, **changes) -> TrainingArguments:
    """TrainingArguments that mean what the config's optimizer section means."""
    optimizer = config.optimizer
    settings = dict(
        output_dir=str(out),
        max_steps=config.training.total_steps,
        per_device_train_batch_size=config.training.batch_size,
        gradient_accumulation_steps=config.training.gradient_accumulation,
        learning_rate=optimizer.lr,
        lr_scheduler_type="constant",
        weight_decay=optimizer.weight_decay,
        adam_beta1=optimizer.betas[0],
        adam_beta2=optimizer.betas[1],
        adam_epsilon=optimizer.eps,
        max_grad_norm=0.0,  # the config's null: no clipping
        optim="adamw_torch",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        seed=config.training.seed,
    )
    settings.update(changes)
    return TrainingArguments(**settings)


def train_with_callback(config: RunConfig, hf_out: Path, **changes) -> DynamicsCallback:
    """The user's script: their model and tokenizer, their Trainer, plus the callback."""
    set_seed(config.training.seed)  # as dynamics run does before loading the model
    tokenizer = load_tokenizer(config.model)
    model = prepare_model(load_causal_lm(config.model), config.lora, False)
    callback = DynamicsCallback(config, tokenizer)
    trainer = Trainer(
        model=model,
        args=trainer_args(hf_out, config, **changes),
        train_dataset=callback.train_dataset,
        data_collator=callback.data_collator,
        callbacks=[callback],
    )
    trainer.train()
    return callback


@pytest.mark.parametrize("method", [{"variant": "paper"}, {}])
def test_the_trainer_with_the_callback_makes_the_same_run_as_dynamics_run(
    tokenizer_dir, tmp_path, method, single_thread
):
    data = tiny_config(tokenizer_dir, tmp_path / "engine", **method)
    run(RunConfig.from_dict(data), progress=False)
    data["output_dir"] = str(tmp_path / "trainer")
    callback = train_with_callback(RunConfig.from_dict(data), tmp_path / "hf")

    engine, trainer = read_run(tmp_path / "engine"), read_run(tmp_path / "trainer")
    assert [u.step for u in trainer.updates] == [u.step for u in engine.updates] == [0, 2, 4]
    assert len(trainer.evaluations) == len(engine.evaluations) == 3
    # The same batches, probes, optimizer steps and evaluations: on CPU the two runs agree to
    # the last bit; the tolerance leaves room for float reduction order elsewhere.
    for mine, theirs in zip(trainer.updates, engine.updates, strict=True):
        np.testing.assert_allclose(mine.slope_matrix, theirs.slope_matrix, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(mine.weights, theirs.weights, atol=1e-6)
    for mine, theirs in zip(trainer.evaluations, engine.evaluations, strict=True):
        for split in ("eval", "test"):
            np.testing.assert_allclose(
                list(getattr(mine, split).values()),
                list(getattr(theirs, split).values()),
                rtol=1e-6,
            )
    assert callback.summary is not None
    assert callback.summary["constrained_ppl_reduction"] == pytest.approx(
        read_run(tmp_path / "engine").summary["constrained_ppl_reduction"], rel=1e-6
    )


def test_the_callbacks_run_folder_is_complete_and_its_adapter_loads(
    tokenizer_dir, tmp_path, single_thread
):
    data = tiny_config(tokenizer_dir, tmp_path / "trainer")
    config = RunConfig.from_dict(data)
    out = tmp_path / "trainer"
    callback = train_with_callback(config, out / "hf")  # the Trainer's own folder may sit inside
    for name in ("config.yaml", "metrics.jsonl", "controller.jsonl", "summary.json"):
        assert (out / name).is_file(), name
    records = read_run(out)
    assert records.summary["trainer"] is True
    assert records.summary["feasible"]  # this tiny run keeps its constraints (as in test_run)
    assert all(u.realized_losses is not None for u in records.updates)
    assert RunConfig.from_yaml(out / "config.yaml") == config
    base = load_causal_lm(config.model)
    adapted = PeftModel.from_pretrained(base, out / "best_checkpoint")
    assert any("lora_" in name for name, _ in adapted.named_parameters())
    assert (
        callback.history is not None
        and callback.history.evaluations[-1].step == config.training.total_steps
    )


def test_trl_sft_trainer_with_lora_and_the_callback_writes_a_loadable_adapter(
    tokenizer_dir, tmp_path
):
    from peft import LoraConfig as PeftLoraConfig
    from trl import SFTConfig, SFTTrainer

    out = tmp_path / "sft"
    config = RunConfig.from_dict(tiny_config(tokenizer_dir, out))
    tokenizer = load_tokenizer(config.model)
    model = load_causal_lm(config.model)
    callback = DynamicsCallback(config, tokenizer)
    args = trainer_args(out / "trainer", config).to_dict()
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(**{**args, "dataset_kwargs": {"skip_prepare_dataset": True}}),
        processing_class=tokenizer,
        peft_config=PeftLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        train_dataset=callback.train_dataset,
        data_collator=callback.data_collator,
        callbacks=[callback],
    )
    trainer.train()
    records = read_run(out)
    assert [u.step for u in records.updates] == [0, 2, 4]
    assert callback.source.drawn == config.training.total_steps
    assert (
        records.summary["feasible"]
        and (out / "best_checkpoint" / "adapter_model.safetensors").is_file()
    )
    adapted = PeftModel.from_pretrained(load_causal_lm(config.model), out / "best_checkpoint")
    assert (
        sum("lora_" in name for name, _ in adapted.named_parameters()) == 2 * 2 * 2
    )  # A, B x q, v x 2 layers


class StopAt(TrainerCallback):
    """Stops training after ``step`` (a crash that keeps the checkpoint saved there)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def resumable_trainer(
    config: RunConfig, hf_out: Path, extra_callbacks=()
) -> tuple[Trainer, DynamicsCallback]:
    set_seed(config.training.seed)
    tokenizer = load_tokenizer(config.model)
    model = prepare_model(load_causal_lm(config.model), config.lora, False)
    callback = DynamicsCallback(config, tokenizer)
    args = trainer_args(hf_out, config, save_strategy="steps", save_steps=4)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=callback.train_dataset,
        data_collator=callback.data_collator,
        callbacks=[callback, *extra_callbacks],
    )
    return trainer, callback


def test_resuming_the_trainer_from_its_checkpoint_continues_the_mixture(
    tokenizer_dir, tmp_path, single_thread
):
    data = tiny_config(tokenizer_dir, tmp_path / "whole", variant="robust")
    whole_trainer, whole = resumable_trainer(RunConfig.from_dict(data), tmp_path / "whole" / "hf")
    whole_trainer.train()

    data["output_dir"] = str(tmp_path / "cut")
    config = RunConfig.from_dict(data)
    first, _ = resumable_trainer(config, tmp_path / "cut" / "hf", [StopAt(4)])
    first.train()
    assert (tmp_path / "cut" / "hf" / "checkpoint-4" / "dynamics_state" / "loop.json").is_file()
    assert not (tmp_path / "cut" / "summary.json").exists()
    second, resumed = resumable_trainer(config, tmp_path / "cut" / "hf")
    second.train(resume_from_checkpoint=str(tmp_path / "cut" / "hf" / "checkpoint-4"))

    a, b = read_run(tmp_path / "whole"), read_run(tmp_path / "cut")
    assert [u.step for u in a.updates] == [u.step for u in b.updates] == [0, 2, 4]
    for mine, theirs in zip(b.updates, a.updates, strict=True):
        np.testing.assert_allclose(mine.weights, theirs.weights, atol=1e-9)
        np.testing.assert_allclose(mine.slope_matrix, theirs.slope_matrix, rtol=1e-6, atol=1e-9)
    for mine, theirs in zip(b.evaluations, a.evaluations, strict=True):
        np.testing.assert_allclose(list(mine.eval.values()), list(theirs.eval.values()), rtol=1e-6)
    assert (
        resumed.sampler.state_dict() == whole.sampler.state_dict()
    )  # same data position at the end
    assert resumed.source.drawn == whole.source.drawn == 8
    assert b.summary["constrained_ppl_reduction"] == pytest.approx(
        a.summary["constrained_ppl_reduction"]
    )


def test_resuming_a_checkpoint_without_mixture_state_is_refused(tokenizer_dir, tmp_path):
    data = tiny_config(tokenizer_dir, tmp_path / "run")
    config = RunConfig.from_dict(data)
    first, _ = resumable_trainer(config, tmp_path / "run" / "hf", [StopAt(4)])
    first.train()
    checkpoint = tmp_path / "run" / "hf" / "checkpoint-4"
    shutil.rmtree(checkpoint / "dynamics_state")
    second, _ = resumable_trainer(config, tmp_path / "run" / "hf")
    with pytest.raises(RunSetupError, match="holds no complete mixture state"):
        second.train(resume_from_checkpoint=str(checkpoint))


def test_gradient_alignment_through_the_callback_matches_dynamics_run(
    tokenizer_dir, tmp_path, single_thread
):
    data = tiny_config(tokenizer_dir, tmp_path / "engine")
    data["datasets"] = [d for d in data["datasets"] if d["name"] != "mmlu"]  # loss constraints only
    data["method"] = {"name": "gradient-alignment", "schedule": [0, 2, 4], "alignment_batches": 2}
    run(RunConfig.from_dict(data), progress=False)
    data["output_dir"] = str(tmp_path / "trainer")
    train_with_callback(RunConfig.from_dict(data), tmp_path / "hf")
    engine, trainer = read_run(tmp_path / "engine"), read_run(tmp_path / "trainer")
    assert [u.step for u in trainer.updates] == [0, 2, 4]
    for mine, theirs in zip(trainer.updates, engine.updates, strict=True):
        np.testing.assert_allclose(mine.slope_matrix, theirs.slope_matrix, rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(mine.weights, theirs.weights, atol=1e-6)


class Recorder(TrainerCallback):
    """Stands for a report_to integration: it keeps every log it is shown."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


@pytest.mark.parametrize("moved", [False, True])
def test_the_mixture_reaches_the_trainers_log_and_its_trackers_once_moved_first(
    tokenizer_dir, tmp_path, moved
):
    config = RunConfig.from_dict(tiny_config(tokenizer_dir, tmp_path / "run"))
    set_seed(config.training.seed)
    tokenizer = load_tokenizer(config.model)
    model = prepare_model(load_causal_lm(config.model), config.lora, False)
    callback, tracker, after = DynamicsCallback(config, tokenizer), Recorder(), Recorder()
    trainer = Trainer(
        model=model,
        args=trainer_args(tmp_path / "hf", config, logging_strategy="steps", logging_steps=4),
        train_dataset=callback.train_dataset,
        data_collator=callback.data_collator,
        callbacks=[tracker, callback, after],  # the tracker stands where report_to puts it: before
    )
    if moved:
        callback.log_before_trackers(trainer)
    trainer.train()
    step_logs = [log for log in after.logs if "loss" in log]
    assert len(step_logs) == 2  # steps 4 and 8
    last = read_run(tmp_path / "run").updates[-1]
    for log in step_logs:
        assert {
            "dynamics/weight/math",
            "dynamics/weight/wiki",
            "dynamics/worst_slack",
            "dynamics/feasible",
        } <= set(log)
    assert step_logs[-1]["dynamics/weight/math"] == pytest.approx(last.weights[0])
    tracked = [log for log in tracker.logs if "loss" in log]
    assert len(tracked) == 2
    assert all(("dynamics/weight/math" in log) == moved for log in tracked)


def test_fixed_weights_through_the_callback_draw_only_the_weighted_dataset(tokenizer_dir, tmp_path):
    data = tiny_config(tokenizer_dir, tmp_path / "trainer")
    data["method"] = {"name": "fixed", "weights": {"math": 1.0, "wiki": 0.0}}
    callback = train_with_callback(RunConfig.from_dict(data), tmp_path / "hf")
    streams = callback.sampler.sampler.streams
    taken = [s.epoch * s.num_examples + s.position for s in streams]
    assert taken[1] == 0 and taken[0] == 8 * data["training"]["batch_size"]
    assert callback.source.drawn == 8


@pytest.mark.parametrize(
    ("changes", "needles"),
    [
        ({"max_steps": 6}, ("max_steps is 6", "training.total_steps is 8")),
        (
            {"per_device_train_batch_size": 3},
            ("per_device_train_batch_size is 3", "training.batch_size is 2"),
        ),
        (
            {"gradient_accumulation_steps": 2},
            ("gradient_accumulation_steps is 2", "training.gradient_accumulation"),
        ),
    ],
)
def test_a_trainer_that_disagrees_with_the_config_is_refused_naming_both_fields(
    tokenizer_dir, tmp_path, changes, needles
):
    data = tiny_config(tokenizer_dir, tmp_path / "trainer")
    with pytest.raises(RunSetupError) as error:
        train_with_callback(RunConfig.from_dict(data), tmp_path / "hf", **changes)
    for needle in needles:
        assert needle in str(error.value)
    assert not (tmp_path / "trainer").exists()  # refused before anything was written


def test_sharded_training_is_refused_by_the_callback(tokenizer_dir, tmp_path, monkeypatch):
    # The Trainer itself accepts fsdp only when launched on several processes, so its
    # arguments are checked directly here.
    from transformers import TrainerState

    config = RunConfig.from_dict(tiny_config(tokenizer_dir, tmp_path / "trainer"))
    callback = DynamicsCallback(config, load_tokenizer(config.model))
    with pytest.raises(
        RunSetupError, match=r"sharded training .*TrainingArguments\.fsdp.*plain data parallelism"
    ):
        callback._check_trainer(trainer_args(tmp_path / "hf", config, fsdp=True), TrainerState())
    # accelerate launch --use_fsdp shards the Trainer's model without TrainingArguments.fsdp.
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    with pytest.raises(
        RunSetupError,
        match=r"launched under FSDP \(ACCELERATE_USE_FSDP=true\).*plain data parallelism",
    ):
        callback._check_trainer(trainer_args(tmp_path / "hf", config), TrainerState())


def test_backtracking_is_refused_by_the_callback(tokenizer_dir, tmp_path):
    data = tiny_config(tokenizer_dir, tmp_path / "trainer", backtrack=1)
    tokenizer = load_tokenizer(RunConfig.from_dict(data).model)
    with pytest.raises(RunSetupError, match=r"method\.backtrack"):
        DynamicsCallback(RunConfig.from_dict(data), tokenizer)


def test_the_data_without_the_callback_says_what_is_missing(tokenizer_dir, tmp_path):
    config = RunConfig.from_dict(tiny_config(tokenizer_dir, tmp_path / "trainer"))
    callback = DynamicsCallback(config, load_tokenizer(config.model))
    pending = callback.data_collator([0, 0])
    with pytest.raises(RuntimeError, match="pass the DynamicsCallback to the Trainer's callbacks"):
        pending.to("cpu")


def test_the_callback_samples_by_tokens_when_the_config_says_so(tokenizer_dir, tmp_path):
    data = tiny_config(tokenizer_dir, tmp_path / "trainer")
    data["training"]["sampling"] = "tokens"
    callback = DynamicsCallback(
        RunConfig.from_dict(data), load_tokenizer(RunConfig.from_dict(data).model)
    )
    assert callback.sampler.sampler.sampling == "tokens"
    # The policy records its solved batch shares as the token shares this sampler draws them by.
    assert callback.policy.unit is callback.sampler.sampler.unit


HANG_SECONDS = 240
"""How long the two-process script may run before it prints every thread's stack (a run
takes 10-60 s)."""


def launch_past_teardown_hangs(
    command: list[str], env: dict[str, str], out: Path
) -> subprocess.CompletedProcess:
    """``command`` run once more, from an empty run folder, if it hangs after the run finished
    (``summary.json`` written): torch.distributed's teardown hangs in one process now and then
    (pytorch/pytorch#75097), outside the callback. A second hang, or a hang before the run
    finished, fails the test with the stacks the script printed; the first hang's stacks
    are reported as a warning."""
    result, stacks = _run_or_hang(command, env)
    if result is not None:
        return result
    if not (out / "summary.json").is_file():
        raise AssertionError(f"the two-process run hung before it finished; its stacks:\n{stacks}")
    warnings.warn(
        f"the two-process run hung after it finished and runs again; its stacks:\n{stacks}",
        stacklevel=2,
    )
    for folder in (out, out.with_name(f"{out.name}-hf")):
        shutil.rmtree(folder, ignore_errors=True)
    result, stacks = _run_or_hang(command, env)
    if result is None:
        raise AssertionError(f"the two-process run hung again; its stacks:\n{stacks}")
    return result


def _run_or_hang(
    command: list[str], env: dict[str, str]
) -> tuple[subprocess.CompletedProcess | None, str]:
    """The finished process, or None and the end of its stderr if it ran past the limit (then
    it is killed with every process it started: it runs in a session of its own)."""
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=HANG_SECONDS + 60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return None, process.communicate()[1][-6000:]
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), ""


@pytest.mark.slow
def test_two_processes_under_the_trainer_match_one_process(tmp_path):
    """torchrun, gloo, one thread each: two ranks with half the batch each follow the
    same mixture as one process with the whole batch (and as dynamics run does)."""
    from tests.engine.test_distributed import config as distributed_config
    from tests.fixtures.in_process import one_thread
    from tests.integrations import trainer_script

    tokenizer_dir = tmp_path / "tokenizer"
    tiny_tokenizer().save_pretrained(tokenizer_dir)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    updates = {}
    for name, nproc, batch_size in (("single", 1, 4), ("double", 2, 2)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            yaml.safe_dump(distributed_config(tokenizer_dir, tmp_path / name, batch_size))
        )
        if nproc == 1:
            with one_thread():  # the reference, without a launcher
                trainer_script.main(str(path))
        else:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={nproc}",
                str(Path(__file__).with_name("trainer_script.py")),
                str(path),
            ]
            result = launch_past_teardown_hangs(command, env, tmp_path / name)
            assert result.returncode == 0, result.stderr[-3000:]
        updates[name] = read_run(tmp_path / name).updates
    single, double = updates["single"], updates["double"]
    assert [u.step for u in single] == [u.step for u in double] == [0, 2, 4]
    assert [u.probe_ranks for u in double] == [[[0], [1]]] * 3  # each rank probed one dataset alone
    for one, two in zip(single, double, strict=True):
        np.testing.assert_allclose(two.slope_matrix, one.slope_matrix, rtol=1e-3, atol=1e-5)
        np.testing.assert_allclose(two.weights, one.weights, atol=1e-4)
        np.testing.assert_allclose(two.current_losses, one.current_losses, rtol=1e-5)
    assert read_run(tmp_path / "double").summary["trainer"] is True
