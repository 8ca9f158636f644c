"""The default (``method.variant: robust``) on generated scenarios that nobody tuned it on:
a family of offline scenarios drawn from seeds, with a frozen development / evaluation split.

    .venv/bin/python benchmarks/scenario_families.py --seeds 0-99 [--out runs/families] [--jobs N]
    .venv/bin/python benchmarks/scenario_families.py --seeds 100-199 --frozen-commit <commit>
    .venv/bin/python benchmarks/scenario_families.py --describe --seeds 0-9  # no training
    .venv/bin/python benchmarks/scenario_families.py --report-only [--json FILE]

Each seed draws one scenario (:func:`draw_scenario`) on the demo's base model
(:mod:`dynamics.experiments.demo`): 1-4 targets among the skills, 1-4 constraints (loss on
held-out text or untrained skills, accuracy on the quizzes; an accuracy constraint in every
scenario of even seed), 0-3 non-targets among the general texts and the unused skills (most
often the text a constraint's capability was learnt from, as a practitioner replays it),
target budgets, a learning rate of 0.5-3 times the demo's (log-uniform) and 128-512 steps.
Seeds 0-99 are the development split, 100-199 the evaluation split; the evaluation split
runs only with ``--frozen-commit``, the commit of the default frozen before any evaluation
scenario runs, whose ``src/dynamics`` the checkout must hold, and which every evaluation
scenario records (``scenario.json``).

Per scenario, one training seed: the default, the paper's method and a fine fixed sweep
(uniform over the targets, the rest uniform over the non-targets). Runs that finished under
``--out`` are skipped and crashed ones redone, so the command resumes. The report is read
from run folders only (:func:`family_report`): per scenario the default's test reduction
and whether its checkpoint holds on the test split, the sweep's best at equal compute, the
8-run oracle, the targets alone and the rule of thumb (the fixed target mass best in median
over the development scenarios), then the goal's conditions per split and a table of every
scenario that ran. Checkpoints are chosen on the eval split and reported on the test split.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from dynamics.core import metrics  # noqa: E402
from dynamics.core.cost import CostModel, run_cost  # noqa: E402
from dynamics.core.fixed_mixtures import fixed_mixture_sweep  # noqa: E402
from dynamics.core.schedules import PAPER_TOTAL_STEPS, build_schedule  # noqa: E402
from dynamics.experiments.base_model import domain_paths, ensure_base_model  # noqa: E402
from dynamics.experiments.demo import (  # noqa: E402
    DEMO_BASE_SPEC,
    DemoSettings,
    available_cores,
    demo_config,
    split_general_files,
    train_all,
)
from dynamics.runs import rundir  # noqa: E402
from families_domains import NEW_DOMAINS, write_family_domains  # noqa: E402
from robustness import (  # noqa: E402
    best_fixed,
    needs_training,
    records_result,
    selection_score,
)

# --- the pool of domains ----------------------------------------------------------------

SKILLS = ("arithmetic", "toolcall", "strings", "units", "dates", "sorting")
"""Instruction domains the base model never saw: targets, or non-targets and loss constraints
where a scenario does not target them."""
GENERAL_TEXT = ("code", "prose", "facts", "records")
"""Text domains a scenario may mix in as non-targets."""
HELD_OUT_TEXT = ("code-heldout", "prose-heldout")
"""The rows of ``code`` and ``prose`` pretraining held out (loss constraints)."""
QUIZZES = ("quiz", "modules_quiz")
"""Multiple-choice domains on facts the base model saw (accuracy constraints)."""
IN_BASE_FOLDER = ("arithmetic", "toolcall", "facts", "quiz")
"""Domains read from the base model's folder as the demo reads them; the others are written
under the data folder (:func:`prepare_data`)."""
DATA_SEED = 0
"""The seed the new domains are generated with, the same for every scenario."""

# --- the scenario generator ---------------------------------------------------------------

DEVELOPMENT = range(0, 100)
EVALUATION = range(100, 200)
TARGET_BUDGETS = (250, 500, 1000, 1500)
"""Training rows a target may get; a skill has 1,800 training rows (2,000 less 5% eval and
5% test)."""
DEMO_LR = 1e-4
LR_FACTORS = (0.5, 3.0)
STEPS = (128, 512)
STEP_MULTIPLE = 16
"""Lengths are multiples of 16, so that the main evaluation's interval (an eighth of the
run) divides them."""
MAX_NON_TARGETS = 3
REPLAY = {
    "code-heldout": "code",
    "prose-heldout": "prose",
    "quiz": "facts",
    "modules_quiz": "facts",
}
"""The pool's text each constraint's capability was learnt from in pretraining."""
REPLAY_CHANCE = 0.75
HELD_OUT_CHANCE = 2 / 3
SECOND_QUIZ_CHANCE = 0.25
"""The second quiz sits near chance on the base model (0.33 against 0.25), so it is drawn
rarely and only beside the demo's quiz."""


@dataclass(frozen=True)
class FamilyScenario:
    """One generated scenario: the roles of the pool's domains, and the run's sizes."""

    seed: int
    targets: tuple[str, ...]
    budgets: tuple[int, ...]  # training rows of each target
    non_targets: tuple[str, ...]
    loss_constraints: tuple[str, ...]
    accuracy_constraints: tuple[str, ...]
    lr: float
    steps: int

    @property
    def name(self) -> str:
        return f"s{self.seed:03d}"

    @property
    def split(self) -> str:
        return split_of(self.seed)

    @property
    def constraints(self) -> tuple[str, ...]:
        return (*self.loss_constraints, *self.accuracy_constraints)


def split_of(seed: int) -> str:
    """``development`` for seeds 0-99, ``evaluation`` for 100-199."""
    if seed in DEVELOPMENT:
        return "development"
    if seed in EVALUATION:
        return "evaluation"
    raise ValueError(f"seed {seed} is in no split: use 0-99 (development) or 100-199 (evaluation)")


def draw_scenario(seed: int) -> FamilyScenario:
    """The scenario of ``seed``, drawn with ``random.Random(f"families:{seed}")``.

    Even seeds have the demo's quiz as an accuracy constraint (with the second quiz beside it
    one time in four, where there is room) and odd seeds none, so that exactly half of each
    split has one. Each loss constraint is a held-out text two times in three, while one is
    left, and an untrained skill otherwise. A constraint whose capability was learnt from a
    text of the pool (:data:`REPLAY`) brings that text into the non-targets three times in
    four, as a practitioner keeps some of the data behind what they protect; the other
    non-targets are drawn up to a count of 0-3. Constraints are drawn before non-targets, so
    that an unused skill is a constraint or a non-target, never both (the same rows)."""
    split_of(seed)
    rng = random.Random(f"families:{seed}")
    targets = tuple(rng.sample(SKILLS, rng.randint(1, 4)))
    unused = [s for s in SKILLS if s not in targets]
    constraints = rng.randint(1, 4)
    accuracy: tuple[str, ...] = ()
    if seed % 2 == 0:
        second = constraints >= 2 and rng.random() < SECOND_QUIZ_CHANCE
        accuracy = QUIZZES if second else QUIZZES[:1]
    held_out, skills, loss = list(HELD_OUT_TEXT), list(unused), []
    for _ in range(constraints - len(accuracy)):
        pool = held_out if held_out and (not skills or rng.random() < HELD_OUT_CHANCE) else skills
        loss.append(pool.pop(rng.randrange(len(pool))))
    replayed = dict.fromkeys(
        REPLAY[c] for c in (*loss, *accuracy) if c in REPLAY and rng.random() < REPLAY_CHANCE
    )
    others = [
        name
        for name in (*GENERAL_TEXT, *(s for s in unused if s not in loss))
        if name not in replayed
    ]
    count = rng.randint(0, MAX_NON_TARGETS)
    non_targets = (*replayed, *rng.sample(others, max(0, count - len(replayed))))
    return FamilyScenario(
        seed=seed,
        targets=targets,
        budgets=tuple(rng.choice(TARGET_BUDGETS) for _ in targets),
        non_targets=non_targets[:MAX_NON_TARGETS],
        loss_constraints=tuple(loss),
        accuracy_constraints=accuracy,
        lr=float(f"{DEMO_LR * math.exp(rng.uniform(*map(math.log, LR_FACTORS))):.3g}"),
        steps=rng.randrange(STEPS[0], STEPS[1] + 1, STEP_MULTIPLE),
    )


# --- data and run configs -----------------------------------------------------------------


def prepare_data(base_folder: Path, data_folder: Path) -> dict[str, Path]:
    """Write the files :func:`family_files` names under ``data_folder``: ``code`` and
    ``prose`` split as pretraining split them, and the new domains; return every domain's
    path."""
    split_general_files(base_folder, data_folder)
    write_family_domains(data_folder, DATA_SEED, domain_paths(base_folder)["quiz"])
    return family_files(base_folder, data_folder)


def family_files(base_folder: Path, data_folder: Path) -> dict[str, Path]:
    """Every domain of the pool by name: the demo's generated ones and ``facts`` in the base
    model's folder, the rest under ``data_folder``."""
    in_base = {
        name: path for name, path in domain_paths(base_folder).items() if name in IN_BASE_FOLDER
    }
    written = [*(f"{n}{s}" for n in ("code", "prose") for s in ("", "-heldout")), *NEW_DOMAINS]
    return {**in_base, **{name: data_folder / f"{name}.jsonl" for name in written}}


def scenario_config(
    scenario: FamilyScenario,
    base_folder: Path,
    data_folder: Path,
    out: Path,
    method: dict[str, Any],
) -> dict[str, Any]:
    """The run config of ``scenario`` under ``method``: the demo's (base model, sizes,
    evaluation) at the scenario's rate and length, training seed and data seed the
    scenario's seed, its datasets in the demo's shapes by role and format."""
    files = family_files(base_folder, data_folder)
    settings = DemoSettings(
        total_steps=scenario.steps, fine_tuning_lr=scenario.lr, seed=scenario.seed
    )
    config = demo_config(base_folder, files, out, settings)
    demo = {d["name"]: d for d in config["datasets"]}
    target, text, loss, accuracy = (
        demo["arithmetic"],
        demo["code"],
        demo["code-heldout"],
        demo["quiz"],
    )

    def entry(template: dict[str, Any], name: str, **extra: Any) -> dict[str, Any]:
        return {**template, "name": name, "path": str(files[name]), **extra}

    def trained_as_is(name: str) -> dict[str, Any]:
        # A skill mixed in keeps its instruction format; text is packed as the demo packs it.
        return entry(text, name, **({"format": "instruction"} if name in SKILLS else {}))

    config["datasets"] = [
        *(
            entry(target, name, budget=budget)
            for name, budget in zip(scenario.targets, scenario.budgets, strict=True)
        ),
        *(trained_as_is(name) for name in scenario.non_targets),
        *(
            entry(loss, name, **({"format": "instruction"} if name in SKILLS else {}))
            for name in scenario.loss_constraints
        ),
        *(entry(accuracy, name) for name in scenario.accuracy_constraints),
    ]
    config["method"] = dict(method)
    return config


# --- the plan per scenario -----------------------------------------------------------------

SCHEDULE = "dense-warmup"
DEFAULT = "robust"
PAPER = "paper"
METHODS: dict[str, dict[str, Any]] = {
    DEFAULT: {"name": "dynamics", "schedule": SCHEDULE, "variant": "robust"},
    PAPER: {"name": "dynamics", "schedule": SCHEDULE, "variant": "paper"},
}
"""The default and the paper's method, by the label of their run folders."""
SWEEP_MASSES = (0.0, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.8, 1.0)
ORACLE_MASSES = (0.0, 0.05, 0.1, 0.15, 0.2, 0.5, 0.8, 1.0)
"""The 8 masses of the oracle: the robustness measurement's sweep (``FINE``)."""
TARGETS_ALONE = "fixed-w1"


def fixed_label(mass: float) -> str:
    return f"fixed-w{mass:g}"


def fixed_plan(scenario: FamilyScenario) -> dict[str, dict[str, Any]]:
    """The fixed sweep: target mass w uniform over the targets, 1 - w uniform over the
    non-targets; with no non-target only w = 1 (every mass would train the targets alone)."""
    names = [*scenario.targets, *scenario.non_targets]
    roles = ["target"] * len(scenario.targets) + ["non-target"] * len(scenario.non_targets)
    sweep = fixed_mixture_sweep(roles, [None] * len(names), SWEEP_MASSES, schemes=("uniform",))
    return {
        fixed_label(m.target_mass): {
            "name": "fixed",
            "schedule": [0],
            "weights": dict(zip(names, m.weights, strict=True)),
        }
        for m in sweep
    }


def paper_shape_cost(scenario: FamilyScenario) -> float:
    """The default's cost as a multiple of one fixed run by the cost model at the paper's
    shape (its schedule over 2,048 steps, main evaluations of 200 batches every 64 steps,
    probes' reduced evaluations of 50), for the scenario's datasets (targets and
    non-targets) and evaluation domains (targets and constraints). The default neither
    backtracks nor adds evaluations, so its schedule and these sizes are all its cost."""
    schedule = build_schedule(SCHEDULE, PAPER_TOTAL_STEPS)
    n_datasets = len(scenario.targets) + len(scenario.non_targets)
    n_domains = len(scenario.targets) + len(scenario.constraints)
    return run_cost(schedule, n_datasets, n_domains, CostModel()).relative


def plan(scenario: FamilyScenario) -> dict[str, dict[str, Any]]:
    """Every run of a scenario by its folder's label: the two methods and the fixed sweep."""
    return {**METHODS, **fixed_plan(scenario)}


SCENARIO_FILE = "scenario.json"
FROZEN_SOURCE = "src/dynamics"
"""What the frozen commit pins: the library the runs train with."""


def git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def frozen_commit(
    scenarios: Sequence[FamilyScenario], given: str | None, repo: Path = ROOT
) -> str | None:
    """The full hash of ``given``, the default's frozen commit, once checked: a commit of
    ``repo`` whose ``src/dynamics`` is the one this checkout trains with. Evaluation
    scenarios are refused without it; None when neither is there."""
    evaluation = [s.seed for s in scenarios if s.split == "evaluation"]
    if evaluation and given is None:
        raise ValueError(
            "seeds 100-199 are the evaluation split: freeze the default first and give its "
            "commit with --frozen-commit <hash> "
            f"(evaluation seeds asked: {', '.join(map(str, evaluation))})"
        )
    if given is None:
        return None
    resolved = git(repo, "rev-parse", "--verify", "--quiet", f"{given}^{{commit}}")
    if resolved.returncode != 0:
        raise ValueError(
            f"--frozen-commit {given!r} is not a commit of {repo}: "
            "give the default's commit (git log)"
        )
    commit = resolved.stdout.strip()
    if git(repo, "diff", "--quiet", commit, "--", FROZEN_SOURCE).returncode != 0:
        raise ValueError(
            f"{FROZEN_SOURCE} differs from that of --frozen-commit {given}: the evaluation "
            f"split trains the frozen default; run it from a checkout of {given}"
        )
    return commit


def record_scenario(
    folder: Path, scenario: FamilyScenario, commit: str | None, repo: Path = ROOT
) -> None:
    """``scenario.json``: the scenario and, for the evaluation split, the frozen commit its
    runs were made at (and the checkout's, which may add benchmark changes to it); a
    scenario already run at another frozen commit is refused, since its runs would mix two
    defaults."""
    record: dict[str, Any] = {**asdict(scenario), "split": scenario.split}
    if scenario.split == "evaluation":
        head = git(repo, "rev-parse", "HEAD")
        record.update(
            frozen_commit=commit,
            checkout_commit=head.stdout.strip() if head.returncode == 0 else None,
        )
    path = folder / SCENARIO_FILE
    if path.is_file():
        earlier = json.loads(path.read_text()).get("frozen_commit")
        if scenario.split == "evaluation" and earlier != commit:
            raise ValueError(
                f"{folder} ran at --frozen-commit {earlier}, not {commit}: "
                "use another --out for another default"
            )
        return
    rundir.atomic_write_text(path, json.dumps(record, indent=1) + "\n")


def check_labels(scenarios: Sequence[FamilyScenario], labels: Sequence[str] | None) -> None:
    """Refuse a label of ``--runs`` that no scenario of ``scenarios`` plans."""
    unknown = sorted(set(labels or ()) - {label for s in scenarios for label in plan(s)})
    if unknown:
        raise ValueError(
            f"--runs {','.join(unknown)}: no scenario of these seeds plans such a run; use "
            f"{', '.join(METHODS)} or fixed-w<mass>"
        )


def measure_family(
    out: Path,
    seeds: Sequence[int],
    *,
    base_folder: Path,
    frozen: str | None = None,
    repo: Path = ROOT,
    jobs: int = 1,
    labels: Sequence[str] | None = None,
    progress: bool = False,
    log: Callable[[str], None] = print,
) -> None:
    """Run every run of every scenario of ``seeds`` not finished under ``out``
    (``out/s<seed>/<label>``), ``jobs`` at a time on one thread each; a folder without
    ``summary.json`` is a crashed run, redone from the start. ``labels``: only those runs
    of each scenario's plan (None: all). ``frozen``: the default's frozen commit in ``repo``
    (:func:`frozen_commit`), which evaluation seeds need."""
    scenarios = [draw_scenario(seed) for seed in seeds]
    commit = frozen_commit(scenarios, frozen, repo)
    check_labels(scenarios, labels)
    data = out / "data"
    prepare_data(base_folder, data)
    configs: dict[str, dict[str, Any]] = {}
    for scenario in scenarios:
        folder = out / scenario.name
        folder.mkdir(parents=True, exist_ok=True)
        record_scenario(folder, scenario, commit, repo)
        for label, method in plan(scenario).items():
            if (labels is None or label in labels) and needs_training(folder / label):
                log(f"{scenario.name} {label}")
                configs[f"{scenario.name} {label}"] = scenario_config(
                    scenario, base_folder, data, folder / label, method
                )
    train_all(configs, jobs, progress=progress)


# --- baselines and the goal ----------------------------------------------------------------

EQUAL_COMPUTE_SHARE = 0.9
RULE_OF_THUMB_SHARE = 0.75
FEASIBLE_SHARE = 0.9
ORACLE_GAP = 0.03
TARGETS_ALONE_GAP = 0.003
VIOLATION_RATIO = 1.2
MAX_COST = 2.0


def feasible_on_test(result: Mapping[str, Any]) -> bool:
    """The checkpoint chosen on eval exists and keeps every constraint on the test split."""
    return bool(result["feasible"] and result.get("held_test", True))


def fixed_at_mass(
    scenario: FamilyScenario, results: Mapping[str, dict[str, Any]], mass: float
) -> Mapping[str, Any]:
    """The fixed run of target mass ``mass``; without non-targets every mass trains the
    targets alone, the one run of the sweep."""
    return results[fixed_label(mass) if scenario.non_targets else TARGETS_ALONE]


def complete(scenario: FamilyScenario, results: Mapping[str, Any]) -> bool:
    """The default and the whole fixed sweep finished: what the baselines need."""
    return all(label in results for label in [DEFAULT, *fixed_plan(scenario)])


def rule_of_thumb_mass(
    development: Sequence[tuple[FamilyScenario, Mapping[str, dict[str, Any]]]],
) -> float | None:
    """The fixed target mass with the best median test reduction over the development
    scenarios (the smallest on ties); None without a complete development scenario."""
    done = [(s, r) for s, r in development if s.split == "development" and complete(s, r)]
    if not done:
        return None
    medians = {
        m: statistics.median(fixed_at_mass(s, r, m)["reduction_test"] for s, r in done)
        for m in SWEEP_MASSES
    }
    return max(SWEEP_MASSES, key=lambda m: (medians[m], -m))


def scenario_row(
    scenario: FamilyScenario, results: Mapping[str, dict[str, Any]], rule_mass: float | None
) -> dict[str, Any]:
    """The numbers a complete scenario's goal reads, from its runs' results
    (:func:`run_results`); reductions and violations on the test split."""
    default = results[DEFAULT]
    fixed = {label: results[label] for label in fixed_plan(scenario)}
    oracle_pool = {
        fixed_label(m): fixed[fixed_label(m)] for m in ORACLE_MASSES if fixed_label(m) in fixed
    }
    measured_cost = float(default["predicted_cost"])
    some_feasible = any(feasible_on_test(r) for r in fixed.values())
    nothing_feasible = not any(r["feasible"] for r in fixed.values())
    row: dict[str, Any] = {
        "default": default["reduction_test"],
        "default_feasible_test": feasible_on_test(default),
        "default_held_test": default.get("held_test"),
        "paper": results[PAPER]["reduction_test"] if PAPER in results else None,
        "cost": paper_shape_cost(scenario),
        "measured_cost": measured_cost,
        # Equal compute where the runs were made: k is the cost measured at this shape, whose
        # small evaluations make probing weigh more than at the paper's.
        "equal_compute": metrics.chosen_at_k(
            [selection_score(r) for r in fixed.values()],
            [r["reduction_test"] for r in fixed.values()],
            max(1.0, measured_cost),
        ),
        "oracle": oracle_pool[best_fixed(oracle_pool)]["reduction_test"],
        "targets_alone": fixed[TARGETS_ALONE]["reduction_test"],
        "nothing_binds": feasible_on_test(fixed[TARGETS_ALONE]),
        "rule_of_thumb": None
        if rule_mass is None
        else fixed_at_mass(scenario, fixed, rule_mass)["reduction_test"],
        "some_fixed_feasible": some_feasible,
        "nothing_feasible": nothing_feasible,
    }
    if nothing_feasible:
        least = min(fixed, key=lambda label: (fixed[label]["violation_eval"], label))
        row.update(
            violation=default["violation_test"], least_violation=fixed[least]["violation_test"]
        )
    return row


@dataclass(frozen=True)
class Condition:
    name: str
    holds: bool | None  # None: no scenario measures it
    measured: str


def share_condition(name: str, met: Sequence[bool], share: float, goal: str) -> Condition:
    if not met:
        return Condition(name, None, "not measured")
    return Condition(
        name, sum(met) >= share * len(met), f"{sum(met)} of {len(met)} scenarios ({goal})"
    )


def median_condition(name: str, values: Sequence[float], bound: float, goal: str) -> Condition:
    """Holds when the median of ``values`` is at least ``bound``."""
    if not values:
        return Condition(name, None, "not measured")
    median = statistics.median(values)
    return Condition(
        name, median >= bound, f"median {median:+.4f} over {len(values)} scenarios ({goal})"
    )


def goal_conditions(rows: Sequence[Mapping[str, Any]]) -> list[Condition]:
    """The goal over one split's complete scenarios. Where some fixed mixture keeps every
    constraint on test: the default does too in 90% of them; its reduction is at least the
    sweep's best at equal compute in 90% and the rule of thumb's in 75%, and within 3 points
    of the 8-run oracle in median. Where the targets alone keep every constraint (nothing
    binds): within 0.3 points of them in median. Where no fixed mixture is feasible: a
    median violation at most 1.2 times the least-violating fixed mixture's. Everywhere: a
    median cost of at most 2.0 fixed runs by the cost model at the paper's shape
    (:func:`paper_shape_cost`), the cost measured at the runs' own shape reported beside it.
    The rule of thumb is fitted on
    the development split, so only the evaluation split's comparison with it is out of
    sample."""
    feasible = [r for r in rows if r["some_fixed_feasible"]]
    nothing = [r for r in rows if r["nothing_feasible"]]
    if nothing:
        violation = statistics.median(r["violation"] for r in nothing)
        least = statistics.median(r["least_violation"] for r in nothing)
        violation_condition = Condition(
            "nothing feasible",
            violation <= VIOLATION_RATIO * least,
            f"median {violation:.4f} against {least:.4f} over {len(nothing)} scenarios "
            f"(goal: at most {VIOLATION_RATIO}x)",
        )
    else:
        violation_condition = Condition("nothing feasible", None, "not measured")
    costs = [r["cost"] for r in rows]
    measured = [r["measured_cost"] for r in rows]
    return [
        share_condition(
            "feasible", [r["default_feasible_test"] for r in feasible], FEASIBLE_SHARE, "goal: 90%"
        ),
        share_condition(
            "equal compute",
            [r["default"] >= r["equal_compute"] for r in feasible],
            EQUAL_COMPUTE_SHARE,
            "goal: 90%",
        ),
        share_condition(
            "rule of thumb",
            [
                r["default"] >= r["rule_of_thumb"]
                for r in feasible
                if r["rule_of_thumb"] is not None
            ],
            RULE_OF_THUMB_SHARE,
            "goal: 75%",
        ),
        median_condition(
            "oracle",
            [r["default"] - r["oracle"] for r in feasible],
            -ORACLE_GAP,
            "goal: -0.03 or more",
        ),
        median_condition(
            "targets alone",
            [r["default"] - r["targets_alone"] for r in rows if r["nothing_binds"]],
            -TARGETS_ALONE_GAP,
            "goal: -0.003 or more",
        ),
        violation_condition,
        Condition(
            "cost",
            statistics.median(costs) <= MAX_COST,
            f"median {statistics.median(costs):.2f}x, largest {max(costs):.2f}x at the paper's "
            f"shape (goal: median at most {MAX_COST}x); as measured, median "
            f"{statistics.median(measured):.2f}x, largest {max(measured):.2f}x",
        )
        if costs
        else Condition("cost", None, "not measured"),
    ]


# --- reading run folders -------------------------------------------------------------------


ScenarioRuns = tuple[FamilyScenario, dict[str, Any], dict[str, dict[str, Any]]]
"""A scenario as measured: the scenario, its ``scenario.json`` and its runs' results by label."""


def run_results(folder: Path, default_margin: float | None = None) -> dict[str, dict[str, Any]]:
    """Every finished run of a scenario folder by label: :func:`records_result` (feasibility
    on eval, test reduction, ``held_test``, violations) and the cost model's
    ``predicted_cost`` (one fixed run = 1). ``default_margin``: the default's checkpoint
    chosen again at this selection margin, replayed from its records (None: as it ran)."""
    results = {}
    for run in sorted(p for p in folder.iterdir() if (p / "summary.json").is_file()):
        records = rundir.read_run(run)
        margin = default_margin if run.name == DEFAULT else None
        results[run.name] = {
            **records_result(records, margin),
            "predicted_cost": float(records.summary["predicted_cost"]),
        }
    return results


def read_scenarios(out: Path, default_margin: float | None = None) -> list[ScenarioRuns]:
    """(scenario, its ``scenario.json``, its runs' results) of every scenario under ``out``;
    the scenario as recorded, which is the one its runs trained on (``default_margin`` as
    in :func:`run_results`)."""
    found = []
    for path in sorted(out.glob(f"s[0-9][0-9][0-9]/{SCENARIO_FILE}")):
        record = json.loads(path.read_text())
        scenario = recorded_scenario(record)
        found.append((scenario, record, run_results(path.parent, default_margin)))
    return found


def reported_scenarios(report: Path) -> list[ScenarioRuns]:
    """The scenarios of an earlier report (``report.json``, or one kept in
    ``benchmarks/results/``) as :func:`read_scenarios` reads them from run folders: their
    runs' results as recorded, so that a family measured over several machines or sessions,
    whose run folders are gone, is judged as one."""
    entries = json.loads(report.read_text())["scenarios"].values()
    return [
        (recorded_scenario(e), {"frozen_commit": e["frozen_commit"]}, e["runs"]) for e in entries
    ]


class JoinError(ValueError):
    """Scenarios that cannot be judged as one family; the message says which and why."""


def join_scenarios(ran: Sequence[ScenarioRuns], reports: Sequence[Path]) -> list[ScenarioRuns]:
    """The scenarios that ``ran`` (:func:`read_scenarios` of ``--out``) and those of
    ``reports``, by seed, their runs joined by label: a run that ran replaces a report's of
    the same label, and a later report's an earlier one's, so that a change to the default
    needs only the default's runs again (``--runs robust``)."""
    found: dict[int, ScenarioRuns] = {}
    for scenario, record, results in [*(m for r in reports for m in reported_scenarios(r)), *ran]:
        earlier = found.get(scenario.seed)
        if earlier is not None and earlier[0] != scenario:
            raise JoinError(
                f"{scenario.name} is another scenario in one of --with's reports than under "
                "--out: join reports of one generator"
            )
        if earlier is not None and earlier[1].get("frozen_commit") != record.get("frozen_commit"):
            raise JoinError(
                f"{scenario.name} ran at frozen commit {earlier[1].get('frozen_commit')} in one "
                f"place and {record.get('frozen_commit')} in another: its runs would mix two "
                "defaults; join reports of one frozen default"
            )
        runs = {**(earlier[2] if earlier else {}), **results}
        found[scenario.seed] = (scenario, record, runs)
    return [found[seed] for seed in sorted(found)]


def recorded_scenario(record: Mapping[str, Any]) -> FamilyScenario:
    """The scenario of a ``scenario.json``."""
    return FamilyScenario(
        seed=int(record["seed"]),
        targets=tuple(record["targets"]),
        budgets=tuple(record["budgets"]),
        non_targets=tuple(record["non_targets"]),
        loss_constraints=tuple(record["loss_constraints"]),
        accuracy_constraints=tuple(record["accuracy_constraints"]),
        lr=float(record["lr"]),
        steps=int(record["steps"]),
    )


def family_report(
    scenarios: Sequence[tuple[FamilyScenario, Mapping[str, Any], Mapping[str, dict[str, Any]]]],
    default_margin: float | None = None,
) -> dict[str, Any]:
    """Every scenario with its runs and, where complete, its row; the rule of thumb's mass
    (from the development scenarios); the goal per split over its complete scenarios; and
    ``default_margin``, the selection margin the default's runs under ``--out`` were chosen
    again at (:func:`run_results`; None: as they ran)."""
    rule_mass = rule_of_thumb_mass([(s, r) for s, _, r in scenarios])
    report: dict[str, Any] = {
        "rule_of_thumb_mass": rule_mass,
        "default_selection_margin": default_margin,
        "scenarios": {},
        "goal": {},
    }
    rows: dict[str, list[dict[str, Any]]] = {}
    for scenario, record, results in scenarios:
        entry: dict[str, Any] = {
            **asdict(scenario),
            "split": scenario.split,
            "frozen_commit": record.get("frozen_commit"),
            "planned": len(plan(scenario)),
            "runs": dict(results),
        }
        if complete(scenario, results):
            entry["row"] = scenario_row(scenario, results, rule_mass)
            rows.setdefault(scenario.split, []).append(entry["row"])
        report["scenarios"][scenario.name] = entry
    for split, split_rows in sorted(rows.items()):
        report["goal"][split] = [asdict(c) for c in goal_conditions(split_rows)]
    report["frozen_commits"] = sorted(
        {e["frozen_commit"] for e in report["scenarios"].values() if e["frozen_commit"]}
    )
    if len(report["frozen_commits"]) > 1:
        raise JoinError(
            f"the evaluation scenarios ran at frozen commits {', '.join(report['frozen_commits'])}"
            ": one evaluation judges one frozen default; report each commit's scenarios apart"
        )
    return report


CONSTRAINT_KINDS = ("loss_constraints", "accuracy_constraints")


def markdown(report: Mapping[str, Any]) -> str:
    """The table of every scenario that ran (complete or not), then the goal per split."""

    def percent(x: float | None) -> str:
        return "" if x is None else f"{100 * x:.1f}%"

    mass, margin = report["rule_of_thumb_mass"], report["default_selection_margin"]
    lines = [
        f"Rule of thumb: fixed target mass {'not measured' if mass is None else f'{mass:g}'} "
        "(best median over the development scenarios). Test split; checkpoints chosen on eval"
        + (
            "." if margin is None else f", the default's again at a selection margin of {margin:g}."
        ),
        "",
        "| scenario | split | targets | non-targets | constraints (loss; accuracy) | LR | steps "
        "| runs | default | holds on test | paper | best@k (k) | oracle | targets alone "
        "| rule of thumb | violation (least fixed) | cost at the paper's shape |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in report["scenarios"].items():
        row = e.get("row")
        cells = [
            name,
            e["split"],
            ", ".join(e["targets"]),
            ", ".join(e["non_targets"]) or "none",
            "; ".join(", ".join(e[kind]) or "none" for kind in CONSTRAINT_KINDS),
            f"{e['lr']:.3g}",
            str(e["steps"]),
            f"{len(e['runs'])} of {e['planned']}",
        ]
        if row is None:
            default = e["runs"].get(DEFAULT)
            cells += [
                percent(None if default is None else default["reduction_test"]),
                "incomplete",
                *[""] * 7,
            ]
        else:
            held = {True: "yes", False: "no", None: "no checkpoint"}[row["default_held_test"]]
            violation = (
                f"{row['violation']:.4f} ({row['least_violation']:.4f})"
                if row["nothing_feasible"]
                else ""
            )
            cells += [
                percent(row["default"]),
                held,
                percent(row["paper"]),
                f"{percent(row['equal_compute'])} ({row['measured_cost']:.2f})",
                percent(row["oracle"]),
                percent(row["targets_alone"]),
                percent(row["rule_of_thumb"]),
                violation,
                f"{row['cost']:.2f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    for split, conditions in report["goal"].items():
        lines += [
            "",
            f"The goal on the {split} split:",
            "",
            "| condition | holds | measured |",
            "|---|---|---|",
        ]
        for c in conditions:
            holds = {True: "yes", False: "no", None: "not measured"}[c["holds"]]
            lines.append(f"| {c['name']} | {holds} | {c['measured']} |")
    return "\n".join(lines)


# --- the command ----------------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """``0-99``, ``100,105`` or ``0-9,20``: the seeds in order, each once."""
    seeds: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        seeds += range(int(first), int(last or first) + 1)
    if not seeds:
        raise ValueError(f"{text!r} names no seed: use e.g. 0-99, or 100,105")
    return list(dict.fromkeys(seeds))


def describe(scenario: FamilyScenario) -> dict[str, Any]:
    return {
        "name": scenario.name,
        "split": scenario.split,
        **asdict(scenario),
        "runs": list(plan(scenario)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "families")
    parser.add_argument(
        "--seeds", default="0-99", help="e.g. 0-99 (development) or 100-199 (evaluation)"
    )
    parser.add_argument(
        "--frozen-commit", help="the default's commit, frozen before any evaluation scenario runs"
    )
    parser.add_argument("--jobs", type=int, default=available_cores(), help="runs trained at once")
    parser.add_argument(
        "--runs",
        help="train only these labels, e.g. robust (a changed default, beside the fixed runs "
        "of --with's report); default: every run of the plan",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="only read the finished runs under --out"
    )
    parser.add_argument(
        "--selection-margin",
        type=float,
        help="choose the checkpoint of each default run under --out again at this "
        "evaluation.selection_margin, replayed from its records (a candidate selection needs no "
        "training; --with's reports keep theirs); default: as each run chose it",
    )
    parser.add_argument(
        "--describe", action="store_true", help="print the scenarios of --seeds; train nothing"
    )
    parser.add_argument(
        "--json", type=Path, help="where the report goes (default: <out>/report.json)"
    )
    parser.add_argument(
        "--with",
        dest="reports",
        type=Path,
        action="append",
        default=[],
        help="an earlier report.json whose scenarios join those under --out (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        scenarios = [draw_scenario(seed) for seed in seeds]
    except ValueError as error:
        parser.error(f"--seeds: {error}")
    if args.describe:
        print(json.dumps([describe(s) for s in scenarios], indent=1))
        return 0
    if args.selection_margin is not None and not args.selection_margin >= 0:
        parser.error("--selection-margin: give a number of standard errors, 0 or more")
    if not args.report_only:
        labels = None if args.runs is None else args.runs.split(",")
        try:
            frozen_commit(scenarios, args.frozen_commit)
            check_labels(scenarios, labels)
        except ValueError as error:
            parser.error(str(error))
        base = ensure_base_model(spec=DEMO_BASE_SPEC)
        args.out.mkdir(parents=True, exist_ok=True)
        measure_family(
            args.out,
            seeds,
            base_folder=base,
            frozen=args.frozen_commit,
            jobs=args.jobs,
            labels=labels,
            progress=True,
            log=lambda m: print(m, flush=True),
        )
    ran = read_scenarios(args.out, args.selection_margin) if args.out.is_dir() else []
    try:
        report = family_report(join_scenarios(ran, args.reports), args.selection_margin)
    except JoinError as error:
        parser.error(str(error))
    rundir.atomic_write_text(
        args.json or args.out / "report.json", json.dumps(report, indent=1) + "\n"
    )
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
