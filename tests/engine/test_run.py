"""The whole run on a tiny random-init model: the run folder is complete and readable."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from dynamics.cli import main as cli_main
from dynamics.core import metrics
from dynamics.core.records import EvaluationRecord, RunHistory
from dynamics.engine.components import build_run
from dynamics.engine.config import RunConfig
from dynamics.engine.run import run
from dynamics.runs.model_card import MARKER
from dynamics.runs.rundir import read_run
from dynamics.runs.writer import BestCheckpoint
from tests.fixtures.tiny_tokenizer import FIXTURES

TINY_LLAMA = {
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def tiny_config(tokenizer_dir: Path, out: Path, **method) -> dict:
    return {
        "model": {"init_config": TINY_LLAMA, "tokenizer": str(tokenizer_dir)},
        "lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "optimizer": {"lr": 1e-2},
        "training": {"total_steps": 8, "batch_size": 2, "sequence_length": 128, "seed": 0},
        "evaluation": {"interval": 4, "batches": 3, "reduced_batches": 2},
        "method": {"name": "dynamics", "schedule": [0, 2, 4], **method},
        "datasets": [
            {
                "name": "math",
                "path": str(FIXTURES / "metamath.jsonl"),
                "role": "target",
                "format": "instruction",
                "columns": {"prompt": "query"},
                "budget": 6,
                "eval_size": 3,
                "test_size": 3,
            },
            {"name": "wiki", "path": str(FIXTURES / "wikipedia.jsonl"), "role": "non-target"},
            {
                "name": "orca",
                "path": str(FIXTURES / "openorca.jsonl"),
                "role": "constraint",
                "format": "instruction",
                "columns": {"prompt": "question", "system": "system_prompt"},
            },
            {
                "name": "mmlu",
                "path": str(FIXTURES / "tinymmlu.jsonl"),
                "role": "constraint",
                "format": "multiple_choice",
                "metric": "accuracy",
            },
        ],
        "output_dir": str(out),
    }


def test_dynamics_run_writes_a_complete_run_folder(tokenizer_dir, tmp_path):
    out = tmp_path / "run"
    config = RunConfig.from_dict(tiny_config(tokenizer_dir, out))
    summary = run(config, progress=False)

    for name in ("config.yaml", "metrics.jsonl", "controller.jsonl", "summary.json"):
        assert (out / name).is_file(), name
    records = read_run(out)
    assert records.dataset_names == ["math", "wiki"]
    assert records.domain_names == ["math", "orca", "mmlu"]
    assert records.targets == [0] and records.constraints == [1, 2]
    assert [row.step for row in records.evaluations] == [0, 4, 8]
    assert [row.step for row in records.updates] == [0, 2, 4]
    for update in records.updates:
        slopes = np.array(update.slope_matrix)
        assert slopes.shape == (3, 2) and np.isfinite(slopes).all()
        assert abs(sum(update.weights) - 1) < 1e-9
        # Every horizon is closed by a later anchor or the final evaluation.
        assert update.realized_losses is not None and update.prediction_error is not None
    assert records.updates[0].recycled_anchor and not records.updates[1].recycled_anchor
    # Accuracy is stored as -accuracy, in [-1, 0].
    assert all(-1.0 <= row.eval["mmlu"] <= 0.0 for row in records.evaluations)

    # The core metrics read the folder back and agree with the summary.
    points = records.eval_points()
    reduction = metrics.constrained_perplexity_reduction(
        points, records.targets, records.constraints
    )
    assert summary["constrained_ppl_reduction"] == pytest.approx(reduction)
    assert summary["feasible"] == metrics.run_feasible(points, records.targets, records.constraints)
    # This tiny run (seed 0, on CPU) keeps its constraints, so a best checkpoint exists.
    assert summary["feasible"]
    step = summary["best_checkpoint"]["step"]
    assert (out / "best_checkpoint" / "adapter_model.safetensors").is_file()
    assert (out / "best_checkpoint" / "step.txt").read_text().strip() == str(step)
    # The best checkpoint carries its model card (what it was trained on, with which mixture).
    card = (out / "best_checkpoint" / "README.md").read_text()
    assert card.startswith("---\n") and MARKER in card and f"step {step}" in card
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert RunConfig.model_validate(saved) == config


def test_a_domain_can_have_its_own_evaluation_batch_size(tokenizer_dir, tmp_path):
    data = tiny_config(tokenizer_dir, tmp_path / "run")
    data["datasets"][3]["eval_batch_size"] = 5  # the accuracy constraint
    built = build_run(RunConfig.from_dict(data))
    sizes = {d.name: [len(b["input_ids"]) for b in d.eval_batches] for d in built.learner.domains}
    assert sizes == {"math": [2, 2, 2], "orca": [2, 2, 2], "mmlu": [5, 5, 5]}
    assert [len(b["input_ids"]) for b in built.learner.domains[2].test_batches] == [5, 5, 5]


def test_fixed_run_through_the_cli_with_overrides(tokenizer_dir, tmp_path, capsys):
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(tiny_config(tokenizer_dir, tmp_path / "unused")))
    out = tmp_path / "fixed"
    code = cli_main(
        [
            "run",
            str(config_path),
            "--out",
            str(out),
            "--no-progress",
            "method.name=fixed",
            "method.schedule=[0]",
            "method.weights={math: 0.25, wiki: 0.75}",
        ]
    )
    assert code == 0
    records = read_run(out)
    assert len(records.updates) == 1
    assert records.updates[0].weights.tolist() == [0.25, 0.75]
    assert all(row.weights == {"math": 0.25, "wiki": 0.75} for row in records.evaluations)
    assert json.loads((out / "summary.json").read_text())["method"] == "fixed"


def test_existing_run_folder_is_never_overwritten(tokenizer_dir, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "metrics.jsonl").write_text("precious\n")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(tiny_config(tokenizer_dir, out)))
    assert cli_main(["run", str(config_path), "--no-progress"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == "precious\n"


def test_bad_config_is_a_one_line_error(tmp_path, capsys):
    config_path = tmp_path / "bad.yaml"
    config_path.write_text("model: {name_or_path: x}\ndatasets: []\ntraining: {total_steps: -1}\n")
    assert cli_main(["run", str(config_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "training.total_steps" in err and "datasets" in err


def test_gradient_alignment_run(tokenizer_dir, tmp_path):
    data = tiny_config(
        tokenizer_dir, tmp_path / "ga", name="gradient-alignment", alignment_batches=2
    )
    # Gradient-alignment slopes are not accuracy changes: the config refuses accuracy constraints.
    data["datasets"] = [d for d in data["datasets"] if d.get("metric") != "accuracy"]
    summary = run(RunConfig.from_dict(data), progress=False)
    records = read_run(tmp_path / "ga")
    assert summary["method"] == "gradient-alignment"
    assert [u.step for u in records.updates] == [0, 2, 4]
    for update in records.updates:
        assert update.policy == "gradient-alignment"
        slopes = np.array(update.slope_matrix)
        assert (
            slopes.shape == (2, 2)
            and np.isfinite(slopes).all()
            and abs(sum(update.weights) - 1) < 1e-9
        )
    # The cost counts the alignment gradients, 3 updates x (2 domains + 2 datasets) x 2 batches
    # at a training step's cost, and the anchor of step 2 (2 domains x 2 reduced batches), over
    # 8 training steps and 3 evaluations of 2 domains x (3 eval + 3 test) batches.
    fixed_run = 8 * 3.0 + 3 * 2 * 6
    assert summary["predicted_cost"] == pytest.approx(
        (fixed_run + 3 * 4 * 2 * 3.0 + 2 * 2) / fixed_run
    )


def test_missing_tracker_is_a_clear_error(tokenizer_dir, tmp_path, monkeypatch):
    from dynamics.engine import tracking

    monkeypatch.setitem(tracking.TRACKER_MODULES, "wandb", "no_such_tracker_module_xyz")
    data = tiny_config(tokenizer_dir, tmp_path / "tracked")
    data["trackers"] = ["wandb"]
    with pytest.raises(ValueError, match="pip install wandb"):
        run(RunConfig.from_dict(data), progress=False)
    assert not (tmp_path / "tracked").exists()  # nothing half-made was left behind


def test_data_error_leaves_no_run_folder(tokenizer_dir, tmp_path, capsys):
    data = tiny_config(tokenizer_dir, tmp_path / "never")
    data["datasets"][1]["path"] = str(tmp_path / "missing.jsonl")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(data))
    assert cli_main(["run", str(config_path), "--no-progress"]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_backtracking_returns_to_the_last_feasible_state_and_marks_what_it_left(
    tokenizer_dir, tmp_path, capsys, monkeypatch
):
    # The stretch after step 4 breaks the orca constraint (scripted), so the run returns to
    # step 4, re-decides there with the violation as a margin, and goes on.
    data = orca_only(tiny_config(tokenizer_dir, tmp_path / "run", backtrack=1))
    scripted_orca(monkeypatch, broken_steps={8})
    summary = run(RunConfig.from_dict(data), progress=True)
    records = read_run(tmp_path / "run")
    assert len(summary["backtracks"]) == 1
    backtrack = summary["backtracks"][0]
    assert backtrack["to_step"] < backtrack["from_step"]
    assert backtrack["violations"]["orca"] == backtrack["margins"]["orca"] > 0
    # The progress bar's total grew by the steps trained again, and it ended full.
    work = 8 + backtrack["retrained_steps"]
    assert backtrack["retrained_steps"] > 0 and f"{work}/{work}" in capsys.readouterr().err
    marked = [row.step for row in records.evaluations if row.backtracked]
    assert marked == [backtrack["from_step"]] and not any(
        r.feasible for r in records.evaluations if r.backtracked
    )
    assert [p.step for p in records.eval_points()] == [0, 4, 8]
    abandoned = [u for u in records.updates if u.abandoned]
    redecided = [u for u in records.updates if u.backtrack is not None]
    assert [u.step for u in redecided] == [backtrack["to_step"]]
    assert abandoned and all(u.step >= backtrack["to_step"] for u in abandoned)
    # The learner is back in exactly the state it left: the same anchor, bit for bit.
    first = next(u for u in abandoned if u.step == backtrack["to_step"])
    assert np.array_equal(redecided[0].current_losses, first.current_losses)


def orca_only(data: dict) -> dict:
    """The tiny run with orca as its one constraint (the quiz left out)."""
    data["datasets"] = [d for d in data["datasets"] if d["name"] != "mmlu"]
    return data


def scripted_orca(monkeypatch, broken_steps: set[int]) -> None:
    """Script the orca constraint of the tiny run: kept by 0.01 at every evaluation of the
    eval split except the first visit of each step in ``broken_steps``, broken there by
    0.01. Every batch of orca reads the scripted value, reduced evaluations too, so probes
    see orca flat and the learner trains as before."""
    from dynamics.engine.learner import HFLearner

    evaluate = HFLearner.evaluate
    reference = 5.0  # orca's loss at step 0, and so the level it is constrained to
    visits: list[int] = []

    def scripted(self, split, num_batches=None):
        evaluation = evaluate(self, split, num_batches)
        if split == "eval":
            step = self.main_steps
            if num_batches is None:
                visits.append(step)
            first_visit = visits.count(step) == 1 and step == max(visits)
            slack = 0.0 if step == 0 else -0.01 if step in broken_steps and first_visit else 0.01
            evaluation.per_batch[self.domain_names.index("orca")] = reference - slack
        return evaluation

    monkeypatch.setattr(HFLearner, "evaluate", scripted)


def test_backtrack_patience_returns_only_after_broken_evaluations_in_a_row(
    tokenizer_dir, tmp_path, monkeypatch
):
    # Evaluations every 4 steps, orca (the one constraint) broken at step 8 and kept again at
    # step 12: with patience 2 that costs no return.
    data = orca_only(
        tiny_config(tokenizer_dir, tmp_path / "once", backtrack=1, backtrack_patience=2)
    )
    data["training"]["total_steps"] = 12
    with monkeypatch.context() as patch:
        scripted_orca(patch, broken_steps={8})
        assert not run(RunConfig.from_dict(data), progress=False)["backtracks"]
    slack = {
        row.step: row.constraint_slack["orca"] for row in read_run(tmp_path / "once").evaluations
    }
    assert slack[8] == pytest.approx(-0.01) and slack[12] == pytest.approx(0.01)
    # Every 2 steps, broken at steps 8 and 10: the run returns to step 6 after both, both
    # rows of metrics.jsonl say they were left behind, and the steps trained again keep it.
    data["output_dir"] = str(tmp_path / "twice")
    data["evaluation"]["interval"] = 2
    with monkeypatch.context() as patch:
        scripted_orca(patch, broken_steps={8, 10})
        (backtrack,) = run(RunConfig.from_dict(data), progress=False)["backtracks"]
    records = read_run(tmp_path / "twice")
    assert (backtrack["from_step"], backtrack["to_step"], backtrack["retrained_steps"]) == (
        10,
        6,
        4,
    )
    assert [row.step for row in records.evaluations if row.backtracked] == [8, 10]
    assert not any(row.feasible for row in records.evaluations if row.backtracked)
    assert all(row.feasible for row in records.evaluations if row.step > 0 and not row.backtracked)
    assert [p.step for p in records.eval_points()] == list(range(0, 13, 2))


def test_under_sharding_every_rank_makes_rank_0s_gathering_calls_in_the_same_order(
    tokenizer_dir, tmp_path, monkeypatch
):
    """Under FSDP2 rank 0 gathers the whole model for each new best checkpoint and the whole
    training state for each resume point, and the other ranks (ShardedSaves) must make the
    same collective calls in the same order, or the run hangs. Checked in one process: both
    sides follow one run (a feasible best, resume points, a backtrack) and log their calls."""
    from dynamics.engine import run_folder
    from dynamics.engine.learner import HFLearner

    calls: dict[str, list[str]] = {"rank 0": [], "other ranks": []}
    side = ["rank 0"]
    gathered = HFLearner.gathered
    monkeypatch.setattr(
        HFLearner,
        "gathered",
        lambda self, snapshot: calls[side[0]].append("gathered") or gathered(self, snapshot),
    )
    monkeypatch.setattr(
        HFLearner, "gathered_model_state", lambda self: calls[side[0]].append("model") or None
    )

    def both(name: str):
        original = getattr(run_folder.RunFolderWriter, name)

        def call(self, *args):
            side[0] = "rank 0"
            original(self, *args)
            side[0] = "other ranks"
            if not hasattr(self, "gathering"):
                self.gathering = run_folder.ShardedSaves(self.parts)
            getattr(self.gathering, name)(*args)
            side[0] = "rank 0"

        monkeypatch.setattr(run_folder.RunFolderWriter, name, call)

    both("on_evaluation")
    both("on_checkpoint")
    data = orca_only(tiny_config(tokenizer_dir, tmp_path / "run", backtrack=1))
    scripted_orca(monkeypatch, broken_steps={8})  # a backtrack from step 8 to step 4
    summary = run(RunConfig.from_dict(data), progress=False)
    assert summary["backtracks"] and summary["feasible"]
    assert calls["rank 0"] == calls["other ranks"]
    assert "model" in calls["rank 0"] and "gathered" in calls["rank 0"]


def poison_losses(monkeypatch, method, when, factor=float("nan")):
    """Multiply every training loss by ``factor`` (NaN or inf) while a call of
    ``HFLearner.<method>`` runs for which ``when(call_number, *args)`` holds; returns the
    calls' arguments."""
    from dynamics.engine.learner import HFLearner

    calls: list[tuple] = []
    original, loss = getattr(HFLearner, method), HFLearner._training_loss
    poisoned = {"on": False}

    def wrapped(self, *args):
        calls.append(args)
        poisoned["on"] = when(len(calls), *args)
        try:
            return original(self, *args)
        finally:
            poisoned["on"] = False

    def poisoned_loss(self, batch):
        value = loss(self, batch)
        return value * factor if poisoned["on"] else value

    monkeypatch.setattr(HFLearner, method, wrapped)
    monkeypatch.setattr(HFLearner, "_training_loss", poisoned_loss)
    return calls


def poison_second_training_stretch(monkeypatch):
    """Every step of the main run's second ``train`` call gets a NaN loss (probes untouched);
    returns the recorded ``(steps, weights)`` of every ``train`` call."""
    return poison_losses(monkeypatch, "train", lambda n, steps, weights: n == 2)


def test_a_nan_training_step_is_skipped_and_recorded(tokenizer_dir, tmp_path, monkeypatch):
    calls = poison_second_training_stretch(monkeypatch)
    data = tiny_config(tokenizer_dir, tmp_path / "run")
    data["training"]["max_skipped_steps"] = 8
    summary = run(RunConfig.from_dict(data), progress=False)
    first, second = calls[0][0], calls[1][0]
    assert second >= 1
    # The second stretch starts after the first (steps 0..first-1) and is skipped whole.
    assert [s["step"] for s in summary["skipped_steps"]] == list(range(first, first + second))
    assert all(s["datasets"] for s in summary["skipped_steps"])
    records = read_run(tmp_path / "run")
    for row in records.evaluations:
        assert all(np.isfinite(v) for v in row.eval.values())
    for update in records.updates:
        assert np.isfinite(np.array(update.slope_matrix)).all()


def test_too_many_nan_steps_stop_the_run_with_one_line(tokenizer_dir, tmp_path, monkeypatch):
    from dynamics.core.learner import Diverged

    poison_second_training_stretch(monkeypatch)
    data = tiny_config(tokenizer_dir, tmp_path / "run")
    data["training"]["max_skipped_steps"] = 0
    with pytest.raises(Diverged, match=r"training\.max_skipped_steps=0") as info:
        run(RunConfig.from_dict(data), progress=False)
    assert "\n" not in str(info.value)
    # What was trained and logged before the divergence stays.
    assert (tmp_path / "run" / "metrics.jsonl").is_file()


def test_a_diverging_probe_is_discarded_and_its_dataset_left_out(
    tokenizer_dir, tmp_path, monkeypatch
):
    poison_losses(
        monkeypatch, "probe", lambda n, steps, dataset: dataset == 1, float("inf")
    )  # every "wiki" probe
    summary = run(RunConfig.from_dict(tiny_config(tokenizer_dir, tmp_path / "run")), progress=False)
    records = read_run(tmp_path / "run")
    assert [u.unreliable_datasets for u in records.updates] == [["wiki"]] * 3
    assert all(u.weights.tolist() == [1.0, 0.0] for u in records.updates)
    assert summary["skipped_steps"] == []  # the main run itself never saw a bad step


def test_relative_noise_perturbs_every_evaluation_repeatably(tokenizer_dir, tmp_path):
    """The sensitivity check's option: the same seed gives the same perturbed run, another
    seed another one, and every recorded evaluation and slope moves by about that much."""

    def slopes_and_evals(name: str, **evaluation) -> tuple[np.ndarray, np.ndarray]:
        data = tiny_config(tokenizer_dir, tmp_path / name)
        data["evaluation"].update(evaluation)
        run(RunConfig.from_dict(data), progress=False)
        records = read_run(tmp_path / name)
        evals = np.array([list(row.eval.values()) for row in records.evaluations])
        return np.array(records.updates[0].slope_matrix), evals

    plain_slopes, plain_evals = slopes_and_evals("plain")
    slopes, evals = slopes_and_evals("noisy", relative_noise=1e-3)
    again_slopes, again_evals = slopes_and_evals("again", relative_noise=1e-3)
    other_slopes, _ = slopes_and_evals("other", relative_noise=1e-3, noise_seed=1)
    np.testing.assert_array_equal(slopes, again_slopes)
    np.testing.assert_array_equal(evals, again_evals)
    assert not np.array_equal(slopes, other_slopes)
    # Step 0 is evaluated before any training: its values differ only by the perturbation.
    np.testing.assert_allclose(evals[0], plain_evals[0], rtol=5e-3, atol=0)
    assert not np.array_equal(evals[0], plain_evals[0])
    assert not np.array_equal(slopes, plain_slopes)


def test_the_best_checkpoint_with_a_margin_is_the_one_the_records_select(tokenizer_dir, tmp_path):
    out = tmp_path / "run"
    data = tiny_config(tokenizer_dir, out)
    data["evaluation"]["selection_margin"] = 2.0
    summary = run(RunConfig.from_dict(data), progress=False)
    records = read_run(out)
    assert records.selection_margin == summary["selection_margin"] == 2.0
    points = records.eval_points()
    # Every evaluation recorded its 3 eval batches per domain, whose means are its values.
    for p in points:
        assert p.eval_batches is not None and p.eval_batches.shape == (3, 3)
        np.testing.assert_allclose(p.eval_batches.mean(axis=1), p.eval)
    best = metrics.best_feasible_checkpoint(
        points, records.targets, records.constraints, margin=2.0
    )
    assert best is not None and summary["best_checkpoint"]["step"] == best.step
    assert (out / "best_checkpoint" / "step.txt").read_text().strip() == str(best.step)
    reduction = metrics.constrained_perplexity_reduction(
        points, records.targets, records.constraints, margin=2.0
    )
    assert summary["constrained_ppl_reduction"] == pytest.approx(reduction)


def test_the_running_best_checkpoint_puts_those_clearing_the_margin_first():
    history = RunHistory(["t", "g"], ["target", "held-out"], (0,), (1,))

    def record(step: int, target: float, batches: list[float]) -> EvaluationRecord:
        per_batch = np.array([[target] * 4, batches])
        return EvaluationRecord(
            step,
            per_batch.mean(axis=1),
            per_batch.mean(axis=1),
            np.array([0.5, 0.5]),
            eval_batches=per_batch,
        )

    history.evaluations.append(record(0, 2.0, [1.0] * 4))
    edge = record(64, 1.5, [0.99, 1.0, 0.97, 1.02])  # feasible, slack 0.005 within its error
    clear = record(128, 1.7, [0.95, 0.96, 0.95, 0.94])  # feasible with room: less target gain
    plain, margin = BestCheckpoint(), BestCheckpoint(2.0)
    for r in (edge, clear):
        history.evaluations.append(r)
    assert plain.update(edge, history) and not plain.update(clear, history)
    assert margin.update(edge, history) and margin.update(clear, history)
    assert plain.record is edge and margin.record is clear
    # Where none clears the margin, the one nearest to clearing it: 1.4 errors inside its
    # reference beats the edge's 0.48 however much more target gain the edge has, and as
    # the records' choice does (metrics.best_feasible_checkpoint).
    closer = record(192, 1.8, [0.98, 0.99, 0.96, 1.01])
    short = BestCheckpoint(2.0)
    assert short.update(edge, history) and short.update(closer, history)
    assert not short.update(record(256, 1.4, [0.99, 1.0, 0.97, 1.02]), history)  # edge again
    points = [history.evaluations[0], edge, closer]
    assert short.record is closer is metrics.best_feasible_checkpoint(points, (0,), (1,), 2.0)


def test_probe_min_lengthens_the_probes_of_short_updates(tokenizer_dir, tmp_path, monkeypatch):
    # Updates at steps 0, 2 and 4 decide 2, 2 and 4 steps; with probe_min 3 every dataset's
    # probe trains 3, 3 and 4 steps, and each update's record says so.
    from dynamics.engine.learner import HFLearner

    probed: list[int] = []
    original = HFLearner.probe

    def counted(self, steps, dataset):
        probed.append(steps)
        return original(self, steps, dataset)

    monkeypatch.setattr(HFLearner, "probe", counted)
    run(
        RunConfig.from_dict(tiny_config(tokenizer_dir, tmp_path / "run", probe_cap=4, probe_min=3)),
        progress=False,
    )
    records = read_run(tmp_path / "run")
    assert [(u.horizon, u.probe_budget) for u in records.updates] == [(2, 3), (2, 3), (4, 4)]
    assert probed == [3, 3, 3, 3, 4, 4]  # two datasets at each update
