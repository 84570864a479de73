"""benchmarks/against_commit.py: an earlier commit's packages imported next to this tree's, under
names of their own, and how a figure is summed up from its rounds. (Its timings are in
benchmarks/results, never here.)"""

import os
import shutil
import subprocess
import sys

import pytest

from benchmarks import against_commit
from benchmarks.harness import ROOT


def test_every_reference_to_the_packages_is_renamed_and_nothing_else():
    text = ("import sa_conv\nfrom sa_conv.serving import x\nfrom trainers import task\nimport export.export\n"
            "from export import export\n@register(package=\"sa_conv\")\nname = 'sa_conv>Block'\n"
            "sa_conv.models.build()\nmodel.export(path)\ndef export(model):\n# see sa_conv/serving.py and sa-conv\n"
            "my_sa_conv = 1\ntrainers_here = 2\n")
    assert against_commit.renamed(text, "abc1234").splitlines() == [
        "import sa_conv_abc1234", "from sa_conv_abc1234.serving import x", "from trainers_abc1234 import task",
        "import export_abc1234.export", "from export_abc1234 import export",
        "@register(package=\"sa_conv_abc1234\")", "name = 'sa_conv_abc1234>Block'", "sa_conv_abc1234.models.build()",
        "model.export(path)", "def export(model):", "# see sa_conv_abc1234/serving.py and sa-conv", "my_sa_conv = 1",
        "trainers_here = 2"]


def test_summary_takes_the_fastest_round_of_each_version_and_the_spread_of_the_pairs():
    got = against_commit.summary(100, before=[2.0, 1.0, 1.5], after=[1.0, 2.0, 1.25])
    assert got["before_images_per_second"] == 100.0 and got["after_images_per_second"] == 100.0
    assert got["after_over_before"] == 1.0
    assert got["round_ratios_range"] == [0.5, 2.0] and got["round_ratios_median"] == 1.2
    assert got["rounds"] == 3


@pytest.mark.skipif(shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")),
                    reason="needs the repository's history")
def test_the_earlier_commits_packages_load_none_of_this_trees(tmp_path):
    """The copy of HEAD imports only its own renamed modules: what it times is the earlier code."""
    suffix = against_commit.materialize("HEAD", str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [f"{p}_{suffix}" for p in ("export", "sa_conv", "trainers")]
    # A fresh interpreter, the copy first on its path: which modules its import brought in.
    probe = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import trainers_{suffix}.task, "
             f"export_{suffix}.export; print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
             f"('sa_conv', 'trainers', 'export', 'sa_conv_{suffix}', 'trainers_{suffix}', 'export_{suffix}')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(eval(out.stdout.strip().splitlines()[-1]))
    assert loaded == {f"sa_conv_{suffix}", f"trainers_{suffix}", f"export_{suffix}"}


def test_merging_refuses_a_report_of_another_change_or_cpu_class(tmp_path):
    import json

    from benchmarks import harness

    path = tmp_path / "r.json"
    assert against_commit.merge_mismatch(str(path), "aaa1111", "bbb2222", "Intel Xeon, AMX") is None  # no report yet
    path.write_text(json.dumps({"before": "aaa1111", "after": "bbb2222", "machine": {"cpu": harness.cpu()}}))
    ours = harness.cpu_class()
    assert against_commit.merge_mismatch(str(path), "aaa1111", "bbb2222", ours) is None
    for before, after, cpu, precision in (("ccc3333", "bbb2222", ours, "float32"),
                                          ("aaa1111", "ddd4444", ours, "float32"),
                                          ("aaa1111", "bbb2222", "another CPU class", "float32"),
                                          ("aaa1111", "bbb2222", ours, "mixed_bfloat16")):
        assert f"holds aaa1111 -> bbb2222 on {ours} in float32" in against_commit.merge_mismatch(
            str(path), before, after, cpu, precision)
