"""Loading rows through ``datasets.load_dataset`` from files shaped like the real datasets."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json
from pathlib import Path
from typing import Any

import datasets
import pytest

from dynamics.data import DataError, DataSource, load_rows
from dynamics.data import loading as loading_module
from tests.fixtures.tiny_tokenizer import FIXTURES


def _load(tmp_path: Path, **fields: Any) -> datasets.Dataset:
    return load_rows(DataSource(**fields), cache_dir=tmp_path / "cache")


def test_jsonl_instruction_pairs(tmp_path: Path) -> None:
    rows = _load(
        tmp_path, path=str(FIXTURES / "metamath.jsonl"), format="instruction", prompt_column="query"
    )
    assert len(rows) == 16
    assert rows[0]["query"].startswith("If Tom has")
    assert "The answer is:" in rows[0]["response"]


def test_jsonl_chat_messages(tmp_path: Path) -> None:
    rows = _load(tmp_path, path=str(FIXTURES / "chat.jsonl"), format="instruction")
    assert [m["role"] for m in rows[0]["messages"]][-1] == "assistant"


def test_txt_is_one_row_per_line(tmp_path: Path) -> None:
    rows = _load(tmp_path, path=str(FIXTURES / "wikipedia.txt"))
    lines = (FIXTURES / "wikipedia.txt").read_text().splitlines()
    assert rows["text"] == lines


def test_json_array_and_parquet_read_the_same_rows(tmp_path: Path) -> None:
    records = [json.loads(line) for line in (FIXTURES / "tinymmlu.jsonl").read_text().splitlines()]
    (tmp_path / "mmlu.json").write_text(json.dumps(records))
    datasets.Dataset.from_list(records).to_parquet(str(tmp_path / "mmlu.parquet"))
    for name in ("mmlu.json", "mmlu.parquet"):
        rows = _load(tmp_path, path=str(tmp_path / name), format="multiple_choice")
        assert rows.to_list() == records


def test_local_folder_goes_to_load_dataset_as_a_path(tmp_path: Path) -> None:
    folder = tmp_path / "wiki"
    folder.mkdir()
    (folder / "train.jsonl").write_text((FIXTURES / "wikipedia.jsonl").read_text())
    rows = _load(tmp_path, path=str(folder))
    assert len(rows) == 12 and rows.column_names == ["id", "url", "title", "text"]


def test_sliced_split_bounds_a_large_corpus(tmp_path: Path) -> None:
    rows = _load(tmp_path, path=str(FIXTURES / "wikipedia.jsonl"), split="train[:5]")
    assert len(rows) == 5


def test_hub_id_passes_name_and_split(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    fake = datasets.Dataset.from_list([{"text": "a"}])

    def fake_load_dataset(*args: Any, **kwargs: Any) -> datasets.Dataset:
        calls.append((args, kwargs))
        return fake

    monkeypatch.setattr(loading_module, "load_dataset", fake_load_dataset)
    rows = load_rows(
        DataSource(hub_id="HuggingFaceFW/fineweb", config_name="sample-10BT", split="train[:100]")
    )
    assert rows is fake
    assert calls == [
        (
            ("HuggingFaceFW/fineweb",),
            {"name": "sample-10BT", "split": "train[:100]", "cache_dir": None},
        )
    ]


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nowhere\.jsonl does not exist"):
        _load(tmp_path, path=str(tmp_path / "nowhere.jsonl"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty: it has no rows"),
        ("\n  \n", "is empty: it has no rows"),
        ('{"text": "a"}\n{"text": \n', "could not be read: JSON parse error"),
    ],
    ids=["empty", "blank", "malformed"],
)
def test_unreadable_files_are_one_line_errors_naming_the_dataset(
    tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "rows.jsonl").write_text(text)
    with pytest.raises(
        DataError, match=f"^dataset 'wiki' \\(file .*rows\\.jsonl\\) {message}"
    ) as info:
        _load(tmp_path, path=str(tmp_path / "rows.jsonl"), name="wiki")
    assert "\n" not in str(info.value)


def test_unknown_hub_dataset_offline_names_it(tmp_path: Path) -> None:
    with pytest.raises(
        DataError, match=r"hub dataset no-such-org/nothing.*could not be found .* offline"
    ):
        _load(tmp_path, hub_id="no-such-org/nothing")


@pytest.mark.parametrize("stream_rows", [None, 5], ids=["read", "streamed"])
def test_unknown_split_names_the_field(tmp_path: Path, stream_rows: int | None) -> None:
    with pytest.raises(DataError, match=r"split 'validation' cannot be read.*set split"):
        _load(
            tmp_path,
            path=str(FIXTURES / "wikipedia.jsonl"),
            split="validation",
            stream_rows=stream_rows,
        )


def test_a_named_source_gives_the_run_config_fix_for_a_missing_column(tmp_path: Path) -> None:
    with pytest.raises(
        DataError, match=r"^dataset 'math' .*'prompt'.*columns\.prompt/columns\.response"
    ):
        _load(tmp_path, path=str(FIXTURES / "metamath.jsonl"), format="instruction", name="math")


def test_unknown_extension_lists_the_known_ones(tmp_path: Path) -> None:
    (tmp_path / "rows.csv").write_text("text\nhello\n")
    with pytest.raises(
        DataError, match=r"unknown extension '\.csv'.*\.jsonl, \.json, \.parquet, \.txt"
    ):
        _load(tmp_path, path=str(tmp_path / "rows.csv"))


@pytest.mark.parametrize(
    ("fixture", "fields", "message"),
    [
        ("metamath.jsonl", {}, r"a text dataset needs column\(s\) 'text'.*set text_column"),
        ("wikipedia.jsonl", {"text_column": "body"}, r"'body'.*'title', 'text'"),
        ("metamath.jsonl", {"format": "instruction"}, r"'prompt'.*prompt_column/response_column"),
        (
            "openorca.jsonl",
            {"format": "instruction", "prompt_column": "question", "system_column": "system"},
            r"'system'",
        ),
        ("tinyarc.jsonl", {"format": "multiple_choice"}, r"'answer'.*answer_column"),
    ],
)
def test_missing_column_names_it_and_the_fix(
    tmp_path: Path, fixture: str, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(DataError, match=message):
        _load(tmp_path, path=str(FIXTURES / fixture), **fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"path": "a.jsonl", "hub_id": "org/name"}, "got path and hub_id"),
        ({"hub_id": "org/name", "rows": [{"text": "a"}]}, "got hub_id and rows"),
        ({"rows": [{"text": "a"}]}, "rows= must be a datasets.Dataset, got list"),
        ({"path": "a.jsonl", "format": "chat"}, "format='chat'"),
        ({"path": "a.jsonl", "budget": 0}, "budget=0"),
        ({"path": "a.jsonl", "eval_size": 1.5}, r"eval_size=1\.5"),
        ({"path": "a.jsonl", "test_size": -3}, "test_size=-3"),
        ({"path": "a.jsonl", "eval_size": True}, "eval_size must be"),
        ({"path": "a.jsonl", "eval_size": 0.6, "test_size": 0.6}, "eval_size \\+ test_size"),
    ],
)
def test_invalid_source_fields(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError, match=message):
        DataSource(**fields)


def test_a_source_without_rows_is_refused_when_loaded() -> None:
    with pytest.raises(DataError, match="no rows to read; give path="):
        load_rows(DataSource(name="math"))


def test_fields_build_columns_from_templates_paths_and_lists(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    row = {"doc": "D.", "q": "Q?", "targets": {"choices": ["a", "b"]}, "ans0": "x", "ans1": "y"}
    path.write_text(json.dumps(row) + "\n")
    fields = {
        "prompt": "{doc}\n\nQuestion: {q}",
        "nested": "targets.choices",
        "spread": ["ans0", "ans1"],
        "first": "{targets[choices][0]}",
    }
    rows = _load(tmp_path, path=str(path), fields=fields, text_column="prompt")
    assert rows[0]["prompt"] == "D.\n\nQuestion: Q?"
    assert rows[0]["nested"] == ["a", "b"]
    assert rows[0]["spread"] == ["x", "y"]
    assert rows[0]["first"] == "a"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"prompt": "{missing}"},
            r"fields.prompt = '\{missing\}' reads 'missing', which row 0 does not have",
        ),
        ({"prompt": "a.b"}, r"fields.prompt = 'a.b' reads 'a.b'"),
    ],
)
def test_fields_naming_a_missing_column_are_clear(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(DataError, match=message):
        _load(tmp_path, path=str(FIXTURES / "wikipedia.jsonl"), fields=fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": 3}, "fields.prompt: give a template string"),
        ({"prompt": "{oops"}, "not a valid format string"),
    ],
)
def test_malformed_fields_are_refused_up_front(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError, match=message):
        DataSource(path="x.jsonl", fields=fields)


def test_drop_empty_removes_rows_without_a_response(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    lines = [
        {"prompt": "a", "response": "b"},
        {"prompt": "c", "response": None},
        {"prompt": "d", "response": ""},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = _load(tmp_path, path=str(path), format="instruction", drop_empty=("response",))
    assert rows["prompt"] == ["a"]
    with pytest.raises(DataError, match=r"drop_empty names columns \['answer'\]"):
        _load(tmp_path, path=str(path), format="instruction", drop_empty=("answer",))


def test_stream_rows_without_a_shuffle_buffer_reads_the_first_rows_of_a_stream_once(
    tmp_path: Path, load_dataset_calls: list[dict[str, Any]]
) -> None:
    calls = load_dataset_calls
    path = tmp_path / "corpus.jsonl"
    path.write_text((FIXTURES / "wikipedia.jsonl").read_text())
    rows = _load(tmp_path, path=str(path), stream_rows=4, stream_shuffle_buffer=0)
    assert [call["streaming"] for call in calls] == [True]
    first_four = [json.loads(line)["text"] for line in path.read_text().splitlines()[:4]]
    assert rows["text"] == first_four
    # A second read (another run, or another process) takes the rows from the disk cache...
    assert (
        _load(tmp_path, path=str(path), stream_rows=4, stream_shuffle_buffer=0)["text"]
        == first_four
    )
    assert len(calls) == 1
    # ...until the file changes.
    path.write_text("".join(json.dumps({"text": f"new {i}"}) + "\n" for i in range(5)))
    assert _load(tmp_path, path=str(path), stream_rows=4, stream_shuffle_buffer=0)["text"] == [
        f"new {i}" for i in range(4)
    ]
    assert len(calls) == 2
    with pytest.raises(DataError, match="stream_rows=0: use a positive row count"):
        DataSource(path="x.jsonl", stream_rows=0)


def test_a_streamed_folder_is_read_again_when_one_of_its_files_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, load_dataset_calls: list[dict[str, Any]]
) -> None:
    calls = load_dataset_calls
    folder = tmp_path / "corpus"
    folder.mkdir()
    data = folder / "part-0.jsonl"
    data.write_text("".join(json.dumps({"text": f"old {i}"}) + "\n" for i in range(5)))
    monkeypatch.chdir(tmp_path)  # a relative folder: its cache key is its absolute path
    assert _load(tmp_path, path="corpus", stream_rows=3, stream_shuffle_buffer=0)["text"] == [
        "old 0",
        "old 1",
        "old 2",
    ]
    assert _load(tmp_path, path=str(folder), stream_rows=3, stream_shuffle_buffer=0)["text"] == [
        "old 0",
        "old 1",
        "old 2",
    ]
    assert len(calls) == 1  # the same folder, relative or absolute: read from the cache
    data.write_text("".join(json.dumps({"text": f"new {i}"}) + "\n" for i in range(5)))
    assert _load(tmp_path, path="corpus", stream_rows=3, stream_shuffle_buffer=0)["text"] == [
        "new 0",
        "new 1",
        "new 2",
    ]
    assert len(calls) == 2
    # Other reading code reads the stream again.
    monkeypatch.setattr(loading_module, "LOADING_VERSION", "edited-code")
    assert _load(tmp_path, path="corpus", stream_rows=3, stream_shuffle_buffer=0)["text"] == [
        "new 0",
        "new 1",
        "new 2",
    ]
    assert len(calls) == 3


def test_a_stream_is_shuffled_with_its_seed_before_its_rows_are_taken(
    tmp_path: Path, load_dataset_calls: list[dict[str, Any]]
) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(200)))

    def take(seed: int, cache: str) -> list[str]:
        source = DataSource(
            path=str(path), stream_rows=10, stream_seed=seed, stream_shuffle_buffer=50
        )
        return list(load_rows(source, cache_dir=tmp_path / cache)["text"])

    first = take(0, "a")
    assert first != [f"doc {i}" for i in range(10)]
    assert len(set(first)) == 10
    # The same seed read from the stream again (another cache, so not read back from disk).
    assert take(0, "b") == first
    assert len(load_dataset_calls) == 2 and all(call["streaming"] for call in load_dataset_calls)
    assert take(1, "c") != first
    with pytest.raises(DataError, match="stream_shuffle_buffer=-1: use a row count >= 0"):
        DataSource(path="x.jsonl", stream_rows=5, stream_shuffle_buffer=-1)


def test_revision_and_data_files_go_to_load_dataset(
    tmp_path: Path, load_dataset_calls: list[dict[str, Any]]
) -> None:
    # A folder holding the same rows as .csv and .jsonl, as a hub repository without configs.
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "rows.jsonl").write_text(
        json.dumps({"question": "q?", "standard_answer": "a"}) + "\n"
    )
    (folder / "rows.csv").write_text("question,standard_answer\nq?,a\n")
    rows = _load(
        tmp_path,
        path=str(folder),
        data_files="rows.jsonl",
        format="instruction",
        prompt_column="question",
        response_column="standard_answer",
    )
    assert load_dataset_calls[-1]["data_files"] == "rows.jsonl"
    assert rows.column_names == ["question", "standard_answer"] and len(rows) == 1
    with pytest.raises(
        DataError, match=r"hub dataset org/absent, split train could not be found or loaded"
    ):
        _load(tmp_path, hub_id="org/absent", revision="0123abcd", data_files="x.jsonl")
    assert load_dataset_calls[-1]["revision"] == "0123abcd"
    assert load_dataset_calls[-1]["data_files"] == "x.jsonl"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"path": "x.jsonl", "revision": "main"},
            r"revision='main' pins a hub dataset's version; it needs hub_id=",
        ),
        ({"hub_id": "org/x", "revision": " "}, r"revision=' ': give a branch, tag or commit"),
        (
            {"path": "x.jsonl", "data_files": "y.jsonl"},
            r"data_files='y.jsonl' chooses files of a hub dataset or ",
        ),
        ({"hub_id": "org/x", "data_files": []}, r"data_files=\[\]: give a file path or glob"),
        (
            {"hub_id": "org/x", "data_files": {"train": ""}},
            r"give a file path or glob .*\{'train': 'data.jsonl'\}",
        ),
    ],
)
def test_revision_and_data_files_are_checked(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError, match=message):
        DataSource(**fields)


def test_strip_strings_removes_a_control_token_from_every_string_column(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(
        json.dumps({"system": "S <|endoftext|>", "chat": "A: hi <|endoftext|>\nB: ok", "n": 3})
        + "\n"
    )
    rows = _load(
        tmp_path,
        path=str(path),
        fields={"text": "{system}\n{chat}"},
        strip_strings=("<|endoftext|>",),
    )
    assert rows[0] == {"system": "S ", "chat": "A: hi \nB: ok", "n": 3, "text": "S \nA: hi \nB: ok"}


def test_stream_stamp_has_every_file_of_a_folder_and_the_hub_revision(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_text("{}\n{}\n")
    stamp = loading_module._stream_stamp(DataSource(path=str(tmp_path), stream_rows=1), {})
    assert stamp["path"] == str(tmp_path.resolve())
    assert [(name, size) for name, size, _ in stamp["files"]] == [
        ("a.jsonl", 3),
        ("sub/b.jsonl", 6),
    ]
    hub = loading_module._stream_stamp(
        DataSource(hub_id="org/corpus", stream_rows=1), {"revision": "abc123"}
    )
    assert hub["revision"] == "abc123" and "files" not in hub


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [{"q": "a", "c": "x"}, {"q": "b", "c": None}],
            r"file .*rows.jsonl, row 1: fields.prompt = '\{q\} \{c\}' reads \{c\}, "
            r"which is null in this row",
        ),
        (
            [{"q": "a", "c": ["x", "y"]}, {"q": "b", "c": ["x"]}],
            r"file .*rows.jsonl, row 1: fields.prompt = '\{q\} \{c\[1\]\}' reads .*, "
            r"which this row does not have",
        ),
    ],
)
def test_fields_missing_or_null_in_a_later_row_name_the_row(
    tmp_path: Path, rows: list[dict[str, Any]], message: str
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    template = "{q} {c}" if rows[1]["c"] is None else "{q} {c[1]}"
    with pytest.raises(DataError, match=message) as raised:
        _load(
            tmp_path,
            path=str(path),
            format="instruction",
            fields={"prompt": template},
            response_column="q",
        )
    assert len(str(raised.value).splitlines()) == 1


def test_the_metric_defaults_to_the_formats_own() -> None:
    assert DataSource(path="x.jsonl").metric == "loss"
    assert DataSource(path="x.jsonl", format="instruction", metric="loss").metric == "loss"
    assert DataSource(path="x.jsonl", format="multiple_choice").metric == "accuracy"
    with pytest.raises(DataError, match="metric='accuracy' needs format='multiple_choice'"):
        DataSource(path="x.jsonl", format="text", metric="accuracy")
