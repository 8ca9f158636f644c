"""The model card of a real tiny run folder, and ``dynamics push`` offline: ``--dry-run``,
and an upload through a stand-in ``HfApi`` that records what would reach the Hub."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.hf_api import ModelInfo
from safetensors.torch import load_file

from dynamics.cli import main as cli_main
from dynamics.engine.config import RunConfig
from dynamics.engine.model import load_causal_lm
from dynamics.engine.run import run
from dynamics.runs.model_card import MARKER, card_is_missing, write_model_card
from dynamics.runs.rundir import RunDirError, read_jsonl
from tests.engine.test_run import tiny_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# What a tiny LoRA run's best_checkpoint/ holds, and so what push uploads (the card included).
CHECKPOINT_FILES = [
    "README.md",
    "adapter_config.json",
    "adapter_model.safetensors",
    "chat_template.jinja",
    "step.txt",
    "tokenizer.json",
    "tokenizer_config.json",
]


@pytest.fixture(scope="module")
def finished_run(tokenizer_dir, tmp_path_factory) -> Path:
    """A tiny finished run (8 steps, updates at 0, 2, 4, one feasible checkpoint); each test
    works on its own copy."""
    out = tmp_path_factory.mktemp("model-card") / "run"
    run(RunConfig.from_dict(tiny_config(tokenizer_dir, out)), progress=False)
    return out


@pytest.fixture
def run_folder(finished_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


def test_the_card_describes_the_run_from_its_files(run_folder):
    summary = json.loads((run_folder / "summary.json").read_text())
    step = summary["best_checkpoint"]["step"]
    path = write_model_card(run_folder)

    assert path == run_folder / "best_checkpoint" / "README.md"
    text = path.read_text()
    meta = front_matter(text)
    assert meta["library_name"] == "peft"
    assert meta["tags"][:2] == ["dynamics", "data-mixture"] and "lora" in meta["tags"]
    assert "base_model" not in meta  # built from init_config: no hub id to name
    assert "license" not in meta and "datasets" not in meta  # neither is known
    card = ModelCard(text)  # the Hub's own parser reads the metadata
    assert card.data.library_name == "peft"

    assert MARKER in text
    # Targets and constraints, with their metrics.
    assert "| math | target | loss |" in text
    assert "| orca | constraint | loss |" in text and "| mmlu | constraint | accuracy |" in text
    # The mixture trajectory: one row per update of controller.jsonl, its weights as chosen.
    for update in read_jsonl(run_folder / "controller.jsonl"):
        weights = " | ".join(f"{w:.3f}" for w in update["weights"])
        assert f"| {update['step']} | {weights} |" in text
    # The final mixture, and the one trained on at the chosen step.
    last = read_jsonl(run_folder / "controller.jsonl")[-1]
    final = ", ".join(
        f"{name} {w:.3f}" for name, w in zip(summary["dataset_names"], last["weights"], strict=True)
    )
    assert (
        f"Final mixture (update at step {last['step']}, in force to the end of the run): {final}."
        in text
    )
    # The reduction and each constraint's slack at the chosen step, the worst named.
    assert f"step {step} of {summary['total_steps']}" in text
    assert f"{100 * summary['constrained_ppl_reduction']:.1f}%" in text
    row = next(r for r in read_jsonl(run_folder / "metrics.jsonl") if r["step"] == step)
    chosen = ", ".join(f"{name} {w:.3f}" for name, w in row["weights"].items())
    assert f"Mixture trained on at the chosen step {step}: {chosen}." in text
    for name, slack in row["constraint_slack"].items():
        shown = f"{slack:+.3f} accuracy" if name == "mmlu" else f"{slack:+.4f} nats"
        assert any(
            line.startswith(f"| {name} |") and line.endswith(f"| {shown} |")
            for line in text.splitlines()
        )
    worst = min(row["constraint_slack"], key=row["constraint_slack"].get)
    assert f"Worst constraint slack at step {step}: {worst}," in text
    # How to load it, and how it was trained.
    assert 'PeftModel.from_pretrained(base, "' + str(run_folder / "best_checkpoint") + '")' in text
    assert "DynaMiCS, variant robust, schedule [0, 2, 4]" in text and "8 optimizer steps" in text
    assert "LoRA rank 4, alpha 8.0, on q_proj, v_proj" in text


def test_hub_names_reach_the_metadata_and_the_loading_snippet(run_folder):
    config = yaml.safe_load((run_folder / "config.yaml").read_text())
    config["model"] = {
        **config["model"],
        "name_or_path": "some-org/base-model",
        "init_config": None,
    }
    config["model"]["quantization"] = {"bits": 4}
    config["datasets"][1].update(path=None, hub_id="some-org/wiki-data")
    (run_folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    text = write_model_card(run_folder, repo_id="me/tuned").read_text()
    meta = front_matter(text)
    assert meta["base_model"] == "some-org/base-model"
    assert meta["datasets"] == ["some-org/wiki-data"]
    assert "qlora" in meta["tags"]
    assert 'AutoPeftModelForCausalLM.from_pretrained("me/tuned")' in text
    assert "QLoRA (4-bit base weights)" in text


def _base_card(folder: Path, front: str) -> Path:
    """A base model's own card (``README.md``) with ``front`` as its front matter."""
    folder.mkdir(parents=True)
    (folder / "README.md").write_text(f"---\n{front}---\n\n# The base model\n")
    return folder


def _name_base(run_folder: Path, name_or_path: str, revision: str | None = None) -> None:
    config = yaml.safe_load((run_folder / "config.yaml").read_text())
    config["model"] = {
        **config["model"],
        "name_or_path": name_or_path,
        "revision": revision,
        "init_config": None,
    }
    (run_folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def test_the_license_is_the_one_of_a_local_base_folder(run_folder, tmp_path):
    base = _base_card(tmp_path / "base", "license: apache-2.0\ntags: [text-generation]\n")
    _name_base(run_folder, str(base))

    card = ModelCard.load(write_model_card(run_folder))

    assert card.data.license == "apache-2.0"
    assert card.data.base_model is None  # a local folder is no hub id


def test_the_license_is_the_one_of_a_base_in_the_hub_cache(run_folder, tmp_path, monkeypatch):
    """The cache as huggingface_hub lays it out: refs/<revision> names a snapshot folder."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    repo = cache / "models--some-org--base-model"
    _base_card(
        repo / "snapshots" / "0123abcd",
        "license: other\nlicense_name: base-model-license\nlicense_link: https://example.org/LICENSE\n",
    )
    (repo / "refs").mkdir()
    (repo / "refs" / "v1").write_text("0123abcd")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    _name_base(run_folder, "some-org/base-model", revision="v1")

    meta = front_matter(write_model_card(run_folder).read_text())

    assert meta["base_model"] == "some-org/base-model"
    assert (meta["license"], meta["license_name"], meta["license_link"]) == (
        "other",
        "base-model-license",
        "https://example.org/LICENSE",
    )
    _name_base(
        run_folder, "some-org/base-model", revision="v2"
    )  # another revision: its card is not cached
    assert "license" not in front_matter(write_model_card(run_folder).read_text())


def test_lm_eval_results_reach_the_model_index_and_the_body(run_folder):
    shutil.copy(FIXTURES / "lm_eval.json", run_folder / "lm_eval.json")

    path = write_model_card(run_folder, repo_id="me/tuned")

    meta = front_matter(path.read_text())
    (entry,) = meta["model-index"]
    assert entry["name"] == "me/tuned"
    values = {
        (result["dataset"]["type"], metric["name"]): metric["value"]
        for result in entry["results"]
        for metric in result["metrics"]
    }
    # The best checkpoint's values of tests/fixtures/lm_eval.json, stderr left out.
    assert values == {
        ("tinyArc", "acc_norm"): 0.4387,
        ("tinyGSM8k", "exact_match (strict-match)"): 0.1,
        ("tinyGSM8k", "exact_match (flexible-extract)"): 0.15,
    }
    assert {r["dataset"]["type"]: r["dataset"]["args"] for r in entry["results"]} == {
        "tinyArc": {"num_few_shot": 25},
        "tinyGSM8k": {"num_few_shot": 5},
    }
    card = ModelCard.load(path)  # the Hub's parser reads the model-index back as evaluation results
    assert sorted(r.metric_value for r in card.data.eval_results) == [0.1, 0.15, 0.4387]
    assert "| tinyArc | acc_norm | 0.4125 | 0.4387 |" in card.text
    assert "| tinyGSM8k | exact_match,flexible-extract | - | 0.1500 |" in card.text
    assert "at most 20 documents per task" in card.text


@pytest.mark.parametrize(
    ("limit", "scope"), [(None, "every document of each task"), (0.25, "the first 25% of each")]
)
def test_the_lm_eval_section_says_how_many_documents_were_evaluated(run_folder, limit, scope):
    record = json.loads((FIXTURES / "lm_eval.json").read_text())
    (run_folder / "lm_eval.json").write_text(json.dumps({**record, "limit": limit}))
    assert f"lm-evaluation-harness 0.4.13 on {scope}" in write_model_card(run_folder).read_text()


def _as_full_fine_tuning(run_folder: Path) -> None:
    """The run folder as a full fine-tuning run leaves it: no lora, no adapter in the checkpoint."""
    config = yaml.safe_load((run_folder / "config.yaml").read_text())
    config["lora"] = None
    (run_folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (run_folder / "best_checkpoint" / name).unlink()


def test_full_fine_tuning_is_a_transformers_card(run_folder):
    _as_full_fine_tuning(run_folder)
    text = write_model_card(run_folder).read_text()
    assert front_matter(text)["library_name"] == "transformers"
    assert "AutoModelForCausalLM.from_pretrained(" in text and "full fine-tuning" in text


def test_a_run_without_a_feasible_checkpoint_has_no_card(run_folder):
    summary = json.loads((run_folder / "summary.json").read_text())
    summary["best_checkpoint"] = None
    (run_folder / "summary.json").write_text(json.dumps(summary))
    shutil.rmtree(run_folder / "best_checkpoint")
    with pytest.raises(RunDirError, match="no best_checkpoint/"):
        write_model_card(run_folder)


def test_push_dry_run_writes_the_card_and_lists_the_files(run_folder, capsys):
    card = run_folder / "best_checkpoint" / "README.md"
    assert card_is_missing(card)  # PEFT's empty template

    code = cli_main(["push", str(run_folder), "my-org/my-model", "--dry-run"])

    out = capsys.readouterr().out
    assert code == 0
    assert MARKER in card.read_text()
    assert 'PeftModel.from_pretrained(base, "my-org/my-model")' in card.read_text()
    listed = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert listed == CHECKPOINT_FILES
    assert (
        "would upload 7 files" in out
        and "my-org/my-model (the Hub's visibility for a new repository)" in out
    )


class RecordingApi:
    """A stand-in for ``huggingface_hub.HfApi``: records the calls, touches no network. It
    holds the Hub's repositories (id -> private) and answers as the Hub does: ``create_repo``
    with ``exist_ok`` leaves an existing repository's visibility as it is, ``repo_info`` says
    it, and ``update_repo_settings`` changes it (or refuses, as for a token without admin
    rights)."""

    calls: ClassVar[list[tuple[str, dict]]] = []
    repos: ClassVar[dict[str, bool]] = {}
    refuse_settings: ClassVar[bool] = False
    received: ClassVar[Path | None] = None

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
        self.repos.setdefault(repo_id, bool(kwargs.get("private")))
        return f"https://huggingface.co/{repo_id}"

    def repo_info(self, repo_id, **kwargs):
        self.calls.append(("repo_info", {"repo_id": repo_id, **kwargs}))
        return ModelInfo(id=repo_id, private=self.repos[repo_id])

    def update_repo_settings(self, repo_id, **kwargs):
        self.calls.append(("update_repo_settings", {"repo_id": repo_id, **kwargs}))
        if self.refuse_settings:
            # What the error reads of a response, whichever HTTP client huggingface_hub uses.
            response = SimpleNamespace(status_code=403, headers={}, request=None)
            raise HfHubHTTPError("403 Forbidden", response=response)
        self.repos[repo_id] = kwargs["private"]

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))
        if self.received is not None:  # what the repository receives (the folder may be temporary)
            for name in kwargs["allow_patterns"]:
                target = self.received / kwargs["repo_id"] / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(kwargs["folder_path"]) / name, target)


@pytest.fixture
def hub(monkeypatch, tmp_path) -> type[RecordingApi]:
    """The stand-in Hub, empty, in place of ``huggingface_hub.HfApi``; the files uploaded
    are copied under ``received`` (one folder per repository)."""
    import huggingface_hub

    monkeypatch.setattr(RecordingApi, "received", tmp_path / "hub")
    monkeypatch.setattr(RecordingApi, "calls", [])
    monkeypatch.setattr(RecordingApi, "repos", {})
    monkeypatch.setattr(RecordingApi, "refuse_settings", False)
    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    return RecordingApi


def test_push_creates_the_repo_and_uploads_the_checkpoint_with_its_card(run_folder, capsys, hub):
    code = cli_main(["push", str(run_folder), "my-org/my-model", "--private"])

    out, err = capsys.readouterr()
    assert code == 0, err
    (create, created), _, (upload, uploaded) = hub.calls
    assert create == "create_repo" and created == {
        "repo_id": "my-org/my-model",
        "private": True,
        "exist_ok": True,
        "repo_type": "model",
    }
    assert upload == "upload_folder"
    assert uploaded["repo_id"] == "my-org/my-model" and uploaded["repo_type"] == "model"
    assert Path(uploaded["folder_path"]) == run_folder / "best_checkpoint"
    assert uploaded["allow_patterns"] == CHECKPOINT_FILES
    assert hub.repos == {"my-org/my-model": True} and out.rstrip().endswith("(private)")
    text = (run_folder / "best_checkpoint" / "README.md").read_text()
    assert (
        "AutoPeftModelForCausalLM" not in text
    )  # the tiny base has no hub id: PeftModel on a built base
    assert MARKER in text


def test_push_private_makes_an_existing_public_repo_private(run_folder, capsys, hub):
    hub.repos["my-org/my-model"] = False

    code = cli_main(["push", str(run_folder), "my-org/my-model", "--private"])

    out, err = capsys.readouterr()
    assert code == 0, err
    assert [name for name, _ in hub.calls] == [
        "create_repo",
        "repo_info",
        "update_repo_settings",
        "repo_info",
        "upload_folder",
    ]
    assert hub.calls[2][1] == {"repo_id": "my-org/my-model", "private": True, "repo_type": "model"}
    assert hub.repos == {"my-org/my-model": True} and out.rstrip().endswith("(private)")


def test_push_private_refuses_a_public_repo_it_cannot_make_private(run_folder, capsys, hub):
    hub.repos["my-org/my-model"] = False
    hub.refuse_settings = True

    assert cli_main(["push", str(run_folder), "my-org/my-model", "--private"]) == 2

    out, err = capsys.readouterr()
    assert "upload_folder" not in [
        name for name, _ in hub.calls
    ]  # nothing reached a public repository
    assert "(private)" not in out
    err = err.rstrip("\n")
    assert "\n" not in err and err.startswith(
        "dynamics push: error: --private: my-org/my-model exists and is public"
    )


def test_push_without_private_reports_the_repos_own_visibility(run_folder, capsys, hub):
    hub.repos["my-org/my-model"] = (
        True  # made private on the Hub: pushing without --private keeps it so
    )

    assert cli_main(["push", str(run_folder), "my-org/my-model"]) == 0

    assert "update_repo_settings" not in [name for name, _ in hub.calls]
    assert hub.repos == {"my-org/my-model": True} and capsys.readouterr().out.rstrip().endswith(
        "(private)"
    )


def test_push_without_private_leaves_a_new_repos_visibility_to_the_hub(run_folder, hub):
    assert cli_main(["push", str(run_folder), "my-org/my-model"]) == 0

    create = next(kwargs for name, kwargs in hub.calls if name == "create_repo")
    assert (
        create["private"] is None
    )  # an organisation that makes new repositories private keeps them so


def test_push_keeps_a_card_written_by_hand(run_folder, capsys):
    card = run_folder / "best_checkpoint" / "README.md"
    card.write_text("---\nlicense: mit\n---\n# My own card\n")
    assert cli_main(["push", str(run_folder), "my-org/my-model", "--dry-run"]) == 0
    assert card.read_text() == "---\nlicense: mit\n---\n# My own card\n"
    assert "kept: written by hand" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["push", "RUN", "not a repo id!"], "REPO_ID 'not a repo id!' is not a Hub repository id"),
        (["push", "NOWHERE", "my-org/my-model"], "summary.json is missing"),
        (
            ["push", "RUN", "my-org/my-model", "--merge"],
            "(model.init_config, or a model passed in Python): give --base",
        ),
        (["push", "RUN", "my-org/my-model", "--base", "some-org/base"], "give it with --merge"),
    ],
)
def test_push_refuses_bad_input_in_one_line(argv, expect, run_folder, tmp_path, capsys):
    argv = [
        a.replace("RUN", str(run_folder)).replace("NOWHERE", str(tmp_path / "none")) for a in argv
    ]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.rstrip("\n")
    assert "\n" not in err and err.startswith("dynamics push: error: ") and expect in err


def test_an_update_a_backtrack_abandoned_is_marked_in_the_trajectory(run_folder):
    """The loop stores the mark in the record's ``extra`` (as a backtracking run writes it)."""
    path = run_folder / "controller.jsonl"
    updates = read_jsonl(path)
    updates[1]["extra"]["abandoned"] = True
    path.write_text("".join(json.dumps(u) + "\n" for u in updates))
    rows = [
        line
        for line in write_model_card(run_folder).read_text().splitlines()
        if line.startswith("| ")
    ]
    marked = [row.split(" | ")[0] for row in rows if row.endswith("| abandoned by a backtrack |")]
    assert marked == [f"| {updates[1]['step']}"]


def _tiny_base(run_folder: Path, folder: Path) -> Path:
    """The tiny run's base model saved as a folder: built from its model.init_config with its
    seed, as the run built it (what ``--base`` names for a run that names no base)."""
    config = RunConfig.from_yaml(run_folder / "config.yaml")
    torch.manual_seed(config.training.seed)
    load_causal_lm(config.model).save_pretrained(folder)
    return folder


def test_push_merge_uploads_the_adapter_merged_into_its_base(
    run_folder, tmp_path, capsys, hub, single_thread
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = _tiny_base(run_folder, tmp_path / "base")
    checkpoint = run_folder / "best_checkpoint"

    code = cli_main(["push", str(run_folder), "my-org/my-model", "--merge", "--base", str(base)])

    out, err = capsys.readouterr()
    assert code == 0, err
    received = hub.received / "my-org/my-model"
    files = sorted(p.name for p in received.iterdir())
    assert "model.safetensors" in files and "tokenizer.json" in files and "README.md" in files
    assert not [name for name in files if name.startswith("adapter_")]
    # The weights uploaded are PEFT's merge of the adapter into the base.
    expected = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base), checkpoint
    ).merge_and_unload()
    uploaded = load_file(received / "model.safetensors")
    assert uploaded and set(uploaded) <= set(expected.state_dict())
    assert all(
        torch.equal(tensor, expected.state_dict()[name]) for name, tensor in uploaded.items()
    )
    # They load with transformers alone and compute what the adapter on its base computes.
    merged = AutoModelForCausalLM.from_pretrained(received).eval()
    adapter = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base), checkpoint
    ).eval()
    tokens = AutoTokenizer.from_pretrained(received)(
        "What is 12 times 7? It is 84.", return_tensors="pt"
    )
    with torch.no_grad():
        torch.testing.assert_close(
            merged(**tokens).logits, adapter(**tokens).logits, rtol=1e-5, atol=1e-5
        )
    # The card describes the merged weights, and the adapter's own card is left as it was.
    card = ModelCard.load(received / "README.md")
    assert card.data.library_name == "transformers" and "lora" in card.data.tags
    assert (
        'AutoModelForCausalLM.from_pretrained("my-org/my-model")' in card.text
        and "merged in" in card.text
    )
    assert card_is_missing(checkpoint / "README.md") and "(step 8, merged)" in out


def test_push_merge_of_a_full_fine_tuning_run_has_nothing_to_merge(run_folder, capsys, hub):
    _as_full_fine_tuning(run_folder)

    assert cli_main(["push", str(run_folder), "my-org/my-model", "--merge"]) == 2

    err = capsys.readouterr().err.rstrip("\n")
    assert (
        "\n" not in err
        and "holds whole weights (a full fine-tuning run), so there is no adapter to merge" in err
    )
    assert hub.calls == []
