"""The README a newcomer reads first: its two commands come first, its run config is valid,
and every page it links to exists."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from dynamics import RunConfig

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_two_commands_are_in_the_first_20_lines():
    head = README.splitlines()[:20]
    assert "bash scripts/demo.sh" in head
    assert "bash scripts/test.sh" in head


def test_the_readme_stays_short():
    assert len(README.splitlines()) < 150


def test_the_run_config_it_shows_is_valid():
    blocks = re.findall(r"```yaml\n(.*?)```", README, flags=re.DOTALL)
    assert len(blocks) == 1
    config = RunConfig.from_dict(yaml.safe_load(blocks[0]))
    assert [dataset.role for dataset in config.datasets] == ["target", "non-target", "constraint"]


def test_every_linked_page_exists():
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        assert (ROOT / link).is_file(), f"README.md links to {link}, which does not exist"


def test_the_page_on_the_default_names_every_rule_and_stays_a_users_page():
    from dynamics.core.rules import RuleSet

    page = (ROOT / "docs" / "beyond-the-paper.md").read_text()
    assert len(page.splitlines()) < 400
    robust = RuleSet.of_variant("robust")
    for name in robust.names:
        default = robust.value(name)
        shown = str(default).lower() if isinstance(default, bool) else repr(float(default))
        assert f"| `{name}` | {shown} |" in page, (
            f"docs/beyond-the-paper.md does not give {name}: {shown}"
        )
