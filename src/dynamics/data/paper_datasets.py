"""Where the paper's 22 datasets live and how their rows are read (table tab:datasets).

The paper names its datasets (appendix "List of Datasets") but not the hub copies it read.
``PAPER_DATASETS`` records, per abbreviation, the hub id, configuration and split we read,
the row format, the columns and the small declarative transforms (``fields``) that turn a
hub row into the prompt/response, text or question/choices/answer the formatter expects,
the held-out rule, and what the schema was checked against (``docs/datasets.md`` lists
the same in prose; a test keeps the two in sync).

``dataset_entry(abbrev, role=..., budget=..., metric=..., data_root=None)`` is one entry of a
run config's ``datasets`` list. With ``data_root`` the rows come from the local file
``data_root/<ABBREV>.jsonl`` (or ``.json``/``.parquet``) of the same shape as the hub rows,
so the same ``fields`` and columns apply.

Held-out rule: the eval and test rows are drawn from the one split read (seeded, before the
training budget; see ``dynamics.data.splits``). On the hub they are ``HELD_OUT_ROWS`` rows
each for the datasets with thousands of rows, and half of the rows each for the
evaluation-only benchmarks of a few hundred or thousand rows (the tiny benchmarks have
100). A non-target is only trained on and holds nothing out. A local file keeps the same
held-out rows and budget, counted against its own rows (``stream_rows`` at most): a budget
larger than the training rows left becomes all of them, with a warning, as on the hub. A
file with no more than twice the held-out rows (a small sample) uses the run config's
fractions instead (0.1 each for a target, 0.5 for a constraint).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dynamics.data.errors import DataError
from dynamics.data.formats import FORMATS
from dynamics.data.loading import LOCAL_BUILDERS
from dynamics.data.scenarios import DATASETS
from dynamics.data.source import FieldSpec, FormatName

logger = logging.getLogger(__name__)

HELD_OUT_ROWS = 1000
"""Eval and test rows of a hub dataset with thousands of rows (each split: 1000 rows; the
main evaluation's 200 batches of 8 cycle over them)."""
STREAM_ROWS = 20_000
"""Rows taken from the stream of an unlimited corpus: more than 2,048 steps x batch 8 draw
even if the whole mixture went to it, so no document repeats."""


@dataclass(frozen=True)
class PaperDataset:
    """How one of the paper's datasets is read from the hub."""

    abbrev: str
    hub_id: str
    split: str
    format: FormatName
    checked_against: str
    """Where its schema (column names and types) was checked: a dataset card or viewer page."""
    config_name: str | None = None
    columns: dict[str, str] = field(default_factory=dict)
    """Run-config ``columns`` (role -> column name) where they differ from the defaults."""
    fields: dict[str, FieldSpec] = field(default_factory=dict)
    """Run-config ``fields``: columns built from each row (templates, nested paths, lists)."""
    drop_empty: tuple[str, ...] = ()
    truncation_side: Literal["right", "left"] = "right"
    stream_rows: int | None = None
    """Read as a stream, shuffled through a seeded buffer, and keep this many rows (huge
    corpora: never downloaded whole)."""
    data_files: str | None = None
    """The hub repository's file to read (``load_dataset``'s ``data_files``), where it holds
    files of several formats and no ``configs`` block."""
    revision: str | None = None
    """The hub commit read, where pinned."""
    shuffle_choices: bool = False
    """Multiple choice whose correct choice is always at one index: the choices are shuffled."""
    strip_strings: tuple[str, ...] = ()
    """Literal strings removed from the rows (a tokenizer's control token in the data)."""
    rows: int | None = None
    """Rows of the split as published (or ``stream_rows``); None when not checked. A budget
    larger than what is left after the held-out rows becomes all of them, with a warning."""
    held_out: int | float = HELD_OUT_ROWS
    """Eval rows and test rows each: a count, or a fraction of the split."""
    note: str = ""


def _tiny(
    abbrev: str, hub: str, split: str, checked: str, config: str | None = None, **kw: Any
) -> PaperDataset:
    return PaperDataset(
        abbrev,
        hub,
        split,
        "multiple_choice",
        checked,
        config_name=config,
        rows=100,
        held_out=0.5,
        **kw,
    )


PAPER_DATASETS: dict[str, PaperDataset] = {
    d.abbrev: d
    for d in (
        PaperDataset(
            "MM",
            "meta-math/MetaMathQA",
            "train",
            "instruction",
            "https://huggingface.co/datasets/meta-math/MetaMathQA/tree/main (one file, "
            "MetaMathQA-395K.json); features type, query, original_question, response from the "
            "dataset_info of its copy "
            "https://huggingface.co/datasets/upb-nlp/MetaMathQA-dedup/blob/main/README.md",
            columns={"prompt": "query"},
            rows=395_000,
        ),
        PaperDataset(
            "NM",
            "AI-MO/NuminaMath-CoT",
            "train",
            "instruction",
            "https://huggingface.co/datasets/AI-MO/NuminaMath-CoT/viewer/default/test (train 859k, "
            "test 100 rows); features source, problem, solution, messages[{content, role}] from "
            "the card's dataset_info as copied in "
            "https://huggingface.co/datasets/skyzos/NuminaMath-CoT/blob/main/README.md",
            rows=859_494,
            note="read through its `messages` chat list (user problem, assistant solution)",
        ),
        PaperDataset(
            "GS",
            "openai/gsm8k",
            "train",
            "instruction",
            "the original card was not found; question, answer and train 7,473 / test 1,319 rows "
            "from copies' dataset_info, e.g. "
            "https://huggingface.co/datasets/alterego238/gsm8k/blob/main/README.md, and the "
            "main/train-00000-of-00001.parquet layout in "
            "https://huggingface.co/nickmalhotra/ProjectIndus/blob/main/SFT/dataset.ini",
            config_name="main",
            columns={"prompt": "question", "response": "answer"},
            rows=7_473,
            note="the paper's GS(10k) is more than the 7,473 training rows: "
            "such a budget uses all of them",
        ),
        PaperDataset(
            "CF",
            "m-a-p/CodeFeedback-Filtered-Instruction",
            "train",
            "instruction",
            "https://huggingface.co/datasets/m-a-p/CodeFeedback-Filtered-Instruction/tree/e24e63942ad4450639e16ba318130ab841946916"
            " (one file, CodeFeedback-Filtered-Instruction.jsonl, 371 MB; README 28 bytes, no "
            "configs) and the viewer of its copy "
            "https://huggingface.co/datasets/nayohan/CodeFeedback-Filtered-Instruction-ko/viewer/default/train"
            " (157k rows); the row format query, answer, resource (evolinstruct, magicoder, "
            "wizardcoder, sharegpt), lang in "
            "https://github.com/huilong-chen/LLMhub/blob/3927382fa84748b8208be0396388e89d68dc8054/build_dataset/README.md,"
            " and a public loader that reads sample['query'] and sample['answer'] of its train "
            "split, https://github.com/SenseLLM/ReflectionCoder/blob/main/src/data/download.py",
            columns={"prompt": "query", "response": "answer"},
            rows=156_526,
        ),
        PaperDataset(
            "AI",
            "Post-training-Data-Flywheel/AutoIF-instruct-61k",
            "train",
            "instruction",
            "https://huggingface.co/datasets/Post-training-Data-Flywheel/AutoIF-instruct-61k/blob/0705aa867cce36d595123cb34f4a35281e6acc7c/README.md"
            " (system, tools, messages[{content, role}], conversation_id; train 61,492 rows)",
            columns={"system": "system"},
            rows=61_492,
        ),
        PaperDataset(
            "OT",
            "open-thoughts/OpenThoughts-114k",
            "train",
            "instruction",
            "https://huggingface.co/datasets/open-thoughts/OpenThoughts-114k/viewer (default "
            "config, train 114k rows); features system, conversations[{from, value}] from the card "
            "of its filtered copy "
            "https://www.huggingface.co/datasets/mlabonne/OpenThoughts-79k-filtered/blob/main/README.md",
            config_name="default",
            columns={"messages": "conversations", "system": "system"},
            rows=113_957,
            note="ShareGPT turns (from: user/assistant, value) are read as chat messages",
        ),
        PaperDataset(
            "OO",
            "Open-Orca/OpenOrca",
            "train",
            "instruction",
            "the card's Data Fields (id, system_prompt, question, response) as copied in "
            "https://huggingface.co/datasets/yys/OpenOrca-Chinese/blob/main/README.md, and the "
            "same features with 4,233,915 train rows in "
            "https://huggingface.co/datasets/lchakkei/OpenOrca-Traditional-Chinese/blob/main/README.md",
            columns={"prompt": "question", "system": "system_prompt"},
            stream_rows=40_000,
            rows=40_000,
            note="4.2M rows: streamed, 40,000 kept (the largest budget, 30k, plus the held-out "
            "rows) after a seeded shuffle",
        ),
        PaperDataset(
            "Ay",
            "CohereForAI/aya_dataset",
            "train",
            "instruction",
            "the card's dataset_info (config default: inputs, targets, language, language_code, "
            "annotation_type, user_id; train 202,364, test 1,750 rows; a second config, "
            "demographics, keyed by user_id) as the commit "
            "https://huggingface.co/datasets/CohereForAI/aya_dataset/commit/5e530a243fd8f2e1e8d10b423d6c382d695276a6"
            " shows it; the same features in the dataset_info of its exports, e.g. "
            "https://huggingface.co/datasets/2A2I/Arabic_Aya/commit/5ab1e23505e143c2f01161b0dc6cfdc1130b11ce"
            " (config CohereForAI-aya_dataset)",
            columns={"prompt": "inputs", "response": "targets"},
            rows=202_364,
        ),
        PaperDataset(
            "MF",
            "medalpaca/medical_meadow_medical_flashcards",
            "train",
            "instruction",
            "https://huggingface.co/datasets/medalpaca/medical_meadow_medical_flashcards/viewer/default/train?p=1"
            " (train 34k rows); instruction, input, output and 33,955 rows from the dataset_info "
            "of "
            "https://huggingface.co/datasets/lavita/medical-qa-datasets (config "
            "medical_meadow_medical_flashcards)",
            fields={"prompt": "{instruction}\n\n{input}"},
            columns={"response": "output"},
            rows=33_955,
        ),
        PaperDataset(
            "GF",
            "glaiveai/glaive-function-calling-v2",
            "train",
            "text",
            "https://huggingface.co/datasets/glaiveai/glaive-function-calling-v2/discussions/4 "
            "(json, 100K-1M rows); the chat column as a public converter reads it, "
            "github.com/DikshantDeoli/Share- Write.py (row['chat'], its docstring showing "
            "'ASSISTANT: <functioncall> {...} <|endoftext|>' and 'FUNCTION RESPONSE:' turns); the "
            "112,960 rows from the dataset_info of its ChatML conversion, "
            "https://github.com/daniel-p-green/alain-ai-learning-platform/blob/main/out/research-dphn-dolphin-2-9-1-yi-1-5-34b/sources/datasets/locutusque-function-calling-chatml.README.md;"
            " the system column (a string starting 'SYSTEM: You are a helpful assistant with "
            "access "
            "to the following functions...' and the JSON schemas) beside chat, as a public "
            "normalizer reads the hub's glaive-function-calling-v2.json (112,960 rows of {system, "
            "chat}), "
            "https://github.com/Vaniell0/noesis/blob/18f253e1c0f0e19a5fbe0e333628d95f896370f4/training/scripts/normalize_glaive.py"
            " and its training/corpus_open/PROVENANCE.md",
            fields={"text": "{system}\n\n{chat}"},
            rows=112_960,
            strip_strings=("<|endoftext|>",),
            note="`chat` is one string of USER/ASSISTANT/FUNCTION turns, so the row is read as "
            "text (loss on every token), after its system prompt with the function definitions; "
            "the literal `<|endoftext|>` ending each assistant turn is removed (Qwen's and "
            "GPT-2's tokenizers read it as the end-of-text token, which would end the document "
            "mid-row); the row's own EOS ends it",
        ),
        PaperDataset(
            "MS",
            "MegaScience/MegaScience",
            "train",
            "instruction",
            "https://huggingface.co/datasets/MegaScience/MegaScience/tree/main (parquet under "
            "data/, 1M-10M rows, 1.88 GB, README 3.78 kB); features question, answer, subject, "
            "reference_answer, source and train 1,253,230 rows from the dataset_info of the same "
            "3.78 kB card in its copy mkzheng/MegaScience "
            "(https://www.huggingface.co/datasets/mkzheng/MegaScience/tree/main; the card read "
            "through the mirror "
            "https://hf-mirror.492719920.workers.dev/datasets/mkzheng/MegaScience/blob/main/README.md)",
            columns={"prompt": "question", "response": "answer"},
            stream_rows=STREAM_ROWS,
            rows=STREAM_ROWS,
            note="1M+ rows: streamed, 20,000 kept after a seeded shuffle",
        ),
        PaperDataset(
            "BS",
            "FiscalNote/billsum",
            "train",
            "instruction",
            "https://huggingface.co/datasets/FiscalNote/billsum/blob/refs%2Fpr%2F6/README.md "
            "(text, summary, title; train 18,949, test 3,269, ca_test 1,237 rows)",
            fields={"prompt": "{text}\n\nSummarize the bill above."},
            columns={"response": "summary"},
            truncation_side="left",
            rows=18_949,
            note="a bill is longer than 512 tokens: the instruction follows the bill, and the "
            "bill's text is cut after the leading special tokens so the instruction and the "
            "summary are kept; BS(20k) is more than the split holds and uses all of it",
        ),
        PaperDataset(
            "RQ",
            "ServiceNow/repliqa",
            "repliqa_0",
            "instruction",
            "the card's dataset_info at "
            "https://huggingface.co/datasets/ServiceNow/repliqa/commit/1b2838a9f98ae1d22a1db8fd2ca30721ee43f8cb"
            " (config default: document_id, document_topic, document_path, document_extracted, "
            "question_id, question, answer, long_answer, all strings; split repliqa_0, 17,955 "
            "rows; later cards add repliqa_1 to repliqa_4); 5 questions per document "
            "(https://huggingface.co/datasets/ServiceNow/repliqa/commit/94c467733e0b1e94a28451556800298111240387)",
            fields={"prompt": "{document_extracted}\n\nQuestion: {question}"},
            columns={"response": "answer"},
            truncation_side="left",
            rows=17_955,
            note="the document is longer than 512 tokens: its text is cut after the leading "
            "special tokens so the question and answer are kept",
        ),
        PaperDataset(
            "WP",
            "wikimedia/wikipedia",
            "train",
            "text",
            "https://huggingface.co/datasets/wikimedia/wikipedia/commit/b8bc12bbc5758d81a5fb8981bd04148236527e38"
            " (configs named <date>.<language>); the card's own example "
            'load_dataset("wikimedia/wikipedia", '
            '"20231101.en") in https://huggingface.co/datasets/wikimedia/wikipedia/commit/'
            "0a74be1dafec8200ba0509654b9f2c740c8362cd, and a maintainer's answer loading that "
            "config alone in https://huggingface.co/datasets/wikimedia/wikipedia/discussions/60; "
            "features id, url, title, text from dumps of the same format, e.g. "
            "https://huggingface.co/datasets/teddy-f-47/wikipedia_id_20231201/blame/main/README.md",
            config_name="20231101.en",
            stream_rows=STREAM_ROWS,
            rows=STREAM_ROWS,
            held_out=0,
            note="unlimited: streamed, 20,000 articles kept after a seeded shuffle",
        ),
        PaperDataset(
            "FW",
            "HuggingFaceFW/fineweb",
            "train",
            "text",
            "the card's configs block (config_name sample-10BT, split train, path sample/10BT/*) "
            "in "
            "https://huggingface.co/datasets/HuggingFaceFW/fineweb/blob/refs%2Fpr%2F51/README.md?code=true"
            " and the folder sample/10BT in "
            "https://huggingface.co/datasets/HuggingFaceFW/fineweb/tree/cd850543a88ba055067841ce91d2669344ff7b7a/sample;"
            " features text, id, dump, url, date, file_path, language, language_score, token_count "
            "from FineWeb samples, e.g. "
            "https://huggingface.co/datasets/ServiceNow/fineweb-sample/blob/main/README.md and "
            "https://huggingface.co/datasets/OxxoCodes/"
            "fineweb-10MT/blob/main/README.md (drawn with "
            'load_dataset("HuggingFaceFW/fineweb", "sample-10BT", '
            'split="train"))',
            config_name="sample-10BT",
            stream_rows=STREAM_ROWS,
            rows=STREAM_ROWS,
            held_out=0,
            note="unlimited: streamed, 20,000 documents kept after a seeded "
            "shuffle of the shards and rows",
        ),
        _tiny(
            "tM",
            "tinyBenchmarks/tinyMMLU",
            "test",
            "https://huggingface.co/datasets/tinyBenchmarks/tinyMMLU/blob/main/README.md "
            "(config all: question, subject, choices, answer as a class label 0-3, "
            "input_formatted; test 100 rows)",
            config="all",
        ),
        _tiny(
            "tT",
            "tinyBenchmarks/tinyTruthfulQA",
            "validation",
            "https://huggingface.co/datasets/tinyBenchmarks/tinyTruthfulQA/blob/main/README.md "
            "(config multiple_choice: question, mc1_targets{choices, labels}, mc2_targets, "
            "input_formatted; validation 100 rows)",
            config="multiple_choice",
            fields={"choices": "mc1_targets.choices", "answer": "mc1_targets.labels"},
            shuffle_choices=True,
            note="the single-true-answer targets (mc1): the answer is the choice flagged "
            "1, which mc1 always lists first, so the choices are shuffled (an order seeded "
            "by the question) for accuracy",
        ),
        _tiny(
            "tH",
            "tinyBenchmarks/tinyHellaswag",
            "validation",
            "https://huggingface.co/datasets/tinyBenchmarks/tinyHellaswag/blob/main/README.md "
            "(ind, activity_label, ctx_a, ctx_b, ctx, endings, source_id, split, split_type, label "
            "as a string, input_formatted; validation 100 rows)",
            fields={"question": "{activity_label}: {ctx}"},
            columns={"choices": "endings", "answer": "label"},
        ),
        _tiny(
            "tA",
            "tinyBenchmarks/tinyAI2_arc",
            "test",
            "https://huggingface.co/datasets/tinyBenchmarks/tinyAI2_arc/blob/main/README.md "
            "(config ARC-Challenge: id, question, choices{text, label}, answerKey, "
            "input_formatted; test 100 rows)",
            config="ARC-Challenge",
            columns={"answer": "answerKey"},
        ),
        PaperDataset(
            "NS",
            "nvidia/Aegis-AI-Content-Safety-Dataset-2.0",
            "test",
            "instruction",
            "https://huggingface.co/datasets/nvidia/Aegis-AI-Content-Safety-Dataset-2.0/viewer "
            "(default config; train 30k, validation 1.45k, test 1.96k rows) and the card "
            "https://huggingface.co/datasets/nvidia/Aegis-AI-Content-Safety-Dataset-2.0/blob/refs%2Fpr%2F6/README.md"
            " (prompts from Anthropic HH-RLHF, responses elicited from Mistral-7B-v0.1; its "
            "configs "
            "block, default config, test split test.json, as a mirror shows it: "
            "https://chatgptweb.us.kg/datasets/nvidia/Aegis-AI-Content-Safety-Dataset-2.0/blame/main/README.md);"
            " columns id, prompt, response (null or empty where no response was logged), "
            "prompt_label, response_label, violated_categories as a public sampler requires them "
            "of the train split, "
            "https://github.com/Onedory/dv_SFT_dataset/blob/24bbd0acc98f0821fe8b06e1a89810d890e5c6d5/query_set/sample_aegis_labeled.py,"
            " and reconstruction_id_if_redacted beside prompts stored as 'REDACTED' in "
            "https://github.com/maciejchrabaszcz/latent-prototype-moderator/blob/1361ba1882426bd4186e17995f187532e663336c/scripts/preprocessing/prepare_training_datasets.py",
            drop_empty=("response",),
            rows=1_964,
            held_out=0.5,
            note="Aegis 2.0 is NVIDIA's Nemotron Content Safety Dataset V2: the loss of the logged "
            "response to each (often harmful) prompt; rows without a response are dropped (the "
            "card's suicide-detection rows store their prompt as 'REDACTED', with "
            "reconstruction_id_if_redacted pointing into a dataset it does not distribute)",
        ),
        PaperDataset(
            "SQ",
            "OpenStellarTeam/Chinese-SafetyQA",
            "train",
            "instruction",
            "https://huggingface.co/datasets/OpenStellarTeam/Chinese-SafetyQA/tree/5edb1435b39eb1e310f3a3729b74d3623026c502"
            " (chinese_safetyqa.jsonl 986 kB and chinese_safetyqa.csv 772 kB, no configs block); "
            "the rows of the same 986,312-byte file in "
            "https://github.com/OpenStellarTeam/ChineseSafetyQA/blob/main/data/chinese_safetyqa.jsonl:"
            " 2,000 rows of cate, question, standard_answer, standard_source_url, options (a "
            "string "
            "of a Python dict letter -> text), correct_answer (a letter)",
            columns={"prompt": "question", "response": "standard_answer"},
            rows=2_000,
            held_out=0.5,
            data_files="chinese_safetyqa.jsonl",
            revision="5edb1435b39eb1e310f3a3729b74d3623026c502",
            note="the paper cites 'SafetyQA' without a hub id; this is the benchmark of that name "
            "on the hub, scored by the loss of its short standard answer; the jsonl is read (the "
            "repository also holds a csv of the same rows), at the commit that added it",
        ),
        PaperDataset(
            "BQ",
            "walledai/BBQ",
            "age+disabilityStatus+genderIdentity+nationality+physicalAppearance+raceEthnicity+raceXGender+raceXSes"
            "+religion+ses+sexualOrientation",
            "multiple_choice",
            "the viewer https://huggingface.co/datasets/walledai/BBQ/viewer (config default, "
            "58.5k rows; 11 splits age 3.68k, disabilityStatus 1.56k, genderIdentity 5.67k, "
            "nationality 3.08k, physicalAppearance 1.58k, raceEthnicity 6.88k, raceXSes 11.2k, "
            "raceXGender 16k, religion 1.2k, ses 6.86k, sexualOrientation 864 rows) and the "
            "card's dataset_info at commit 3bbaded as a mirror of the hub page shows it, "
            "https://phind.xodi.top/datasets/walledai/BBQ/blob/main/README.md (context, "
            "question, choices as a sequence of strings, answer int64, category; the same 11 "
            "splits, 58,492 rows in all)",
            fields={"question": "{context}\n{question}"},
            rows=58_492,
            note="every category split, joined; the original BBQ repos load "
            "through a script, which stays off",
        ),
    )
}


def _local_file(data_root: Path, abbrev: str) -> Path:
    found = [
        data_root / f"{abbrev}{ext}"
        for ext in LOCAL_BUILDERS
        if (data_root / f"{abbrev}{ext}").is_file()
    ]
    if not found:
        raise DataError(
            f"--data-root {data_root}: no file for dataset {abbrev} ({DATASETS[abbrev].name}); add "
            f"{data_root / (abbrev + '.jsonl')} with rows shaped like the hub's "
            f"{PAPER_DATASETS[abbrev].hub_id} (docs/datasets.md lists the columns)"
        )
    return found[0]


def dataset_entry(
    abbrev: str,
    *,
    role: Literal["target", "non-target", "constraint"],
    budget: int | None = None,
    metric: Literal["loss", "accuracy"] = "loss",
    data_root: str | Path | None = None,
) -> dict[str, Any]:
    """The run-config entry (a plain dict) that reads dataset ``abbrev`` as the paper did."""
    spec = PAPER_DATASETS[abbrev]
    if spec.held_out == 0 and role != "non-target":
        raise DataError(
            f"{abbrev} ({DATASETS[abbrev].name}) is an open-domain corpus the paper only "
            "trains on: use it as a non-target"
        )
    entry: dict[str, Any] = {"name": abbrev, "role": role, "format": spec.format}
    if data_root is None:
        entry["hub_id"] = spec.hub_id
        if spec.config_name is not None:
            entry["config_name"] = spec.config_name
        if spec.revision is not None:
            entry["revision"] = spec.revision
        if spec.data_files is not None:
            entry["data_files"] = spec.data_files
        entry["split"] = spec.split
        if role != "non-target":
            entry["eval_size"] = entry["test_size"] = spec.held_out
        budget = _fit_budget(spec, budget, spec.rows, f"{spec.hub_id} ({spec.split})")
    else:
        path = _local_file(Path(data_root), abbrev)
        entry["path"] = str(path)
        rows = _count_rows(path)
        if rows is not None and spec.stream_rows is not None:
            rows = min(rows, spec.stream_rows)
        held_out: int | float = spec.held_out
        if isinstance(spec.held_out, int) and (rows is None or rows <= 2 * spec.held_out):
            # A small sample (or a file whose rows are not counted): the config's fractions.
            held_out = 0.5 if role == "constraint" else 0.1
        elif role != "non-target":
            entry["eval_size"] = entry["test_size"] = held_out
        budget = _fit_budget(
            spec, budget, rows, str(path), held_out=0 if role == "non-target" else held_out
        )
    if role == "non-target":
        entry["eval_size"] = entry["test_size"] = 0  # only trained on: nothing to hold out
    if role != "constraint":
        entry["budget"] = budget
    if len(FORMATS[spec.format].metrics) > 1 or role == "constraint":  # a choice of metric
        entry["metric"] = metric
    for key in ("columns", "fields"):
        if getattr(spec, key):
            entry[key] = dict(getattr(spec, key))
    if spec.drop_empty:
        entry["drop_empty"] = list(spec.drop_empty)
    if spec.truncation_side != "right":
        entry["truncation_side"] = spec.truncation_side
    if spec.stream_rows is not None:
        entry["stream_rows"] = spec.stream_rows
    if spec.shuffle_choices:
        entry["shuffle_choices"] = True
    if spec.strip_strings:
        entry["strip_strings"] = list(spec.strip_strings)
    return entry


def _count_rows(path: Path) -> int | None:
    """Rows of a local file (lines of JSON lines or text, entries of a JSON array, a parquet
    file's row count), or None when the file is not one of those shapes."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".txt"):
        with path.open("rb") as lines:
            return sum(1 for line in lines if line.strip())
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    if suffix == ".json":
        try:
            loaded = json.loads(path.read_text())
        except ValueError:
            return None
        return len(loaded) if isinstance(loaded, list) else None
    return None


def _fit_budget(
    spec: PaperDataset,
    budget: int | None,
    rows: int | None,
    where: str,
    held_out: int | float | None = None,
) -> int | None:
    """The paper's budget, or None (every training row) when the ``rows`` of ``where``
    hold fewer after the held-out rows (``spec.held_out`` unless given)."""
    if budget is None or rows is None:
        return budget
    held = spec.held_out if held_out is None else held_out
    # The hub's fractions are of evaluation-only benchmarks, which have no budget.
    per_split = (
        held if isinstance(held, int) else (0 if held_out is None else math.ceil(held * rows))
    )
    available = rows - 2 * per_split
    if budget > available:
        logger.warning(
            "%s: the paper's budget of %d rows is more than the %d training rows "
            "of %s; all of them are used",
            spec.abbrev,
            budget,
            max(available, 0),
            where,
        )
        return None
    return budget


def _transform(spec: PaperDataset) -> str:
    parts = [f"`{key}` = `{value}`" for key, value in spec.columns.items()]
    parts += [
        f"`{key}` <- `{value!r}`" if isinstance(value, list) else f"`{key}` <- `{value}`"
        for key, value in spec.fields.items()
    ]
    if spec.drop_empty:
        parts.append(f"rows without `{'`, `'.join(spec.drop_empty)}` dropped")
    if spec.truncation_side != "right":
        parts.append(f"truncation {spec.truncation_side}")
    if spec.strip_strings:
        parts.append(f"`{'`, `'.join(spec.strip_strings)}` removed")
    if spec.shuffle_choices:
        parts.append("choices shuffled")
    if spec.data_files is not None:
        parts.append(f"data_files `{spec.data_files}`")
    if spec.revision is not None:
        parts.append(f"revision `{spec.revision[:12]}`")
    if spec.stream_rows is not None:
        parts.append(f"streamed, {spec.stream_rows:,} rows after a seeded shuffle")
    text = "; ".join(parts) if parts else "default columns"
    return text.replace("\n", "\\n").replace("|", "\\|")


def datasets_reference_table() -> str:
    """The table of docs/datasets.md, generated from ``PAPER_DATASETS`` (a test keeps it there)."""
    lines = [
        "| abbrev | dataset | hub id | config | split | format | columns and transforms | "
        "held out (eval, test each) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for abbrev, spec in PAPER_DATASETS.items():
        if spec.held_out == 0:
            held_out = "none (only trained on)"
        elif isinstance(spec.held_out, int):
            held_out = f"{spec.held_out:,} rows"
        else:
            held_out = f"{spec.held_out:.0%} of the rows"
        lines.append(
            f"| {abbrev} | {DATASETS[abbrev].name} | `{spec.hub_id}` | {spec.config_name or '-'} | "
            f"`{spec.split}` | {spec.format} | {_transform(spec)} | {held_out} |"
        )
    lines += ["", "| abbrev | schema checked against | note |", "| --- | --- | --- |"]
    for abbrev, spec in PAPER_DATASETS.items():
        cells = (spec.checked_against, spec.note or "-")
        lines.append(
            f"| {abbrev} | " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
        )
    return "\n".join(lines) + "\n"
