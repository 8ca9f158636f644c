"""Rows of an lm-evaluation-harness task, built by the task's own code (docs/lm-eval.md).

Public API:

- ``task_manager(names, include_path)``: lm-eval's ``TaskManager`` for those tasks, without
  indexing lm-eval's own tasks when every name is a task of ``include_path``.
- ``task_rows(source) -> datasets.Dataset``: one row per document of the task's evaluation
  split, as ``lm_eval.simple_evaluate`` builds its requests: the task is loaded with
  ``task_manager`` (lm-eval's ``TaskManager``), its few-shot count is its own
  (0 when it sets none) and its few-shot sampler is seeded as ``simple_evaluate`` seeds it
  by default, and ``Task.build_all_requests`` makes each document's loglikelihood requests:
  a context (``fewshot_context``: description, few-shot examples, ``doc_to_text``) and a
  continuation (``target_delimiter`` + each ``doc_to_choice``). Columns: ``contexts`` and
  ``continuations`` (one string per choice), ``answer`` (the choice that scores ``acc``
  1) and ``doc_id``.
- ``encode_pairs(tokenizer, contexts, continuations)``: the token ids of each
  (context, continuation) pair as lm-eval's ``hf`` model encodes them (its own
  ``loglikelihood`` tokenization: the context's trailing spaces moved to the
  continuation, the whole text encoded and split at the context's length, an empty
  context replaced by the BOS or EOS token).

The correct choice is the one lm-eval itself scores as right: ``Task.process_results`` is
asked, for each choice in turn, what ``acc`` it gives when that choice has the highest
log-likelihood, so the answer follows the task's ``doc_to_target`` (an index, a choice's
text, or ``doc_to_text`` for a task with several inputs) exactly as lm-eval reads it.

``lm_eval`` is the optional extra ``lm-eval``; it is imported only here, when a dataset
names an ``lm_eval_task``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import datasets
from transformers import PreTrainedTokenizerBase

from dynamics.data.loading import DataError, DataSource, one_line

logger = logging.getLogger(__name__)

FEWSHOT_SEED = 1234
"""The seed of the few-shot sampler: ``simple_evaluate``'s default ``fewshot_random_seed``."""


def _lm_eval() -> Any:
    try:
        import lm_eval.tasks
    except ImportError:
        raise DataError(
            "lm_eval_task needs lm-evaluation-harness: pip install 'dynamics[lm-eval]' (or lm_eval==0.4.13)"
        ) from None
    return lm_eval.tasks


def task_manager(names: Sequence[str], include_path: str | None) -> Any:
    """lm-eval's ``TaskManager`` for the tasks ``names``: the tasks of ``include_path`` alone
    when every name is a task there (indexing lm-eval's own ~14,700 tasks takes about 8 s
    on a CPU core), otherwise those of ``include_path`` and lm-eval's own."""
    tasks = _lm_eval()
    if include_path is not None:
        local = tasks.TaskManager(include_path=include_path, include_defaults=False)
        if all(name in local.all_subtasks for name in names):
            return local
    return tasks.TaskManager(include_path=include_path)


def load_task(name: str, include_path: str | None, description: str) -> Any:
    """The lm-eval task object ``name`` (a folder of task YAMLs is searched first when
    ``include_path`` is given), configured as ``simple_evaluate`` configures it."""
    try:
        loaded = task_manager([name], include_path).load([name])["tasks"]
    except Exception as err:  # lm-eval raises plain KeyErrors and ValueErrors, and datasets' errors
        raise DataError(
            f"{description}: lm-eval task {name!r} could not be loaded ({one_line(err)}); check "
            "lm_eval_task (and lm_eval_include_path, the folder of a local task's YAML)"
        ) from None
    if len(loaded) != 1:
        raise DataError(
            f"{description}: lm_eval_task {name!r} is a group of {len(loaded)} tasks; list each of its "
            f"tasks as its own dataset ({', '.join(sorted(loaded)[:5])}, ...)"
        )
    task = next(iter(loaded.values()))
    if task.OUTPUT_TYPE != "multiple_choice":
        raise DataError(
            f"{description}: lm-eval task {name!r} has output_type {task.OUTPUT_TYPE!r}; only "
            "multiple_choice tasks (scored by acc) can be a dataset"
        )
    if "acc" not in task._metric_fn_list:
        raise DataError(
            f"{description}: lm-eval task {name!r} has no 'acc' metric (it has "
            f"{sorted(task._metric_fn_list)}); add acc to its metric_list"
        )
    if task.get_config("num_fewshot") is None:
        task.set_config(key="num_fewshot", value=0)
    task.set_fewshot_seed(seed=FEWSHOT_SEED)
    return task


def _correct_choice(task: Any, doc: dict[str, Any], requests: int, choices: int, where: str) -> int:
    """The one choice that ``process_results`` scores ``acc`` 1 when it is the likeliest."""
    correct = []
    for k in range(choices):
        results = [(0.0 if j == k else -1.0, False) for j in range(requests)]
        if task.process_results(doc, results)["acc"] == 1.0:
            correct.append(k)
    if len(correct) != 1:
        raise DataError(
            f"{where}: {len(correct)} of its {choices} choices count as correct for lm-eval's acc "
            "(its doc_to_target names none of them, or several); one correct choice is supported"
        )
    return correct[0]


def task_rows(source: DataSource) -> datasets.Dataset:
    """The rows of ``source.lm_eval_task`` (see the module docstring)."""
    assert source.lm_eval_task is not None
    task = load_task(source.lm_eval_task, source.lm_eval_include_path, source.description)
    task.build_all_requests()
    by_doc: dict[int, list[Any]] = {}
    for instance in task.instances:
        by_doc.setdefault(instance.doc_id, []).append(instance)
    rows = []
    for doc_id, instances in sorted(by_doc.items()):
        instances.sort(key=lambda instance: instance.idx)
        doc = instances[0].doc
        # acc_mutual_info adds unconditional requests after the K choices; acc reads the first K.
        choices = len(task.doc_to_choice(doc))
        pairs = [instance.args[:2] for instance in instances[:choices]]
        where = f"{source.description}, document {doc_id}"
        rows.append(
            {
                "contexts": [context for context, _ in pairs],
                "continuations": [continuation for _, continuation in pairs],
                "answer": _correct_choice(task, doc, len(instances), choices, where),
                "doc_id": doc_id,
            }
        )
    if not rows:
        raise DataError(f"{source.description}: lm-eval task {source.lm_eval_task!r} has no documents")
    logger.info("%s: %d documents of lm-eval task %s", source.description, len(rows), source.lm_eval_task)
    return datasets.Dataset.from_list(rows)


def encode_pairs(
    tokenizer: PreTrainedTokenizerBase, contexts: Sequence[str], continuations: Sequence[str]
) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) of each pair, by lm-eval's ``hf`` model's own code."""
    from lm_eval.models.huggingface import HFLM

    class _PairEncoder(HFLM):
        """HFLM's tokenization without a model: ``loglikelihood`` encodes the requests and
        hands them to ``_loglikelihood_tokens``, which here returns them instead of scoring."""

        def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
            self.tokenizer = tokenizer
            self.add_bos_token = None  # HFLM's default
            self.custom_prefix_token_id = None
            self.backend = "causal"
            self.enable_thinking = None

        def _loglikelihood_tokens(self, requests: Any, disable_tqdm: bool = False, override_bs: Any = None) -> Any:
            return [(list(context), list(continuation)) for _, context, continuation in requests]

    requests = [SimpleNamespace(args=pair) for pair in zip(contexts, continuations, strict=True)]
    encoded: list[tuple[list[int], list[int]]] = _PairEncoder(tokenizer).loglikelihood(requests, disable_tqdm=True)
    return encoded
