"""How far a reader jumps, following one run's configuration from the command line to the
first mixture update.

    python scripts/argument_walk.py [--json] [--sequence]

It runs ``dynamics run CONFIG.yaml`` through ``dynamics.cli.main`` on the tiny offline run
of ``tests/engine/test_run.py`` (``tiny_config``: a random-init two-layer Llama, the fixture
tokenizer, four fixture datasets, the dynamics method updating at step 0) in a temporary
folder, under ``sys.setprofile``, and stops the run when the policy is first asked for a
mixture (the first call of a function named ``decide``).

The rule, applied to every Python call between ``dynamics.cli.main`` and that point:

- a call is *on the walk* when its function is defined in ``src/dynamics`` and one of its
  arguments (``self`` and ``cls`` included) is the run's configuration or a part of it: a
  ``ConfigSection`` instance (``RunConfig`` is one; so are its sections and each
  ``DatasetConfig``), a list, tuple or dict holding one, or an object of a ``dynamics``
  class that holds one in its attributes, two levels down at most (``RunComponents`` holds
  the whole config; the run folder's writer holds the components). Pydantic's validators
  of the config count, since they receive the section they check; values read out of a
  section (an int, a string) are not followed, since nothing at run time marks where they
  came from;
- consecutive calls on the walk in the same file are one *stop* (a reader reads a file's
  functions in one go);
- a *return* is a stop in a file that an earlier stop already visited: the reader leaves a
  file and has to come back to it.

It prints the number of stops, of distinct files and of returns (with ``--sequence``, every
stop: its file and the functions called there, in order; with ``--json``, all of it as
JSON). The run is deterministic (fixed seeds, no network), so the numbers are the same on
every machine for the same source tree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "dynamics"
# How deep an object's attributes are searched for the config: a run's parts hold it
# (``RunComponents.config``), and the run folder's writer holds the parts.
HOLDER_DEPTH = 2


class FirstUpdate(BaseException):
    """Raised into the run at the policy's first decision: the walk ends there. A
    BaseException, so that no ``except Exception`` of the run catches it."""


@dataclass
class Stop:
    file: str
    functions: list[str] = field(default_factory=list)


@dataclass
class Walk:
    stops: list[Stop] = field(default_factory=list)

    def add(self, file: str, function: str) -> None:
        if not self.stops or self.stops[-1].file != file:
            self.stops.append(Stop(file))
        if not self.stops[-1].functions or self.stops[-1].functions[-1] != function:
            self.stops[-1].functions.append(function)

    @property
    def files(self) -> list[str]:
        return list(dict.fromkeys(stop.file for stop in self.stops))

    @property
    def returns(self) -> int:
        return len(self.stops) - len(self.files)

    def as_dict(self) -> dict[str, Any]:
        return {
            "stops": len(self.stops),
            "files": len(self.files),
            "returns": self.returns,
            "sequence": [{"file": s.file, "functions": s.functions} for s in self.stops],
        }


def _holds_config(value: Any, section: type, depth: int = HOLDER_DEPTH) -> bool:
    """Whether ``value`` is a config section, a list, tuple or dict holding one, or an object
    of a ``dynamics`` class holding one in its attributes (``depth`` levels down)."""
    if isinstance(value, section):
        return True
    if isinstance(value, list | tuple):
        return any(_holds_config(v, section, depth) for v in value)
    if isinstance(value, dict):
        return any(_holds_config(v, section, depth) for v in value.values())
    holder = type(value).__module__.startswith("dynamics.") and not isinstance(value, type)
    if depth == 0 or not holder or not hasattr(value, "__dict__"):
        return False
    return any(_holds_config(v, section, depth - 1) for v in vars(value).values())


def _arguments(frame: FrameType) -> list[Any]:
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
    values = [frame.f_locals.get(name) for name in code.co_varnames[:count]]
    return values


def walk_tiny_run(workdir: Path) -> Walk:
    """The walk of ``dynamics run`` on the tiny offline run, in ``workdir``."""
    import yaml
    from tests.engine.test_run import tiny_config
    from tests.fixtures.tiny_tokenizer import tiny_tokenizer

    from dynamics.cli import main
    from dynamics.engine.config import ConfigSection

    tokenizer_dir = workdir / "tokenizer"
    tiny_tokenizer().save_pretrained(tokenizer_dir)
    config_path = workdir / "run.yaml"
    config_path.write_text(yaml.safe_dump(tiny_config(tokenizer_dir, workdir / "run")))
    source = str(SOURCE) + os.sep
    walk = Walk()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(source):
            return
        if code.co_name == "decide":
            raise FirstUpdate
        if any(_holds_config(v, ConfigSection) for v in _arguments(frame)):
            relative = os.path.relpath(code.co_filename, SOURCE.parent)
            walk.add(relative, code.co_qualname)

    sys.setprofile(profile)
    try:
        main(["run", str(config_path), "--no-progress"])
    except FirstUpdate:
        pass
    else:
        raise SystemExit("the run ended without a mixture update: the walk has no end")
    finally:
        sys.setprofile(None)
    return walk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the walk as JSON")
    parser.add_argument("--sequence", action="store_true", help="print every stop")
    args = parser.parse_args()
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(variable, "1")
    sys.path[:0] = [str(SOURCE.parent), str(ROOT)]
    with tempfile.TemporaryDirectory(prefix="argument-walk-") as tmp:
        # The datasets cache in the temporary folder, so every walk tokenizes afresh.
        os.environ["HF_DATASETS_CACHE"] = str(Path(tmp) / "datasets-cache")
        walk = walk_tiny_run(Path(tmp))
    if args.json:
        print(json.dumps(walk.as_dict(), indent=2))
        return
    print(f"stops: {len(walk.stops)}")
    print(f"files: {len(walk.files)}")
    print(f"returns to a file already visited: {walk.returns}")
    if args.sequence:
        for number, stop in enumerate(walk.stops, 1):
            print(f"{number:3d} {stop.file}: {', '.join(stop.functions)}")


if __name__ == "__main__":
    main()
