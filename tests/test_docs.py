"""The README is the page a user reads first (at most 250 lines, linking a docs/ page per
topic), and every performance table in it and in docs/ is what tools/performance_tables.py
makes from the committed benchmark JSON."""

import re

import pytest

from tests.conftest import PROJECT_ROOT
from tools import performance_tables

README = PROJECT_ROOT / "README.md"


def test_the_readme_is_short_and_links_every_docs_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", text))
    pages = {f"docs/{p.name}" for p in (PROJECT_ROOT / "docs").glob("*.md")}
    assert linked == pages and len(pages) >= 6


@pytest.mark.parametrize("name", performance_tables.FILES)
def test_committed_tables_match_the_benchmark_json(name):
    text = (PROJECT_ROOT / name).read_text()
    assert performance_tables.BLOCK.search(text), f"{name} has no generated table"
    assert performance_tables.render(text) == text, f"{name}: run tools/performance_tables.py"


def test_every_table_is_used_and_an_edited_cell_is_put_back():
    texts = [(PROJECT_ROOT / name).read_text() for name in performance_tables.FILES]
    used = {m.group("name") for text in texts for m in performance_tables.BLOCK.finditer(text)}
    assert used == set(performance_tables.TABLES)
    readme = texts[0]
    edited = readme.replace("| `sa_quadratic` | ", "| `sa_quadratic` | 9.99 | ", 1)
    assert edited != readme and performance_tables.render(edited) == readme
    assert performance_tables.main(["--check"]) == 0


def test_the_reports_name_presets_by_their_current_names():
    """The tables print a report's preset names as they are, with no table of former names: every
    preset a report names (a run's ``preset`` or ``model``, a case of the reference comparison and
    so a row of its tables) is one `sa_conv.get_config` builds."""
    import json

    import sa_conv

    named = set()

    def walk(value):
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ("preset", "model") and isinstance(item, str) and item.startswith(("sa_", "resnet")):
                    named.add(item)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for path in sorted((PROJECT_ROOT / "benchmarks" / "results").glob("*.json")):
        walk(json.loads(path.read_text()))
    cases = set(json.loads((PROJECT_ROOT / "benchmarks" / "results" / "vs_reference.json").read_text())["cases"])
    assert {"sa_content_plus_learned_bias", "sa_content_plus_learned_bias_small"} <= named & cases
    assert sorted((named | cases) - set(sa_conv.PRESETS)) == []
    shown = set(re.findall(r"`(\w+)`", performance_tables.vs_reference_summary()))
    assert "sa_content_plus_learned_bias" in shown and shown <= set(sa_conv.PRESETS)
