"""The README is the page a user reads first (at most 150 lines, linking a docs/ page per
topic); the pages are short enough to read in minutes (at most 15,000 words together, prose lines
of at most 120 characters, no line outside a table over 400); and every performance table in them
is what tools/performance_tables.py makes from the committed benchmark JSON."""

import re

import pytest

from tests.conftest import PROJECT_ROOT
from tools import benchmark_tables, performance_tables

README = PROJECT_ROOT / "README.md"
PAGES = [README, *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
README_LINES, WORDS, PROSE_CHARACTERS, LINE_CHARACTERS = 150, 15_000, 120, 400


def _page_id(path):
    return str(path.relative_to(PROJECT_ROOT))


def _prose(text):
    """``(line number, line)`` of the prose lines of a Markdown page: not a table row, not inside a
    ``` fence, not inside a generated table block (its markers included: its captions are held to
    `LINE_CHARACTERS` only), not a URL alone."""
    fenced = generated = False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if stripped.startswith("<!-- table:"):
            generated = True
        if not (fenced or generated or stripped.startswith("|") or re.fullmatch(r"<?https?://\S+>?", stripped)):
            yield number, line
        if stripped.startswith("<!-- end table:"):
            generated = False


def test_the_readme_is_at_most_150_lines():
    assert len(README.read_text().splitlines()) <= README_LINES


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_no_line_outside_a_table_is_over_400_characters(page):
    """Generated captions included: a caption is a sentence or two, the data is in the JSON."""
    long = [number for number, line in enumerate(page.read_text().splitlines(), 1)
            if not line.lstrip().startswith("|") and len(line) > LINE_CHARACTERS]
    assert not long, f"{_page_id(page)}: lines {long} are over {LINE_CHARACTERS} characters"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_prose_lines_are_at_most_120_characters(page):
    long = [number for number, line in _prose(page.read_text()) if len(line) > PROSE_CHARACTERS]
    assert not long, f"{_page_id(page)}: prose lines {long} are over {PROSE_CHARACTERS} characters"


def test_the_pages_are_at_most_15000_words():
    """As `wc -w README.md docs/*.md` counts them, generated tables included."""
    words = {_page_id(page): len(page.read_text().split()) for page in PAGES}
    assert sum(words.values()) <= WORDS, words


def test_the_readme_links_every_docs_page():
    text = README.read_text()
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
    row = next(line for line in performance_tables.BLOCK.search(readme).group("body").splitlines()
               if line.startswith("| `"))
    edited = readme.replace(row, row.replace(" | ", " | 9.99 | ", 1), 1)
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
    shown = set(re.findall(r"`(\w+)`", benchmark_tables.vs_reference_summary()))
    assert "sa_content_plus_learned_bias" in shown and shown <= set(sa_conv.PRESETS)


def test_bfloat16_training_table_pairs_each_case_with_its_float32_twin_by_preset_and_xla(tmp_path, monkeypatch):
    """Older reports named the XLA case after the preset alone: the twins are found by what ran."""
    import json

    def result(case, preset, xla, precision, speed):
        return {"case": case, "preset": preset, "xla": xla, "precision": precision,
                "train_images_per_second": speed, "train_fraction_of_matmul_peak": 0.25}

    for name, model, features, xla_case in (("throughput_bfloat16", "AMD EPYC", ["avx512f"], "sa_gated_small"),
                                            ("throughput_bfloat16_b", "Intel Xeon", ["amx_tile"],
                                             "sa_gated_small_xla")):
        no_xla = "sa_gated_small_no_xla" if xla_case == "sa_gated_small" else "sa_gated_small"
        report = {"date": "2026-12-06", "machine": {"cpu": {"model": model, "features": features},
                              "matmul_gflops": {"float32": 100.0, "bfloat16": 300.0}},
                  "results": [result(xla_case, "sa_gated_small", True, "float32", 10.0),
                              result(xla_case + "_bfloat16", "sa_gated_small", True, "mixed_bfloat16", 11.0),
                              result(no_xla, "sa_gated_small", False, "float32", 10.0),
                              result(no_xla + "_bfloat16", "sa_gated_small", False, "mixed_bfloat16", 14.0)]}
        (tmp_path / f"{name}.json").write_text(json.dumps(report))
    monkeypatch.setattr(benchmark_tables, "RESULTS", tmp_path)
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:4]]
            for line in benchmark_tables.training_bfloat16().splitlines() if line.startswith("| `")}
    assert rows == {"`sa_gated_small`": ["1.40x (0.25)"] * 2, "`sa_gated_small`, XLA": ["1.10x (0.25)"] * 2}
