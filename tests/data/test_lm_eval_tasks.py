"""An lm-evaluation-harness task as a dataset: the project scores it as lm-eval does.

The tasks are ``examples/lm-eval/tiny_quiz.yaml`` (local JSONL files, one few-shot example)
and those of ``tests/fixtures/lm-eval``: ``quiz_norm`` (acc_norm), ``quiz_spaces``
(contexts ending in a space), ``quiz_shuffled`` (choices shuffled by ``process_docs`` with
Python's ``random``), ``tinyMMLU`` (lm-eval's config over a few of the dataset's rows) and
the group ``quiz_group``. The model is the tiny random-init Llama of the engine tests saved
to a folder with the test tokenizer. ``lm_eval.simple_evaluate`` runs once on all of them;
the project's rows must be lm-eval's requests, its scores lm-eval's log-likelihoods, its
predictions and its metric lm-eval's, document by document, and the loss metric the correct
choice's continuation log-likelihood that lm-eval computes.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from dynamics.data.formatting import ChoiceExample, LMExample, build_examples, pad_token_id
from dynamics.data.lm_eval_tasks import encode_pairs, render_chats, task_manager
from dynamics.data.loading import DataError, DataSource, load_rows
from dynamics.engine.batches import EvalBatches, collate_choice, collate_lm
from dynamics.engine.config import ConfigError, RunConfig
from dynamics.engine.learner import choice_logits
from tests.engine.test_run import TINY_LLAMA

lm_eval = pytest.importorskip("lm_eval")

REPO = Path(__file__).resolve().parents[2]
TASK = "tiny_quiz"
INCLUDE = "examples/lm-eval"  # the task's data_files are relative to the repository root
FIXTURES = "tests/fixtures/lm-eval"
# quiz_group's samples are its tasks' (quiz_spaces, quiz_norm), which lm-eval refuses to be
# named beside it. quiz_shuffled is evaluated alone (``shuffled``): the `random` draws of its
# process_docs depend on the tasks loaded before it in the same simple_evaluate.
FIXTURE_TASKS = ["tinyMMLU", "quiz_group"]


@pytest.fixture(scope="module")
def model_dir(tokenizer_dir, tmp_path_factory) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-model")
    LlamaForCausalLM(
        LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "model_type"})
    ).save_pretrained(folder)
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
    return _simple_evaluate(model_dir, [*FIXTURE_TASKS, TASK])


@pytest.fixture(scope="module")
def shuffled(model_dir, in_repo) -> dict:
    """lm-eval's requests and log-likelihoods on quiz_shuffled, evaluated alone."""
    return _simple_evaluate(model_dir, ["quiz_shuffled"])["tasks"]["quiz_shuffled"]


def _simple_evaluate(model_dir: Path, tasks: list[str], **options) -> dict:
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(model_dir), "dtype": "float32", "device": "cpu"},
        tasks=tasks,
        # The include paths' tasks alone: indexing lm-eval's ~14,700 own tasks takes seconds.
        task_manager=TaskManager(include_path=[FIXTURES, INCLUDE], include_defaults=False),
        batch_size=4,
        log_samples=True,
        **options,
    )
    by_task = {}
    for task, samples in results["samples"].items():
        samples = sorted(samples, key=lambda s: s["doc_id"])
        by_task[task] = {
            "lls": [[float(resp[0]) for resp in s["filtered_resps"]] for s in samples],
            "requests": [[tuple(pair) for pair in s["arguments"]] for s in samples],
            "per_doc": {m: [s[m] for s in samples] for m in ("acc", "acc_norm") if m in samples[0]},
        }
    for task, metrics in results["results"].items():
        by_task.setdefault(task, {}).update(
            {m: metrics[f"{m},none"] for m in ("acc", "acc_norm") if f"{m},none" in metrics}
        )
    return {**by_task.get(TASK, {}), "tasks": by_task}


def _source(metric: str, task: str = TASK, lm_eval_metric: str = "acc", **lm_eval) -> DataSource:
    return DataSource(
        name="quiz",
        lm_eval_task=task,
        lm_eval_include_path=INCLUDE if task == TASK else FIXTURES,
        format="multiple_choice",
        metric=metric,
        lm_eval_metric=lm_eval_metric,
        **lm_eval,
    )


def _model(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(
        model_dir
    )


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
        "quiz",
        examples,
        examples,
        num_batches=1,
        batch_size=len(examples),
        pad_id=pad_token_id(tokenizer),
        seed=0,
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
    assert (ours.argmax(axis=1) == answers).astype(float).tolist() == harness["per_doc"]["acc"]


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


def _scores(model, tokenizer, source: DataSource, sequence_length: int = 256):
    """The rows of ``source``, its examples and the project's (B, K) choice scores."""
    rows = load_rows(source)
    examples = build_examples(rows, tokenizer, source, sequence_length=sequence_length)
    with torch.no_grad():
        scores = choice_logits(model, collate_choice(examples, pad_token_id(tokenizer))).numpy()
    return rows, examples, scores


@pytest.mark.parametrize(
    ("task", "metric"),
    [
        ("quiz_spaces", "acc"),  # contexts ending in a space
        (TASK, "acc"),  # one few-shot example
        ("quiz_norm", "acc"),
        ("quiz_norm", "acc_norm"),
        ("tinyMMLU", "acc_norm"),  # the task reports acc_norm only
    ],
)
def test_documents_scores_and_metric_are_lm_evals(model_dir, harness, in_repo, task, metric):
    model, tokenizer = _model(model_dir)
    theirs = harness["tasks"][task]
    rows, _, scores = _scores(model, tokenizer, _source("accuracy", task, metric))
    # lm-eval's requests: prompts, few-shot examples, choices in their (shuffled) order.
    assert [list(zip(r["contexts"], r["continuations"], strict=True)) for r in rows] == theirs[
        "requests"
    ]
    lls = np.asarray(theirs["lls"])
    divisors = (
        np.asarray(rows["choice_lengths"], dtype=np.float64)
        if metric == "acc_norm"
        else np.ones_like(lls)
    )
    np.testing.assert_allclose(scores * divisors, lls, rtol=0, atol=1e-4)
    predicted = scores.argmax(axis=1)
    assert predicted.tolist() == (lls / divisors).argmax(axis=1).tolist()
    per_doc = (predicted == np.asarray(rows["answer"])).astype(float)
    assert per_doc.tolist() == theirs["per_doc"][metric]
    assert per_doc.mean() == theirs[metric]


def test_choices_shuffled_by_process_docs_are_in_lm_evals_order(model_dir, shuffled, in_repo):
    # simple_evaluate seeds `random` before it builds the task, so process_docs draws the same
    # order. (lm-eval's own acc on such a task is not compared: it runs process_docs again
    # for the answers it scores, which then follow another shuffle than its requests.)
    model, tokenizer = _model(model_dir)
    rows, _, scores = _scores(model, tokenizer, _source("accuracy", "quiz_shuffled"))
    assert [list(zip(r["contexts"], r["continuations"], strict=True)) for r in rows] == shuffled[
        "requests"
    ]
    np.testing.assert_allclose(scores, np.asarray(shuffled["lls"]), rtol=0, atol=1e-4)


def test_few_shot_count_and_system_instruction_are_passed_as_simple_evaluate_passes_them(
    model_dir, in_repo
):
    options = {"num_fewshot": 3, "system_instruction": "Answer the question."}
    theirs = _simple_evaluate(model_dir, [TASK], **options)["tasks"][TASK]
    model, tokenizer = _model(model_dir)
    source = _source(
        "accuracy", lm_eval_num_fewshot=3, lm_eval_system_instruction="Answer the question."
    )
    rows, _, scores = _scores(model, tokenizer, source)
    assert rows[0]["contexts"][0].startswith("Answer the question.")
    assert rows[0]["contexts"][0].count("Question:") == 4  # three examples and the document
    assert [list(zip(r["contexts"], r["continuations"], strict=True)) for r in rows] == theirs[
        "requests"
    ]
    np.testing.assert_allclose(scores, np.asarray(theirs["lls"]), rtol=0, atol=1e-4)
    # A task whose config says num_fewshot: 0 keeps 0, as simple_evaluate keeps it.
    zero_shot = load_rows(_source("loss", "tinyMMLU"))["contexts"]
    assert load_rows(_source("loss", "tinyMMLU", lm_eval_num_fewshot=3))["contexts"] == zero_shot


@pytest.mark.parametrize("multiturn", [True, False], ids=["multiturn", "single-turn"])
def test_chat_template_is_applied_as_simple_evaluate_applies_it(model_dir, in_repo, multiturn):
    options = {
        "apply_chat_template": True,
        "fewshot_as_multiturn": multiturn,
        "system_instruction": "Be brief.",
    }
    theirs = _simple_evaluate(model_dir, [TASK], **options)["tasks"][TASK]
    model, tokenizer = _model(model_dir)
    source = _source(
        "accuracy",
        lm_eval_apply_chat_template=True,
        lm_eval_fewshot_as_multiturn=multiturn,
        lm_eval_system_instruction="Be brief.",
    )
    rows, _, scores = _scores(model, tokenizer, source)
    contexts = render_chats(tokenizer, [c for r in rows for c in r["contexts"]])
    assert contexts[0].startswith("<|im_start|>system\nBe brief.")
    assert contexts[0].count("<|im_start|>user") == (2 if multiturn else 1)
    continuations = [c for r in rows for c in r["continuations"]]
    assert list(zip(contexts, continuations, strict=True)) == [
        pair for doc in theirs["requests"] for pair in doc
    ]
    np.testing.assert_allclose(scores, np.asarray(theirs["lls"]), rtol=0, atol=1e-4)


def test_acc_norm_and_acc_pick_differently_on_quiz_norm(harness):
    # Else the acc_norm case above could pass while scoring acc.
    theirs = harness["tasks"]["quiz_norm"]
    assert theirs["per_doc"]["acc"] != theirs["per_doc"]["acc_norm"]


def test_a_group_is_one_dataset_of_its_tasks_documents(model_dir, harness, in_repo):
    model, tokenizer = _model(model_dir)
    rows, _, scores = _scores(model, tokenizer, _source("accuracy", "quiz_group"))
    assert sorted(set(rows["task"])) == ["quiz_norm", "quiz_spaces"] and len(rows) == 32
    accuracy = float((scores.argmax(axis=1) == np.asarray(rows["answer"])).mean())
    assert accuracy == pytest.approx(harness["tasks"]["quiz_group"]["acc"], abs=1e-12)


def test_building_rows_leaves_the_global_random_streams_as_they_were(in_repo):
    # numpy's legacy global generator: the one lm-eval seeds.
    random.seed(7)
    np.random.seed(7)  # noqa: NPY002
    torch.manual_seed(7)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.random.get_rng_state())  # noqa: NPY002
    load_rows(_source("accuracy", "quiz_shuffled"))
    assert random.getstate() == before[0]
    assert (np.random.get_state()[1] == before[1]).all()  # noqa: NPY002
    assert torch.equal(torch.random.get_rng_state(), before[2])


def test_documents_longer_than_the_sequence_are_counted_in_one_warning(model_dir, in_repo, caplog):
    _, tokenizer = _model(model_dir)
    source = _source("accuracy")
    rows = load_rows(source)
    full = build_examples(rows, tokenizer, source, sequence_length=256)
    longest = [int(e.sequence_lengths.max()) for e in full]
    length = sorted(longest)[len(longest) // 2]  # about half the documents do not fit
    expected = sum(n > length for n in longest)
    assert 0 < expected < len(longest)
    for metric in ("accuracy", "loss"):
        caplog.clear()
        with caplog.at_level("WARNING", logger="dynamics.data.formats.lm_eval_choices"):
            build_examples(rows, tokenizer, _source(metric), sequence_length=length)
        warnings = [
            r.getMessage()
            for r in caplog.records
            if "longer than sequence_length" in r.getMessage()
        ]
        assert len(warnings) == 1
        assert f"{expected} of 16 documents" in warnings[0]


def test_pairs_are_encoded_as_lm_evals_hf_model_encodes_them(model_dir, in_repo):
    # lm-eval's own HFLM, loaded from the model folder as simple_evaluate loads it: its
    # _encode_pair, and its prefix token for an empty context.
    from lm_eval.models.huggingface import HFLM

    real = HFLM(pretrained=str(model_dir), device="cpu", dtype="float32", batch_size=1)
    _, tokenizer = _model(model_dir)
    rows = load_rows(_source("accuracy", "quiz_spaces"))
    contexts = [c for r in rows for c in r["contexts"]] + ["", "Q: ", "Answer:  "]
    continuations = [c for r in rows for c in r["continuations"]] + ["Mars", "Mars", " Mars"]
    theirs = [
        ([real.prefix_token_id], real.tok_encode(continuation))
        if context == ""
        else real._encode_pair(context, continuation)
        for context, continuation in zip(contexts, continuations, strict=True)
    ]
    assert encode_pairs(tokenizer, contexts, continuations) == theirs
    assert tokenizer.pad_token is None  # the tokenizer given is left as it was


def test_a_missing_task_is_named_with_the_fix(in_repo, monkeypatch):
    # lm-eval's own TaskManager and its failure, with lm-eval's ~14,700 own tasks left out of
    # the index (15 s): a name that is none of them fails the same way.
    from lm_eval.tasks import TaskManager

    monkeypatch.setattr(
        "lm_eval.tasks.TaskManager",
        lambda include_path=None, **_: TaskManager(
            include_path=include_path, include_defaults=False
        ),
    )
    with pytest.raises(
        DataError, match=r"lm-eval task 'no_such_task' could not be loaded.*lm_eval_include_path"
    ):
        load_rows(
            DataSource(
                lm_eval_task="no_such_task", lm_eval_include_path=INCLUDE, format="multiple_choice"
            )
        )


def test_local_tasks_are_indexed_without_lm_evals_own(in_repo, monkeypatch):
    local = task_manager([TASK], INCLUDE)
    assert local.all_tasks == [TASK]  # lm-eval's ~14,700 tasks left out
    assert (
        "quiz_group" in task_manager(["quiz_group"], FIXTURES).all_groups
    )  # a local group is local too
    # Any name that is not a task or group of the include path gets lm-eval's own tasks as well.
    made = []

    class Recorded:
        def __init__(self, include_path=None, include_defaults=True):
            made.append(include_defaults)
            self.all_tasks = [TASK] if include_path else []

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
            {
                "name": "math",
                "path": "tests/fixtures/metamath.jsonl",
                "role": "target",
                "format": "instruction",
            },
            {"name": "quiz", "lm_eval_task": TASK, "lm_eval_include_path": INCLUDE, **entry},
        ],
    }


def test_config_entries():
    config = RunConfig.from_dict(_config(role="constraint", metric="accuracy"))
    source = config.datasets[1].data_source()
    assert (source.lm_eval_task, source.format, source.metric) == (
        TASK,
        "multiple_choice",
        "accuracy",
    )
    # Trained on (the correct continuations) with metric loss.
    assert RunConfig.from_dict(_config(role="target", metric="loss")).datasets[1].role == "target"
    with pytest.raises(
        ConfigError, match=r"quiz.*can only be a constraint: set role: constraint, or metric: loss"
    ):
        RunConfig.from_dict(_config(role="target", metric="accuracy"))
    with pytest.raises(
        ConfigError, match=r"quiz.*builds its rows with the task's own.*remove path, columns"
    ):
        RunConfig.from_dict(_config(role="constraint", path="x.jsonl", columns={"question": "q"}))
    with pytest.raises(
        ConfigError, match=r"'quiz': lm_eval_include_path configure lm_eval_task; set lm_eval_task"
    ):
        RunConfig.from_dict(_config(role="constraint", lm_eval_task=None))
    with pytest.raises(
        ConfigError, match=r"lm_eval_metric, lm_eval_num_fewshot configure lm_eval_task"
    ):
        RunConfig.from_dict(
            _config(
                role="constraint",
                lm_eval_task=None,
                lm_eval_include_path=None,
                lm_eval_metric="acc_norm",
                lm_eval_num_fewshot=2,
            )
        )
    with pytest.raises(
        ConfigError, match=r"lm_eval_metric='acc_norm' picks what metric='accuracy' scores.*remove"
    ):
        RunConfig.from_dict(_config(role="constraint", metric="loss", lm_eval_metric="acc_norm"))
    with pytest.raises(ConfigError, match=r"lm_eval_metric"):
        RunConfig.from_dict(_config(role="constraint", lm_eval_metric="acc_bytes"))


def _docs_entries() -> list[dict]:
    """The dataset entries of docs/lm-eval.md's first YAML example."""
    import yaml

    text = (REPO / "docs" / "lm-eval.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    return yaml.safe_load(block)["datasets"]


def test_the_documented_tiny_mmlu_entry_runs_offline_from_the_fixtures(in_repo):
    # tinyMMLU reports acc_norm only; the documented entry asks for it, and the fixture task
    # (lm-eval's tinyMMLU config over a few local rows) stands in for the hub's.
    entry = next(e for e in _docs_entries() if e["lm_eval_task"] == "tinyMMLU")
    assert entry["lm_eval_metric"] == "acc_norm"
    config = RunConfig.from_dict(
        _config(**{**entry, "name": "quiz", "lm_eval_include_path": FIXTURES})
    )
    source = config.datasets[1].data_source()
    examples = build_examples(
        load_rows(source),
        AutoTokenizer.from_pretrained("examples/tiny-tokenizer"),
        source,
        sequence_length=256,
    )
    assert [e.answer_index for e in examples] == [1, 0, 2, 3, 1, 1]  # tinymmlu_test.jsonl's answers
    assert all(
        e.score_divisors.tolist() == [1.0] * 4 for e in examples
    )  # the choices are the letters A-D


def test_lm_evals_own_tiny_mmlu_names_the_package_its_aggregation_needs(in_repo):
    # lm-eval's tinyMMLU.yaml itself (its folder as the include path, so lm-eval's other tasks
    # are not indexed): its aggregation imports tinyBenchmarks before any data is read.
    tiny_benchmarks = Path(lm_eval.__file__).parent / "tasks" / "tinyBenchmarks"
    source = DataSource(
        lm_eval_task="tinyMMLU",
        lm_eval_include_path=str(tiny_benchmarks),
        format="multiple_choice",
        lm_eval_metric="acc_norm",
    )
    with pytest.raises(
        DataError,
        match=r"'tinyMMLU' could not be loaded \(`tinyBenchmarks` is required.*pip install",
    ):
        load_rows(source)


def test_the_metric_asked_for_is_the_one_checked(in_repo):
    with pytest.raises(
        DataError,
        match=r"task 'tinyMMLU' reports no 'acc' \(it reports \['acc_norm'\]\); "
        r"set lm_eval_metric: acc_norm",
    ):
        load_rows(_source("accuracy", "tinyMMLU"))
    # The loss of the correct continuation needs neither (the answer is acc_norm's).
    assert load_rows(_source("loss", "tinyMMLU"))["answer"] == [1, 0, 2, 3, 1, 1]
    with pytest.raises(
        DataError,
        match=r"task 'quiz_spaces' reports no 'acc_norm' \(it reports \['acc'\]\); "
        r"set lm_eval_metric: acc",
    ):
        load_rows(_source("accuracy", "quiz_spaces", "acc_norm"))
