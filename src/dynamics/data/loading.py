"""Where a dataset's rows come from: ``load_rows`` reads a ``DataSource`` (``source``).

Public API:

- ``load_rows(source, cache_dir=None) -> datasets.Dataset``: read the rows with
  ``datasets.load_dataset`` (an lm-eval task's with ``lm_eval_tasks.task_rows``) and check
  that the columns the format needs are there.
- ``check_columns(rows, source)``: that check alone (also run by ``build_examples``).
- ``derive_fields(rows, source)``: the columns ``source.fields`` builds from each row (a
  prompt template over several columns, a nested value, a list of columns), added with
  ``Dataset.map``; ``load_rows`` applies it, and drops the rows ``source.drop_empty`` names.
- ``check_path(source)``: that a local source exists, has a known extension and is not an
  empty file, without reading it (a run checks every dataset this way before loading the
  model), and that its ``chat_template_path`` can be read.
- ``offline()``: whether the Hugging Face libraries are told not to use the network.
- ``DataError`` (``dynamics.data.errors``): every data problem, on one line; the message
  names the dataset (its ``name`` in a run config, and the file or hub id), the field or
  column, and the fix. Errors of ``load_dataset`` (a hub id that cannot be found, offline or
  not; an unknown split; a malformed file) become ``DataError`` too, and so does a file
  without rows.

All parsing is done by the ``datasets`` library: local ``.jsonl``/``.json`` files through
its ``"json"`` builder, ``.parquet`` through ``"parquet"`` and ``.txt`` through ``"text"``
(one row per line, in a ``text`` column). A local folder or a hub id goes to
``load_dataset`` as its ``path`` argument, so anything ``load_dataset`` reads works there.
A hub id can be pinned to a ``revision`` (a branch, tag or commit) and read from chosen
``data_files`` (a repository holding files of several formats and no ``configs`` block,
such as a ``.csv`` next to a ``.jsonl``); both go to ``load_dataset`` as they are.
Huge corpora used as unlimited datasets are read as a stream: ``stream_rows=N`` opens the
split with ``load_dataset(..., streaming=True)``, shuffles it with ``IterableDataset.shuffle``
(``stream_seed``, a buffer of ``stream_shuffle_buffer`` rows, and the order of the shards)
and keeps N rows, so the corpus is never downloaded whole (a sliced split such as
``"train[:20000]"`` would download every file of the split first) and the rows are not
merely the corpus's first ones (the first articles of a dump, the first documents of a
crawl). Those rows are written once to ``datasets``' cache (``Dataset.from_generator``),
keyed by the source (a local path resolved to an absolute one), the seed and buffer, the
size and modification time of every local file read (each file of a folder), the hub
revision when one is given, and ``LOADING_VERSION``, a hash of this module's source, so that a
change of the reading code reads the stream again: later runs read them from disk.
``strip_strings`` removes literal strings (a tokenizer's control token written into the
data, such as Glaive's ``<|endoftext|>``) from every string column. Every row loaded is
tokenized once, up front.
"""

from __future__ import annotations

import hashlib
import os
import re
import string
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import datasets
from datasets import load_dataset
from huggingface_hub import constants as hub_constants

from dynamics.data.chat_templates import read_chat_template
from dynamics.data.errors import DataError, one_line
from dynamics.data.formats import format_of
from dynamics.data.source import STREAM_SHUFFLE_BUFFER, DataSource, FieldSpec

__all__ = [
    "LOCAL_BUILDERS",
    "DataError",
    "DataSource",
    "check_columns",
    "check_path",
    "derive_fields",
    "load_rows",
    "offline",
    "one_line",
    "strip_strings",
]

# File extension -> the ``datasets`` builder that reads it.
LOCAL_BUILDERS: dict[str, str] = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".txt": "text",
}


LOADING_VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
"""A hash of this module's source: part of the cache key of the streamed rows and of the
``fields`` columns, since ``datasets`` fingerprints a module-level function by its name only
(editing the code would otherwise read the old cached rows)."""


_TRUE = ("1", "true", "yes", "y", "on", "t")


def offline() -> bool:
    """Whether the Hugging Face libraries are told not to use the network."""
    variables = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    return bool(hub_constants.HF_HUB_OFFLINE) or any(
        os.environ.get(name, "").strip().lower() in _TRUE for name in variables
    )


def check_columns(rows: datasets.Dataset, source: DataSource) -> None:
    """Raise ``DataError`` naming the missing column, the columns there are and the fix."""
    columns = list(rows.column_names)
    row_format = format_of(source)
    missing = [c for c in row_format.required_columns(source, columns) if c not in columns]
    if not missing:
        return
    fix = row_format.column_fix(source)
    if source.name is not None:
        # A run config names the columns in a `columns` mapping.
        fix = re.sub(r"(\w+)_column", r"columns.\1", fix) + " in the dataset's config"
    raise DataError(
        f"{source.description}: {'an' if source.format[0] in 'aeiou' else 'a'} {source.format} "
        "dataset needs column(s) "
        f"{', '.join(repr(c) for c in missing)}, but its columns are {columns}; {fix}"
    )


def load_rows(
    source: DataSource, cache_dir: str | os.PathLike[str] | None = None
) -> datasets.Dataset:
    """Read the rows of ``source`` with ``datasets.load_dataset`` and check its columns.

    ``cache_dir`` is where ``datasets`` keeps its Arrow cache (its default when None).
    """
    cache = None if cache_dir is None else str(cache_dir)
    check_path(source)
    if source.lm_eval_task is not None:
        from dynamics.data.lm_eval_tasks import task_rows

        return task_rows(source)
    if source.rows is not None:
        loaded = source.rows
    elif source.path is None and source.hub_id is None:
        raise DataError(
            f"{source.description}: no rows to read; give path= (a local file or folder), hub_id= "
            "(a hub dataset id) or rows= (a datasets.Dataset)"
        )
    elif source.path is not None:
        path = Path(source.path)
        if path.is_dir():
            loaded = _load(
                source, str(path), name=source.config_name, cache_dir=cache, **_file_options(source)
            )
        else:
            builder = LOCAL_BUILDERS[path.suffix.lower()]
            if builder in ("json", "text") and _blank(path):
                raise _empty(source)
            loaded = _load(source, builder, data_files=str(path), cache_dir=cache)
    else:
        loaded = _load(
            source, source.hub_id, name=source.config_name, cache_dir=cache, **_file_options(source)
        )
    if not isinstance(loaded, datasets.Dataset):
        raise DataError(
            f"{source.description}: load_dataset returned a {type(loaded).__name__}, not one "
            f"split; set split= to one split (e.g. 'train')"
        )
    if len(loaded) == 0:
        raise _empty(source)
    loaded = derive_fields(loaded, source)
    if source.strip_strings:
        loaded = strip_strings(loaded, source)
    if source.drop_empty:
        loaded = _drop_empty(loaded, source)
    check_columns(loaded, source)
    return loaded


def _path_value(row: Mapping[str, Any], path: str) -> Any:
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(path)
        value = value[part]
    return value


def _field_value(row: Mapping[str, Any], spec: FieldSpec) -> Any:
    if isinstance(spec, list):
        return [_path_value(row, path) for path in spec]
    if "{" in spec:
        formatter = string.Formatter()
        for _, name, _, _ in formatter.parse(spec):
            if name is not None and formatter.get_field(name, (), row)[0] is None:
                raise _NullField(name)
        return spec.format_map(row)
    return _path_value(row, spec)


class _NullField(Exception):
    """A template placeholder whose value is null in a row (it would render as "None")."""


def _build_fields(
    row: dict[str, Any], index: int, specs: dict[str, FieldSpec], description: str, version: str
) -> dict[str, Any]:
    """``Dataset.map`` function of ``derive_fields`` (``version`` only keys its cache)."""
    built = {}
    for name, spec in specs.items():
        try:
            built[name] = _field_value(row, spec)
        except _NullField as err:
            raise DataError(
                f"{description}, row {index}: fields.{name} = {spec!r} reads {{{err}}}, which is "
                "null in this row; fill it, or build the field from other columns"
            ) from None
        except (KeyError, IndexError, AttributeError, TypeError) as err:
            raise DataError(
                f"{description}, row {index}: fields.{name} = {spec!r} reads {err}, which this row "
                "does not have; fix the row, or the template or path"
            ) from None
    return built


def derive_fields(rows: datasets.Dataset, source: DataSource) -> datasets.Dataset:
    """``rows`` with the columns of ``source.fields`` added (``Dataset.map``); a template or
    path naming a column the rows lack raises ``DataError`` with the columns there are, and
    one naming a value missing or null in some row raises ``DataError`` naming the row (a
    template never renders a null as ``"None"``)."""
    if not source.fields:
        return rows
    specs = dict(source.fields)
    first = rows[0]
    for name, spec in specs.items():
        try:
            _field_value(first, spec)
        except _NullField:
            pass  # a null value of row 0 is reported with its row by the map below
        except (KeyError, IndexError, AttributeError, TypeError) as err:
            raise DataError(
                f"{source.description}: fields.{name} = {spec!r} reads {err}, which row 0 does not "
                f"have; its columns are {list(rows.column_names)}: fix the template or path"
            ) from None

    return rows.map(
        _build_fields,
        with_indices=True,
        fn_kwargs={"specs": specs, "description": source.description, "version": LOADING_VERSION},
        desc="fields",
    )


def _file_options(source: DataSource) -> dict[str, Any]:
    """``load_dataset``'s ``revision`` and ``data_files`` where the source sets them."""
    options: dict[str, Any] = {}
    if source.revision is not None:
        options["revision"] = source.revision
    if source.data_files is not None:
        options["data_files"] = source.data_files
    return options


def _strip_row(row: dict[str, Any], strings: tuple[str, ...], version: str) -> dict[str, Any]:
    """``Dataset.map`` function of ``strip_strings`` (``version`` only keys its cache)."""
    stripped = {}
    for key, value in row.items():
        if isinstance(value, str):
            for text in strings:
                value = value.replace(text, "")
            stripped[key] = value
    return stripped


def strip_strings(rows: datasets.Dataset, source: DataSource) -> datasets.Dataset:
    """``rows`` with every ``source.strip_strings`` removed from each string column."""
    return rows.map(
        _strip_row,
        fn_kwargs={"strings": tuple(source.strip_strings), "version": LOADING_VERSION},
        desc="strip_strings",
    )


def _drop_empty(rows: datasets.Dataset, source: DataSource) -> datasets.Dataset:
    missing = [c for c in source.drop_empty if c not in rows.column_names]
    if missing:
        raise DataError(
            f"{source.description}: drop_empty names columns {missing} that the rows lack; its "
            f"columns are {list(rows.column_names)}"
        )
    columns = list(source.drop_empty)
    kept = rows.filter(
        lambda row: all(row[c] not in (None, "", []) for c in columns), desc="drop_empty"
    )
    if len(kept) == 0:
        raise DataError(
            f"{source.description}: every row has an empty {' or '.join(columns)}; check drop_empty"
        )
    return kept


def _first_rows(
    path: str | None,
    split: str,
    rows: int,
    options: dict[str, Any],
    stamp: dict[str, Any],
    seed: int = 0,
    buffer_size: int = STREAM_SHUFFLE_BUFFER,
) -> Iterator[dict[str, Any]]:
    """``rows`` rows of a split read with ``load_dataset(..., streaming=True)``, shuffled with
    ``IterableDataset.shuffle(seed, buffer_size)`` first (the stream's first rows when
    ``buffer_size`` is 0), for ``Dataset.from_generator`` (``stamp`` only keys its cache)."""
    stream = load_dataset(path, split=split, streaming=True, **options)
    if buffer_size > 0:
        stream = stream.shuffle(seed=seed, buffer_size=buffer_size)
    yield from stream.take(rows)


def _stream_stamp(source: DataSource, options: Mapping[str, Any]) -> dict[str, Any]:
    """What the cached first rows of a stream depend on besides the arguments of the read:
    the local path made absolute, the size and time of every local file read (each file of
    a folder, hidden ones aside), the hub revision, and the reading code."""
    stamp: dict[str, Any] = {"version": LOADING_VERSION, "revision": options.get("revision")}
    if source.path is not None:
        root = Path(source.path).resolve()
        if root.is_dir():
            files = sorted(
                p
                for p in root.rglob("*")
                if p.is_file()
                and not any(part.startswith(".") for part in p.relative_to(root).parts)
            )
        else:
            files = [root]
        stamp["path"] = str(root)
        stamp["files"] = [
            (
                p.relative_to(root).as_posix() if root.is_dir() else p.name,
                p.stat().st_size,
                p.stat().st_mtime_ns,
            )
            for p in files
        ]
    return stamp


def check_path(source: DataSource) -> None:
    """Raise ``DataError`` when a local source (or its ``chat_template_path``) is missing,
    has an unknown extension or is an empty file; hub ids pass (they are looked up only
    when loaded)."""
    if source.chat_template_path is not None:
        read_chat_template(source)
    if source.path is None:
        return
    path = Path(source.path)
    if not path.exists():
        raise DataError(
            f"{source.description} does not exist; check the path (relative paths are "
            f"read from the working directory {Path.cwd()})"
        )
    if path.is_dir():
        return
    if path.suffix.lower() not in LOCAL_BUILDERS:
        raise DataError(
            f"{source.description}: unknown extension {path.suffix!r}; use one of "
            f"{', '.join(LOCAL_BUILDERS)} (or convert the file to JSON lines)"
        )
    if path.stat().st_size == 0:
        raise _empty(source)


def _empty(source: DataSource) -> DataError:
    return DataError(
        f"{source.description} is empty: it has no rows (split "
        f"{source.split}); fill it or remove it"
    )


def _blank(path: Path, limit: int = 1 << 20) -> bool:
    """A small text file holding only whitespace (``datasets`` fails obscurely on one)."""
    if path.stat().st_size > limit:
        return False
    return not path.read_bytes().strip()


def _load(source: DataSource, path: str | None, **kwargs: object) -> object:
    """``load_dataset(path, split=source.split, **kwargs)`` with its errors as one-line
    ``DataError``s that name the dataset and the fix."""
    try:
        if source.stream_rows is None:
            return load_dataset(path, split=source.split, **kwargs)
        # The first rows of the stream are written once to datasets' cache, keyed by where
        # they come from (and a local file's size and time), so a later run, or another
        # process of this machine, reads them from disk instead of streaming them again.
        options = {key: value for key, value in kwargs.items() if key != "cache_dir"}
        stamp = _stream_stamp(source, options)
        if source.path is not None and Path(source.path).is_dir():
            path = stamp["path"]  # the same folder, named relatively or not, is one cache entry
        elif source.path is not None:
            options["data_files"] = stamp["path"]
        return datasets.Dataset.from_generator(
            _first_rows,
            gen_kwargs={
                "path": path,
                "split": source.split,
                "rows": source.stream_rows,
                "options": options,
                "stamp": stamp,
                "seed": source.stream_seed,
                "buffer_size": source.stream_shuffle_buffer,
            },
            cache_dir=kwargs.get("cache_dir"),
        )
    except StopIteration:  # what the json builder raises on a file without rows
        raise _empty(source) from None
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as err:
        cause = err.__cause__ or err.__context__
        detail = one_line(err)
        if isinstance(err, datasets.exceptions.DatasetGenerationError) and cause is not None:
            detail = one_line(cause)  # the builder's own error, e.g. the JSON parse error
        if "corresponds to no data" in detail:
            raise _empty(source) from None
        value_error = isinstance(err, ValueError) or isinstance(
            cause, ValueError
        )  # a stream's is its cause
        if value_error and ("split" in detail or "instruction format" in detail):
            raise DataError(
                f"{source.description}: split {source.split!r} cannot be read ({detail}); "
                "set split to one of the dataset's splits (a single local file is "
                "'train'), e.g. 'train[:1000]'"
            ) from None
        if source.hub_id is not None and isinstance(
            err, OSError | datasets.exceptions.DatasetsError
        ):
            if offline():
                why = (
                    "it is not in the local cache and the hub is offline (HF_HUB_OFFLINE or "
                    "HF_DATASETS_OFFLINE is set): check hub_id and config_name, download it once "
                    "online, or use a local path"
                )
            else:
                why = (
                    "check hub_id and config_name (and that you may access it), or use a local path"
                )
            raise DataError(
                f"{source.description} could not be found or loaded: {why} ({detail})"
            ) from None
        raise DataError(f"{source.description} could not be read: {detail}") from None
