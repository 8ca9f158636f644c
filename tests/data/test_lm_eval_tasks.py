"""An lm-evaluation-harness task as a dataset: the project scores it as lm-eval does.

The task is ``examples/lm-eval/tiny_quiz.yaml`` (local JSONL files, one few-shot example),
the model the tiny random-init Llama of the engine tests saved to a folder with the test
tokenizer. ``lm_eval.simple_evaluate`` runs once on it; the project's accuracy (the
learner's ``choice_logits`` argmax over the fixed batches that ``EvalBatches`` builds)
must equal lm-eval's ``acc`` exactly, question by question, and the loss metric must be
the correct choice's continuation log-likelihood that lm-eval computes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dynamics.data.formatting import ChoiceExample, LMExample, build_examples, pad_token_id
from dynamics.data.lm_eval_tasks import task_manager
from dynamics.data.loading import DataError, DataSource, load_rows
from dynamics.engine.batches import EvalBatches, collate_choice, collate_lm
from dynamics.engine.config import ConfigError, RunConfig
from dynamics.engine.learner import choice_logits
from tests.engine.test_run import TINY_LLAMA

lm_eval = pytest.importorskip("lm_eval")

REPO = Path(__file__).resolve().parents[2]
TASK = "tiny_quiz"
INCLUDE = "examples/lm-eval"  # the task's data_files are relative to the repository root


@pytest.fixture(scope="module")
def model_dir(tokenizer_dir, tmp_path_factory) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-model")
    LlamaForCausalLM(LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "model_type"})).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def in_repo():
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        yield


@pytest.fixture(scope="module")
def harness(model_dir, in_repo) -> dict:
    """lm-eval's own results on the tiny model: acc and each document's log-likelihoods."""
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(model_dir), "dtype": "float32", "device": "cpu"},
        tasks=[TASK],
        # The include path's task alone: indexing lm-eval's ~14,700 own tasks takes seconds.
        task_manager=TaskManager(include_path=INCLUDE, include_defaults=False),
        batch_size=4,
        log_samples=True,
    )
    samples = sorted(results["samples"][TASK], key=lambda s: s["doc_id"])
    return {
        "acc": results["results"][TASK]["acc,none"],
        "lls": [[float(resp[0]) for resp in s["filtered_resps"]] for s in samples],
        "acc_per_doc": [s["acc"] for s in samples],
    }


def _source(metric: str) -> DataSource:
    return DataSource(
        name="quiz", lm_eval_task=TASK, lm_eval_include_path=INCLUDE, format="multiple_choice", metric=metric
    )


def _model(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


def test_accuracy_equals_lm_eval_acc(model_dir, harness, in_repo):
    model, tokenizer = _model(model_dir)
    source = _source("accuracy")
    rows = load_rows(source)
    examples = build_examples(rows, tokenizer, source, sequence_length=256)
    assert len(examples) == len(harness["lls"]) == 16
    assert all(isinstance(e, ChoiceExample) and e.sequence_lengths is not None for e in examples)
    # The answers are the tasks's own: quiz_test.jsonl's answer column.
    assert [e.answer_index for e in examples] == [1, 2, 1, 3, 0, 1, 2, 1, 2, 3, 2, 0, 2, 1, 1, 1]

    # All questions once, in one fixed batch, as a run evaluates a constraint.
    domain = EvalBatches.build(
        "quiz", examples, examples, num_batches=1, batch_size=len(examples), pad_id=pad_token_id(tokenizer), seed=0
    )
    assert domain.metric == "accuracy"
    batch = domain.eval_batches[0]
    with torch.no_grad():
        scores = choice_logits(model, batch)
    predicted = scores.argmax(dim=-1)
    accuracy = float((predicted == batch["answer_index"]).double().mean())
    assert accuracy == harness["acc"]

    # Question by question, in the task's order: the same summed log-likelihoods, hence the
    # same prediction and the same acc as lm-eval's.
    with torch.no_grad():
        ours = choice_logits(model, collate_choice(examples, pad_token_id(tokenizer))).numpy()
    theirs = np.asarray(harness["lls"])
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4)
    assert ours.argmax(axis=1).tolist() == theirs.argmax(axis=1).tolist()
    answers = np.asarray([e.answer_index for e in examples])
    assert (ours.argmax(axis=1) == answers).astype(float).tolist() == harness["acc_per_doc"]


def test_loss_is_the_correct_continuation(model_dir, harness, in_repo):
    model, tokenizer = _model(model_dir)
    source = _source("loss")
    rows = load_rows(source)
    examples = build_examples(rows, tokenizer, source, sequence_length=256)
    assert all(isinstance(e, LMExample) for e in examples)
    for example, lls, answer in zip(examples, harness["lls"], rows["answer"], strict=True):
        batch = collate_lm([example], pad_token_id(tokenizer))
        tokens = int((batch["labels"][:, 1:] != -100).sum())
        with torch.no_grad():
            loss = float(model(input_ids=batch["input_ids"], labels=batch["labels"]).loss)
        assert loss * tokens == pytest.approx(-lls[answer], abs=1e-4)


def test_a_missing_task_is_named_with_the_fix(in_repo, monkeypatch):
    # lm-eval's own TaskManager and its failure, with lm-eval's ~14,700 own tasks left out of
    # the index (15 s): a name that is none of them fails the same way.
    from lm_eval.tasks import TaskManager

    monkeypatch.setattr(
        "lm_eval.tasks.TaskManager", lambda include_path=None, **_: TaskManager(include_path=include_path, include_defaults=False)
    )
    with pytest.raises(DataError, match=r"lm-eval task 'no_such_task' could not be loaded.*lm_eval_include_path"):
        load_rows(DataSource(lm_eval_task="no_such_task", lm_eval_include_path=INCLUDE, format="multiple_choice"))


def test_local_tasks_are_indexed_without_lm_evals_own(in_repo, monkeypatch):
    local = task_manager([TASK], INCLUDE)
    assert local.all_tasks == [TASK]  # lm-eval's ~14,700 tasks left out
    # Any name that is not a task of the include path (one of lm-eval's, a group, a tag)
    # gets lm-eval's own tasks as well.
    made = []

    class Recorded:
        def __init__(self, include_path=None, include_defaults=True):
            made.append(include_defaults)
            self.all_subtasks = [TASK] if include_path else []

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Recorded)
    task_manager([TASK, "arc_easy"], INCLUDE)
    assert made == [False, True]
    made.clear()
    task_manager(["arc_easy"], None)
    assert made == [True]


def _config(**entry) -> dict:
    return {
        "model": {"init_config": TINY_LLAMA, "tokenizer": "examples/tiny-tokenizer"},
        "datasets": [
            {"name": "math", "path": "tests/fixtures/metamath.jsonl", "role": "target", "format": "instruction"},
            {"name": "quiz", "lm_eval_task": TASK, "lm_eval_include_path": INCLUDE, **entry},
        ],
    }


def test_config_entries():
    config = RunConfig.from_dict(_config(role="constraint", metric="accuracy"))
    source = config.datasets[1].data_source()
    assert (source.lm_eval_task, source.format, source.metric) == (TASK, "multiple_choice", "accuracy")
    # Trained on (the correct continuations) with metric loss.
    assert RunConfig.from_dict(_config(role="target", metric="loss")).datasets[1].role == "target"
    with pytest.raises(ConfigError, match=r"quiz.*can only be a constraint: set role: constraint, or metric: loss"):
        RunConfig.from_dict(_config(role="target", metric="accuracy"))
    with pytest.raises(ConfigError, match=r"quiz.*builds its rows with the task's own.*remove path, columns"):
        RunConfig.from_dict(_config(role="constraint", path="x.jsonl", columns={"question": "q"}))
    with pytest.raises(ConfigError, match=r"lm_eval_include_path is searched for lm_eval_task; set lm_eval_task"):
        RunConfig.from_dict(_config(role="constraint", lm_eval_task=None))
