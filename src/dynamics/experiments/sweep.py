"""Sweeps: configs (or the paper's scenarios) x methods x seeds, one run folder each
(``dynamics sweep``; the file format is in docs/sweeps.md).

The plan is expanded and every run config validated before anything trains, so a bad
sweep file fails in a second with the field named. A run whose folder holds
``summary.json`` is complete and skipped; one whose folder holds a config but no summary
was interrupted and is resumed through the engine's own ``run(..., resume=True)``.

Runs execute as Ray tasks, each reserving ``resources.gpus`` GPUs (then the run trains on
the GPU Ray assigns it) or ``resources.cpus`` CPU cores with as many torch threads (with
``gpus: 0`` the task sees no GPU): on a local Ray instance by default, on a running
cluster with ``address``. A task is not retried; a failed run's traceback goes to
``error.txt`` in its folder. Without Ray installed (it is the optional extra ``ray``) the
runs execute one after another in this process, on whatever devices it sees.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dynamics.core.fixed_mixtures import PAPER_TARGET_MASSES, fixed_mixture_sweep
from dynamics.data.scenarios import ScenarioError, load_scenario
from dynamics.report.sweep import method_label
from dynamics.runs import rundir

SWEEP_FILE = "sweep.json"
"""Written into the sweep's output folder: the plan and what became of every run."""

_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
INHERITED_METHOD_FIELDS = ("probe_cap", "probe_min", "grid", "alignment_batches")
"""The fields of a base config's ``method`` that every method of the sweep keeps."""


class SweepError(ValueError):
    """A sweep file that cannot be used; the message names the field and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Variant = Literal["paper", "robust"]
Predictor = Literal["linear", "curve"]
Scheme = Literal["uniform", "proportional"]


def _dense_warmup() -> list[str | list[int]]:
    return ["dense-warmup"]


def _paper() -> list[Variant]:
    return ["paper"]


def _linear() -> list[Predictor]:
    return ["linear"]


def _both_schemes() -> list[Scheme]:
    return ["uniform", "proportional"]


class DynamicsMethods(_Section):
    schedules: list[str | list[int]] = Field(
        default_factory=_dense_warmup,
        description="Update schedules, one DynaMiCS run each "
        "(presets, fixed:H, or a list of steps).",
    )
    variants: list[Variant] = Field(
        default_factory=_paper,
        description="method.variant values, crossed with the schedules "
        "(default: the paper's method, the reference).",
    )
    predictors: list[Predictor] = Field(
        default_factory=_linear, description="method.predictor values, crossed with the above."
    )


class FixedMethods(_Section):
    schemes: list[Scheme] = Field(
        default_factory=_both_schemes,
        description="Fixed-weight schemes (paper section 4.4); "
        "proportional needs every target's budget.",
    )
    target_masses: list[float] = Field(
        default_factory=lambda: list(PAPER_TARGET_MASSES),
        description="Target masses w in [0, 1]; "
        "configurations identical to an earlier one are skipped.",
    )

    @field_validator("target_masses")
    @classmethod
    def _masses(cls, masses: list[float]) -> list[float]:
        if not masses or any(not 0.0 <= w <= 1.0 for w in masses):
            raise ValueError(
                f"give target masses in [0, 1], e.g. [0, 0.2, 0.5, 0.8, 1]; got {masses}"
            )
        return masses


class AlignmentMethods(_Section):
    schedules: list[str | list[int]] = Field(
        default_factory=_dense_warmup,
        description="Update schedules, one gradient-alignment run each.",
    )


class SweepMethods(_Section):
    dynamics: DynamicsMethods | None = Field(
        None, description="DynaMiCS runs (null or absent: none)."
    )
    fixed: FixedMethods | None = Field(
        None, description="The fixed uniform and proportional grids."
    )
    gradient_alignment: AlignmentMethods | None = Field(
        None, description="Gradient-alignment runs."
    )

    @model_validator(mode="after")
    def _some(self) -> SweepMethods:
        if self.dynamics is None and self.fixed is None and self.gradient_alignment is None:
            raise ValueError(
                "name at least one of dynamics, fixed, gradient_alignment (e.g. 'dynamics: {}')"
            )
        return self


class ScenarioSweep(_Section):
    names: list[str] = Field(
        ..., min_length=1, description="Paper scenarios, e.g. paper/s28 (dynamics scenarios list)."
    )
    datasets: dict[str, dict[str, Any]] = Field(
        ...,
        description="Where each dataset abbreviation's rows are: abbreviation -> fields of a run "
        "config's dataset entry (path or hub_id, format, columns, ...); "
        "name, role and budget come from the scenario.",
    )


class Resources(_Section):
    gpus: float = Field(
        0,
        ge=0,
        description="GPUs per run (Ray task); 0 trains on CPU (the task sees no GPU). "
        "Without Ray (--no-ray) runs use whatever devices the process sees.",
    )
    cpus: int = Field(
        1, ge=1, description="CPU cores per run; it trains with this many torch threads."
    )


class SweepFile(_Section):
    base: str | None = Field(
        None, description="A run config (YAML) every run starts from, relative to the sweep file."
    )
    overrides: list[str] = Field(
        default_factory=list, description="key=value overrides applied to every run."
    )
    configs: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Named variants of the base: name -> its key=value overrides "
        "(default: the base alone).",
    )
    scenarios: ScenarioSweep | None = Field(
        None, description="The paper's scenarios instead of (or crossed with) configs."
    )
    methods: SweepMethods = Field(
        ..., description="The methods every config or scenario is run with."
    )
    seeds: list[int] = Field(
        default_factory=lambda: [0], min_length=1, description="training.seed values."
    )
    resources: Resources = Field(default_factory=Resources, description="What each run reserves.")

    @field_validator("configs")
    @classmethod
    def _names(cls, configs: dict[str, list[str]]) -> dict[str, list[str]]:
        bad = [n for n in configs if not _NAME.match(n)]
        if bad:
            raise ValueError(
                f"config names become folder names: use letters, digits, '.', '_' or '-', not {bad}"
            )
        return configs

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
            raise ValueError(f"give distinct seeds >= 0, got {seeds}")
        return seeds

    @model_validator(mode="after")
    def _something_to_run(self) -> SweepFile:
        if self.base is None and self.scenarios is None and not self.configs:
            raise ValueError("give a base run config (base: run.yaml), configs, or scenarios")
        return self


@dataclass(frozen=True)
class PlannedRun:
    """One run of the sweep: where it goes and its full run config (a validated dict)."""

    config_name: str  # the config or scenario it belongs to
    method: str  # e.g. dynamics-dense-warmup, fixed-uniform-w0.2
    seed: int
    path: Path
    config: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.config_name}/{self.method}/seed{self.seed}"

    def status(self) -> Literal["complete", "interrupted", "new"]:
        if (self.path / rundir.SUMMARY_FILE).is_file():
            return "complete"
        if (self.path / rundir.CONFIG_FILE).is_file():
            return "interrupted"
        return "new"


def _read_mapping(path: Path, missing: str, prefix: str, what: str) -> dict[str, Any]:
    """``yaml.safe_load`` of ``path``, which must hold a mapping; every problem is one
    ``SweepError`` line (``missing`` when there is no such file, ``prefix`` leads the rest)."""
    if not path.is_file():
        raise SweepError(missing)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise SweepError(
            f"{prefix}{path} is not valid YAML: {' '.join(str(err).split())}"
        ) from None
    if not isinstance(data, dict):
        raise SweepError(f"{prefix}{path} must hold {what}")
    return data


def read_sweep_file(path: str | Path) -> SweepFile:
    path = Path(path)
    data = _read_mapping(
        path,
        f"sweep file {path} does not exist",
        "",
        "a mapping (base, configs, methods, seeds, ...); see docs/sweeps.md",
    )
    try:
        return SweepFile.model_validate(data)
    except ValidationError as err:
        from dynamics.engine.config import format_validation_error

        message = format_validation_error(err).replace(
            "invalid config", f"invalid sweep file {path}"
        )
        raise SweepError(message.replace("docs/config.md", "docs/sweeps.md")) from None


def method_sections(
    methods: SweepMethods, base: dict[str, Any]
) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """(label, ``method`` section of the run config) for every method of the sweep, for a
    config whose datasets are ``base['datasets']`` (the fixed grid depends on them), and
    notes on the methods left out for this config."""
    out: list[tuple[str, dict[str, Any]]] = []
    notes: list[str] = []
    keep = {k: v for k, v in (base.get("method") or {}).items() if k in INHERITED_METHOD_FIELDS}
    if methods.dynamics is not None:
        for schedule in methods.dynamics.schedules:
            for variant in methods.dynamics.variants:
                for predictor in methods.dynamics.predictors:
                    section = {**keep, "name": "dynamics", "schedule": schedule, "variant": variant}
                    section["predictor"] = predictor
                    out.append((method_label(section), section))
    if methods.fixed is not None:
        training = [d for d in base["datasets"] if d.get("role") != "constraint"]
        roles = [d["role"] for d in training]
        budgets = [d.get("budget") for d in training]
        unbudgeted = [
            d["name"] for d in training if d["role"] == "target" and not (d.get("budget") or 0) > 0
        ]
        if "proportional" in methods.fixed.schemes and unbudgeted:
            notes.append(
                f"fixed proportional runs left out: the targets {unbudgeted} have no budget "
                "(give each target dataset a budget, or use schemes: [uniform])"
            )
        # Only the schemes asked for: a proportional mixture equal to a uniform one is
        # skipped as a duplicate only when the uniform one is planned too.
        mixtures = fixed_mixture_sweep(
            roles, budgets, methods.fixed.target_masses, schemes=methods.fixed.schemes
        )
        for mixture in mixtures:
            weights = {d["name"]: w for d, w in zip(training, mixture.weights, strict=True)}
            out.append(
                (f"fixed-{mixture.label}", {"name": "fixed", "weights": weights, "schedule": [0]})
            )
    accuracy = [d["name"] for d in base["datasets"] if d.get("metric") == "accuracy"]
    if methods.gradient_alignment is not None and accuracy:
        # Its slopes are gradient dot products, which say nothing about an accuracy (paper
        # appendix "Expressing Constraints in Terms of Accuracy"); the run config refuses it.
        notes.append(
            f"gradient alignment left out: it cannot keep the accuracy constraints {accuracy}"
        )
    elif methods.gradient_alignment is not None:
        for schedule in methods.gradient_alignment.schedules:
            section = {**keep, "name": "gradient-alignment", "schedule": schedule}
            out.append((method_label(section), section))
    return out, notes


def scenario_datasets(name: str, sources: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``datasets`` section of a paper scenario: roles and budgets from its table,
    rows from ``sources`` (abbreviation -> dataset fields)."""
    scenario = load_scenario(name)
    missing = sorted(
        {a for a in scenario.evaluation_domains + tuple(d.abbrev for d in scenario.non_targets)}
        - set(sources)
    )
    if missing:
        raise SweepError(
            f"scenarios.datasets: {name} needs rows for {missing}; "
            f"add e.g. '{missing[0]}: {{path: ...}}' (see docs/sweeps.md)"
        )
    out: list[dict[str, Any]] = []
    for spec, role in [(t, "target") for t in scenario.targets] + [
        (d, "non-target") for d in scenario.non_targets
    ]:
        out.append(
            {**sources[spec.abbrev], "name": spec.abbrev, "role": role, "budget": spec.budget}
        )
    for constraint in scenario.constraints:
        entry = {**sources[constraint.abbrev], "name": constraint.abbrev, "role": "constraint"}
        if constraint.metric == "accuracy":
            entry.update(format="multiple_choice", metric="accuracy")
        out.append(entry)
    return out


def _absolute_paths(config: dict[str, Any]) -> dict[str, Any]:
    """Local paths made absolute, against the current folder as ``dynamics run`` reads them,
    so a run means the same wherever its task executes (workers on one machine, or a
    cluster sharing the filesystem)."""
    model = dict(config.get("model") or {})
    for key in ("name_or_path", "tokenizer"):
        if isinstance(model.get(key), str) and Path(model[key]).exists():
            model[key] = str(Path(model[key]).resolve())
    datasets = []
    for entry in config.get("datasets", []):
        entry = dict(entry)
        if isinstance(entry.get("path"), str):
            entry["path"] = str(Path(entry["path"]).resolve())
        datasets.append(entry)
    return {**config, "model": model, "datasets": datasets}


@dataclass(frozen=True)
class SweepPlan:
    runs: list[PlannedRun]
    notes: list[str]  # methods left out of a config, and why


def plan_sweep(sweep: SweepFile, out: Path, sweep_dir: Path = Path()) -> SweepPlan:
    """Every run of the sweep with its validated config; raises :class:`SweepError` naming
    the run and the field when one is invalid."""
    from dynamics.engine.config import ConfigError, RunConfig, apply_overrides

    base: dict[str, Any] = {}
    if sweep.base is not None:
        base_path = sweep_dir / sweep.base
        base = _read_mapping(
            base_path,
            f"base: {base_path} does not exist (the path is relative to the sweep file)",
            "base: ",
            "a run config mapping",
        )
    try:
        base = apply_overrides(base, sweep.overrides)
        groups: list[tuple[str, dict[str, Any]]] = []
        variants = sweep.configs or {"base": []}
        if sweep.scenarios is not None:
            for scenario in sweep.scenarios.names:
                try:
                    datasets = scenario_datasets(scenario, sweep.scenarios.datasets)
                except ScenarioError as err:
                    raise SweepError(f"scenarios.names: {err}") from None
                for name, overrides in variants.items():
                    label = scenario.replace("/", "-") + ("" if not sweep.configs else f"-{name}")
                    groups.append(
                        (label, apply_overrides({**base, "datasets": datasets}, overrides))
                    )
        else:
            groups = [
                (name, apply_overrides(base, overrides)) for name, overrides in variants.items()
            ]
    except ConfigError as err:
        raise SweepError(f"overrides: {err}") from None
    runs: list[PlannedRun] = []
    notes: list[str] = []
    planned_paths: set[Path] = set()
    for group, config in groups:
        if "datasets" not in config:
            raise SweepError(
                f"{group}: the run config has no datasets; give base: a run config, or scenarios"
            )
        # The config alone first (the sweep sets the method), so that its own mistakes are
        # named as such and the fixed grid reads validated datasets. It is checked under the
        # paper's method, which asks nothing of it: what a variant asks (the robust variant's
        # selection margin needs two eval batches) is checked on each run below.
        method_settings = {
            "variant": "paper",
            **{
                k: v
                for k, v in (config.get("method") or {}).items()
                if k in INHERITED_METHOD_FIELDS
            },
        }
        try:
            checked = RunConfig.from_dict(
                {**config, "method": method_settings, "output_dir": str(out)}
            )
        except ConfigError as err:
            raise SweepError(f"config {group}: {err}") from None
        sections, left_out = method_sections(sweep.methods, checked.model_dump(mode="json"))
        notes += [f"{group}: {note}" for note in left_out]
        for method, section in sections:
            for seed in sweep.seeds:
                path = (out / group / method / f"seed{seed}").resolve()
                data = _absolute_paths(config)
                data["method"] = section
                data["training"] = {**(data.get("training") or {}), "seed": seed}
                data["output_dir"] = str(path)
                try:
                    validated = RunConfig.from_dict(data)
                except ConfigError as err:
                    raise SweepError(f"run {group}/{method}/seed{seed}: {err}") from None
                if path in planned_paths:
                    # Two runs in one folder would overwrite each other (on Ray, train into
                    # it at the same time): refused before anything trains.
                    raise SweepError(_duplicate_message(sweep, group, method, path))
                planned_paths.add(path)
                runs.append(
                    PlannedRun(group, method, seed, path, validated.model_dump(mode="json"))
                )
    return SweepPlan(runs, notes)


def _repeated(values: list[Any]) -> list[Any]:
    seen: list[Any] = []
    repeated: list[Any] = []
    for value in values:
        if value in seen and value not in repeated:
            repeated.append(value)
        seen.append(value)
    return repeated


def _duplicate_message(sweep: SweepFile, group: str, method: str, path: Path) -> str:
    """Why two planned runs share ``path``, naming the sweep file's field to fix."""
    where = f"the sweep plans run {group}/{method} twice (both would write {path})"
    if sweep.scenarios is not None and _repeated(sweep.scenarios.names):
        return (
            f"scenarios.names: {where}: remove the repeated scenarios "
            f"{_repeated(sweep.scenarios.names)}"
        )
    fields: list[tuple[str, list[Any]]] = []
    if method.startswith("dynamics-") and sweep.methods.dynamics is not None:
        dynamics = sweep.methods.dynamics
        fields = [
            ("schedules", dynamics.schedules),
            ("variants", dynamics.variants),
            ("predictors", dynamics.predictors),
        ]
        section = "methods.dynamics"
    elif method.startswith("gradient-alignment-") and sweep.methods.gradient_alignment is not None:
        fields = [("schedules", sweep.methods.gradient_alignment.schedules)]
        section = "methods.gradient_alignment"
    else:
        return f"{where}: give the configs, scenarios and methods distinct names"
    for name, values in fields:
        if _repeated(values):
            return f"{section}.{name}: {where}: remove the repeated entries {_repeated(values)}"
    return (
        f"{section}.schedules: {where}: two of its schedules get the folder label '{method}'; "
        "keep one of them"
    )


def _config_conflicts(runs: list[PlannedRun]) -> dict[str, str]:
    """Runs whose folder holds a config other than the planned one (the sweep file changed
    since they started): they are neither skipped as complete nor resumed."""
    if not runs:
        return {}
    from dynamics.engine.config import RunConfig
    from dynamics.engine.run import RunSetupError, check_same_config

    conflicts = {}
    for planned in runs:
        try:
            check_same_config(
                RunConfig.model_validate(planned.config),
                planned.path,
                how="or move the folder away",
            )
        except RunSetupError as err:
            conflicts[planned.name] = str(err)
    return conflicts


ERROR_FILE = "error.txt"
"""Written into a failed run's folder: the traceback (sweep.json holds the error in one line)."""


def execute_run(config: dict[str, Any], resume: bool, threads: int) -> dict[str, Any]:
    """Train one planned run (a Ray task, or a call in this process); never raises: a
    failure is returned as ``{"error": ..., "error_file": ...}``, with the traceback in the
    run folder's error.txt, so one bad run does not stop the sweep. The run trains on the
    devices this process sees (a Ray task with ``resources.gpus: 0`` sees none)."""
    started = time.perf_counter()
    import torch

    threads_before = torch.get_num_threads()
    folder = Path(config["output_dir"])
    try:
        # A failed attempt's error.txt would make the new attempt's folder look taken.
        (folder / ERROR_FILE).unlink(missing_ok=True)
        from dynamics.engine.config import RunConfig
        from dynamics.engine.run import run

        if not torch.cuda.is_available():
            torch.set_num_threads(threads)
        threads_used = torch.get_num_threads()
        summary = run(RunConfig.from_dict(config), progress=False, resume=resume)
    except Exception as err:  # reported per run; the sweep goes on with the others
        return {
            **record_failure(folder, err, traceback.format_exc()),
            "seconds": time.perf_counter() - started,
        }
    finally:
        torch.set_num_threads(threads_before)  # in-process: leave the caller's threads as they were
    return {
        **summary_results(summary),
        "seconds": time.perf_counter() - started,
        "torch_threads": threads_used,
        "environment_threads": os.environ.get("OMP_NUM_THREADS"),
    }


def summary_results(summary: dict[str, Any]) -> dict[str, Any]:
    """What ``sweep.json`` keeps of a finished run's ``summary.json``."""
    return {
        "feasible": bool(summary["feasible"]),
        "constrained_ppl_reduction": float(summary["constrained_ppl_reduction"]),
        "predicted_cost": float(summary["predicted_cost"]),
    }


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def record_failure(folder: Path, err: BaseException, details: str) -> dict[str, Any]:
    """Write ``details`` (a traceback) to ``folder/error.txt``; the entry sweep.json gets:
    the error in one line, naming that file (or saying why it could not be written)."""
    error_file = folder / ERROR_FILE
    try:
        rundir.atomic_write_text(error_file, details)
    except OSError as write_err:
        return {
            "error": f"{_one_line(err)} (no traceback: {error_file} could not be written: "
            f"{_one_line(write_err)})"
        }
    return {"error": f"{_one_line(err)} (traceback in {error_file})", "error_file": str(error_file)}


def _check_fits(nodes: list[dict[str, Any]], resources: Resources, address: str | None) -> None:
    """Refuse a sweep no node can run (Ray would keep such tasks pending forever)."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    if any(n.get("CPU", 0) >= resources.cpus and n.get("GPU", 0) >= resources.gpus for n in alive):
        return
    where = f"the Ray cluster at {address}" if address else "the local Ray instance"
    largest: dict[str, float] = max(
        alive, key=lambda n: (n.get("GPU", 0), n.get("CPU", 0)), default={}
    )
    raise SweepError(
        f"resources: each run asks for {resources.gpus:g} GPUs and {resources.cpus} CPU cores, "
        f"but no node of {where} has that much "
        f"(the largest: {largest.get('GPU', 0):g} GPUs, {largest.get('CPU', 0):g} cores); "
        "lower resources.gpus / resources.cpus"
        + (", or give --address of a cluster that has them" if address is None else "")
    )


def ray_available() -> bool:
    return importlib.util.find_spec("ray") is not None


def _execute_sequentially(
    jobs: list[tuple[PlannedRun, bool]], threads: int
) -> Iterator[tuple[PlannedRun, dict[str, Any]]]:
    for planned, resume in jobs:
        yield planned, execute_run(planned.config, resume, threads)


def task_options(resources: Resources) -> dict[str, Any]:
    """The options every run's Ray task is submitted with."""
    threads = str(resources.cpus)
    # Set before torch starts in the worker: one run's threads stay within its cores.
    env_vars = {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "TOKENIZERS_PARALLELISM": "false",
    }
    if resources.gpus == 0:
        # Ray sets CUDA_VISIBLE_DEVICES only for tasks given GPUs: a CPU run on a GPU node
        # would otherwise see every GPU and train on the first one, beside the GPU runs.
        env_vars["CUDA_VISIBLE_DEVICES"] = ""
    return {
        "num_cpus": resources.cpus,
        "num_gpus": resources.gpus,
        # No retry: a retried task would find its own half-written folder and fail with
        # "output folder not empty", hiding why the worker died; the failure is recorded
        # and the next `dynamics sweep` resumes the run.
        "max_retries": 0,
        "runtime_env": {"env_vars": env_vars},
    }


def _execute_on_ray(
    jobs: list[tuple[PlannedRun, bool]],
    resources: Resources,
    address: str | None,
    num_cpus: int | None,
) -> Iterator[tuple[PlannedRun, dict[str, Any]]]:
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        # A local instance by default; a running cluster with an address ("auto", "ray://...").
        try:
            ray.init(
                address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False
            )
        except ConnectionError as err:
            raise SweepError(
                f"--address {address}: no Ray cluster answered ({_one_line(err)}); start one "
                "(ray start --head) or leave --address out for a local Ray"
            ) from None
    try:
        _check_fits(ray.nodes(), resources, address)
        task = ray.remote(execute_run).options(**task_options(resources))
        pending = {
            task.remote(planned.config, resume, resources.cpus): planned for planned, resume in jobs
        }
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            planned = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except Exception as err:  # the worker died (killed, out of memory): that run failed
                result = record_failure(planned.path, err, "".join(traceback.format_exception(err)))
            yield planned, result
    finally:
        if started_here:
            ray.shutdown()


def run_sweep(
    sweep: SweepFile,
    out: Path,
    *,
    sweep_dir: Path = Path(),
    use_ray: bool | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Plan, skip the complete runs, resume the interrupted ones, start the others; write
    ``sweep.json`` after every finished run and return it. ``use_ray`` None: Ray when
    installed."""
    plan = plan_sweep(sweep, out, sweep_dir)
    runs = plan.runs
    for note in plan.notes:
        echo(f"sweep: {note}")
    use_ray = ray_available() if use_ray is None else use_ray
    if use_ray and not ray_available():
        raise SweepError(
            "Ray is not installed: pip install 'dynamics[ray]', or run the sweep without Ray"
        )
    statuses: dict[str, str] = {r.name: r.status() for r in runs}
    conflicts = _config_conflicts([r for r in runs if statuses[r.name] != "new"])
    for name, message in conflicts.items():
        statuses[name] = "conflict"
        echo(f"sweep: {name}: left alone: {message}")
    counts = {
        s: sum(1 for v in statuses.values() if v == s)
        for s in ("complete", "interrupted", "new", "conflict")
    }
    echo(
        f"sweep: {len(runs)} runs in {out}: {counts['complete']} complete (skipped), "
        f"{counts['interrupted']} to resume, {counts['new']} to start"
        + (
            f", {counts['conflict']} left alone (another config in their folder)"
            if counts["conflict"]
            else ""
        )
        + "; "
        + (
            f"on Ray ({address or 'local'})"
            if use_ray
            else "one after another in this process (Ray not used)"
        )
    )
    record: dict[str, Any] = {
        "notes": plan.notes,
        "runs": [
            {
                "name": r.name,
                "config": r.config_name,
                "method": r.method,
                "seed": r.seed,
                "path": str(r.path),
                "status": statuses[r.name],
            }
            for r in runs
        ],
    }
    by_name = {row["name"]: row for row in record["runs"]}
    for planned in runs:
        if statuses[planned.name] == "complete":  # skipped now: its results are in its folder
            summary = json.loads((planned.path / rundir.SUMMARY_FILE).read_text())
            by_name[planned.name].update(summary_results(summary))
    out.mkdir(parents=True, exist_ok=True)
    rundir.write_json(out / SWEEP_FILE, record)
    jobs = [
        (r, statuses[r.name] == "interrupted")
        for r in runs
        if statuses[r.name] in ("new", "interrupted")
    ]
    results = (
        _execute_on_ray(jobs, sweep.resources, address, num_cpus)
        if use_ray
        else _execute_sequentially(jobs, sweep.resources.cpus)
    )
    for index, (planned, result) in enumerate(results, start=1):
        row = by_name[planned.name]
        row.update(result)
        row["status"] = "failed" if "error" in result else "done"
        if "error" in result:
            echo(f"[{index}/{len(jobs)}] {planned.name}: FAILED: {result['error']}")
        else:
            echo(
                f"[{index}/{len(jobs)}] {planned.name}: "
                f"{'feasible' if result['feasible'] else 'infeasible'}, "
                f"reduction {100 * result['constrained_ppl_reduction']:.1f}%, "
                f"{result['seconds']:.0f} s"
            )
        rundir.write_json(out / SWEEP_FILE, record)
    final = {
        s: sum(1 for row in record["runs"] if row["status"] == s)
        for s in ("complete", "done", "failed", "conflict")
    }
    echo(
        f"sweep: {final['done']} finished now, {final['complete']} were already complete, "
        f"{final['failed']} failed"
        + (
            f" (see {out / SWEEP_FILE}; rerun the same command to retry them)"
            if final["failed"]
            else ""
        )
        + (f", {final['conflict']} left alone" if final["conflict"] else "")
    )
    return record
