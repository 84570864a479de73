"""The reproduction study (`benchmarks.reproduction`): its plan on the study engine, what a run's snapshots are read
into, the committed report, the summary and claims over seeds, and the pages' tables and figures made from them."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from benchmarks import harness
from benchmarks import reproduction as rp
from tests.conftest import PROJECT_ROOT
from tools import benchmark_tables, performance_tables
from trainers import files, study
from trainers.config import make_config

TINY = dict(num_layers=1, global_batch_size=50, eval_batch_size=50, strategy="one_device")
LOCAL, DEEPER, MATCHES = ("localized heads emerge in the first layer", "deeper layers attend to larger regions",
                          "attention matches ResNet18's accuracy")


def test_runs_are_read_into_the_report_and_a_study_stopped_by_a_failure_resumes(tiny_cifar, tmp_path):
    """Two runs through the engine; reading the second fails and stops the study, as a kill would; started again, it
    reads that run without training it again, and the report holds both."""
    runs = [study.Run(run.key, {**run.flags, **TINY})
            for run in rp.study_runs(rp.plan(["learned", "quadratic"], [0], 2), tiny_cifar[0], snapshot_every=1)]
    report = study.Report(str(tmp_path / "reproduction.json"), derive=rp.derive, keep=rp.keep)
    logged, failing, directory = [], ["quadratic|seed=0|epochs=2"], str(tmp_path / "study")

    def read(model_dir, run):
        if run.key in failing:
            failing.clear()
            raise RuntimeError("killed while reading")
        return rp.read_run(model_dir, run, 4, prune_snapshots=run.key.startswith("learned"), log=logged.append)

    with pytest.raises(Exception, match="killed while reading"):
        study.run_study("reproduction", runs, read, report.record, directory, log=logged.append)
    assert list(report.read()["runs"]) == ["learned|seed=0|epochs=2"]
    assert study.status("reproduction", runs, directory) == {"learned|seed=0|epochs=2": "read",
                                                             "quadratic|seed=0|epochs=2": "trained, to read"}
    logged.clear()
    study.run_study("reproduction", runs, read, report.record, directory, log=logged.append)
    assert not any("training in" in line for line in logged)  # finished before the failure: read only
    written, trial = report.read(), os.path.join(directory, "reproduction", "trial_0000")
    run, quadratic = written["runs"]["learned|seed=0|epochs=2"], written["runs"]["quadratic|seed=0|epochs=2"]
    # Only what the study fixes (here with the tiny model's settings), no machine's data path.
    assert run["flags"] == {"model": "sa_learned_small", "dataset": "cifar10", "epochs": 2, "seed": 0,
                            "snapshot_every": 1, "mixed_precision": "float32", **TINY}
    assert run["precision"] == "float32" and [s["epoch"] for s in run["snapshots"]] == [0, 1, 2]
    with open(os.path.join(trial, "results.json")) as f, open(os.path.join(trial, rp.DETAIL)) as g:
        results, detail = json.load(f), json.load(g)
    # The last snapshot is the trained model, read as the trainer evaluated it.
    assert run["snapshots"][-1]["test_accuracy"] == pytest.approx(results["test_accuracy"], abs=1e-9)
    assert (run["best_epoch"], run["weights_sha256"]) == (results["best_epoch"], results["weights_sha256"])
    # The whole reading is in the run's directory; the report keeps each layer's summary of it.
    assert [len(s["layers"]) for s in detail["snapshots"]] == [1] * 3 and len(detail["snapshots"][-1]["layers"][0]) == 9
    last, heads = run["snapshots"][-1], detail["snapshots"][-1]["layers"][0]
    assert last["locality"][0]["mass_3x3"] == pytest.approx(np.mean([h["mass_3x3"] for h in heads]), abs=1e-5)
    assert last["locality"][0]["most_local_distance"] == min(h["mean_distance"] for h in heads)
    assert [s["heads"] for s in run["snapshots"]] == [
        [{k: [h[k] for h in layer] for k in rp.HEAD_METRICS} for layer in s["layers"]] for s in detail["snapshots"]]
    maps = np.array(last["maps"])
    assert maps.shape == (1, 9, 16, 16) and last["query"] == [8, 8]
    np.testing.assert_allclose(maps.sum((-1, -2)), 1.0, atol=256 * 0.5e-4)  # 4 decimals: each map within 256 roundings
    # Pruned: the snapshots but the first and last are gone, and the checkpoints.
    assert sorted(os.listdir(os.path.join(trial, "snapshots"))) == ["epoch_000.keras", "epoch_002.keras"]
    assert not os.path.exists(os.path.join(trial, "checkpoints"))
    assert all(h["epoch_seconds"] > h["train_seconds"] > 0 for h in detail["history"])
    assert run["median_epoch_seconds"] == pytest.approx(np.median([h["epoch_seconds"] for h in detail["history"]]),
                                                        abs=0.01)
    centers = [np.array(s["centers"]) for s in quadratic["snapshots"]]
    assert centers[-1].shape == (1, 9, 2) and not np.array_equal(centers[0], centers[-1])
    assert set(written["summary"]) == {"learned|epochs=2", "quadratic|epochs=2"} and written["budget"] == 2
    # Another seed's maps, and those of a model no page draws maps of, stay in its run's directory only.
    for key, seed, kept in (("learned|seed=0|epochs=2", 0, True), ("learned|seed=1|epochs=2", 1, False),
                            ("content|seed=0|epochs=2", 0, False), ("quadratic:small_data|seed=0|epochs=2", 0, False)):
        assert ("maps" in rp.keep({"key": key, "flags": {"seed": seed}, "snapshots": [last]})["snapshots"][-1]) == kept
    # Each model whose maps the report keeps has its figure.
    assert {f"docs/reproduction_maps_{model}.png" for model in rp.MAP_MODELS} == {
        name for name in performance_tables.PLOTS if "_maps_" in name}


def _committed():
    with open(PROJECT_ROOT / "benchmarks" / "results" / "reproduction.json") as f:
        return json.load(f)


def test_the_committed_report_kept_every_run_and_summary_number_when_it_moved_to_the_engine():
    """The report before the study ran on the engine (its last commit in the old form) and now: every run, seed,
    snapshot and head metric the same, and the summary made now by pandas equal number by number to the one the former
    code made; claims and budget too."""
    old = subprocess.run(["git", "show", "4348b98:benchmarks/results/reproduction.json"], cwd=PROJECT_ROOT,
                         capture_output=True, text=True)
    if old.returncode:
        pytest.skip("needs the repository's history (a clone, not an export)")
    old, new = json.loads(old.stdout), _committed()
    assert len(new["runs"]) == 37 and new["runs"] == {  # but the maps the report no longer keeps, and the precision
        key: rp.keep({**{k: v for k, v in run.items() if k != "session_seconds"}, "precision": "float32", "key": key,
                      "flags": {**run["flags"], "mixed_precision": "float32"}})
        for key, run in old["runs"].items()}
    derived = ("summary", "budget", "claims")  # as the engine's report derives them, number by number
    assert rp.derive(new["runs"]) == {k: new[k] for k in derived} == {k: old[k] for k in derived}
    assert old["budget"] == rp.BUDGET


def test_the_default_plan_is_the_study_and_makes_every_recorded_run_as_it_was_made():
    plan = rp.plan()
    assert len(set(plan)) == len(plan) and plan[:3] == [("learned", seed, rp.FIRST_BUDGET) for seed in (0, 1, 2)]
    assert rp.BUDGET == 2 * rp.FIRST_BUDGET and {(model, seed) for model, seed, epochs in plan if epochs == rp.BUDGET} \
        == {(model, seed) for model in (*rp.MODELS, "learned+convolutional@0.1")
            for seed in ((0, 1) if model in ("content", "gated") else (0, 1, 2))}
    recorded, made = _committed()["runs"], {run.key: run.flags for run in rp.study_runs(plan, "/data")}
    assert set(recorded) == set(made)
    for key, run in recorded.items():
        make_config(overrides=made[key])  # every run's settings are the trainer's
        assert run["flags"] == {k: v for k, v in made[key].items() if k != "data_dir"}, key
        model, seed, _ = rp.split_key(key)
        assert ("maps" in run["snapshots"][-1]) == (model in rp.MAP_MODELS and seed == rp.MAP_SEED), key
    assert rp.plan(epochs=30) == [(model, seed, 30) for model in rp.MODELS for seed in (0, 1, 2)]
    # The encoding's full name finds the study's runs of the short one: it does not start another.
    assert rp.plan(["content_plus_learned_bias", "learned+convolutional@0.10"], [1]) == [
        ("content", 1, rp.BUDGET), ("learned+convolutional@0.1", 1, rp.BUDGET)]
    # At most `SNAPSHOTS` snapshots a run besides the initialization; every epoch's in a shorter run.
    assert [rp.study_runs([("learned", 0, e)], "/d")[0].flags["snapshot_every"] for e in (4, 12, 13, 50, 60, 240)] \
        == [1, 1, 2, 5, 5, 20]
    with pytest.raises(ValueError, match="Unknown initialization 'convlutional'.*random, convolutional"):
        rp.plan(["learned+convlutional"], [0], 2)
    # The precision is in the flags, not the keys: a run keeps the study's whatever the trainer's default.
    [bf16] = rp.study_runs([("resnet20:small_data", 1, 240)], "/d", precision="auto")
    assert bf16.key == "resnet20:small_data|seed=1|epochs=240"
    assert make_config(overrides=bf16.flags).mixed_precision == "auto" and bf16.flags["recipe"] == "small_data"
    assert rp.study_runs([("learned", 0, 2)], "/d")[0].flags["mixed_precision"] == "float32"


@pytest.mark.parametrize("flags, error", [
    (["--snapshot_every=3"], "--snapshot_every needs --epochs"),
    (["--seeds=1,x"], "--seeds takes comma-separated integers, got '1,x'"),
    (["--models=", "--dry_run"], "The plan has no run"),
    (["--models=quadratik", "--dry_run"], "--models: Unknown variant 'quadratik'"),
    (["--epochs=0"], "--epochs must be positive, got 0"),
])
def test_flags_that_make_no_sense_stop_before_anything_runs(flags, error, tmp_path):
    proc = harness.run_module("benchmarks.reproduction", [f"--directory={tmp_path}", *flags])
    assert proc.returncode == 2 and error in proc.stderr and not os.listdir(tmp_path)


def test_a_dry_run_counts_the_runs_read_without_snapshots_as_recorded(tiny_cifar, tmp_path):
    # A report's runs read before it kept snapshots are recorded, not planned again; the other seed is.
    report = tmp_path / "report.json"
    files.write_json(str(report), {"runs": {}, "runs_without_snapshots": {"quadratic|seed=0|epochs=2": {
        "test_accuracy": 0.5, "precision": "float32"}}})
    proc = harness.run_module("benchmarks.reproduction", [
        "--models=quadratic", "--seeds=0,1", "--epochs=2", "--dry_run", f"--output={report}",
        f"--directory={tmp_path / 'runs'}", f"--data_dir={tiny_cifar[0]}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-2:] == ["quadratic|seed=0|epochs=2: recorded",
                                             "quadratic|seed=1|epochs=2: to train"]


def _run(accuracies, distances=None, masses=None, **fields):
    """A run as the report keeps it (`compact_run`) with ``fields``: test accuracy ``accuracies[e]`` at snapshot epoch
    ``e`` and, for attention models, a layer per ``distances[e]`` entry of two heads, at ``d`` and ``d + 0.1``."""
    def layers(epoch):
        return [[{"head": h, "mean_distance": d + 0.1 * h, "mass_3x3": m, "entropy": 3.0, "peak_offset": [0.0, 0.0]}
                 for h in range(2)] for d, m in zip(distances[epoch], masses[epoch])]

    snapshots = [{"epoch": e, "test_accuracy": a, **({} if distances is None else {"layers": layers(e)})}
                 for e, a in sorted(accuracies.items())]
    final, last = accuracies[max(accuracies)], max(accuracies)
    whole = {"test_accuracy": final, "train_seconds": 10.0, "snapshots": snapshots,
             "history": [{"epoch": e, "train_accuracy": final} for e in range(1, last + 1)]}
    return {**rp.compact_run(whole), **fields}


def test_a_run_is_timed_on_the_cpu_class_most_of_its_epochs_ran_on():
    # Epochs 1-2 recorded before the trainer named its class (the reading session's, "cpu A"; epoch 2 before it timed
    # whole epochs: its steps), then three on "cpu B" after the run resumed on another machine, slowed there.
    history = [{"epoch": 1, "epoch_seconds": 10.0}, {"epoch": 2, "train_seconds": 12.0},
               *({"epoch": e, "epoch_seconds": s, "cpu": "cpu B"} for e, s in ((3, 30.0), (4, 31.0), (5, 90.0)))]
    assert rp.run_timing(history, "cpu A") == {"median_epoch_seconds": 31.0, "cpu": "cpu B",
                                               "cpu_epochs": {"cpu A": 2, "cpu B": 3}}
    assert rp.run_timing(history, "cpu B") == {"median_epoch_seconds": 30.0, "cpu": "cpu B"}  # read there: all five
    assert rp.run_timing(history[:2], "cpu A")["median_epoch_seconds"] == 11.0  # epoch 2's steps
    # A tie: the class of the last epoch, whichever came first.
    tie = [{"epoch": 1, "epoch_seconds": 10.0, "cpu": "cpu B"}, {"epoch": 2, "epoch_seconds": 20.0, "cpu": "cpu A"}]
    assert rp.run_timing(tie, "cpu C")["cpu"] == "cpu A" and rp.run_timing(tie[::-1], "cpu C")["cpu"] == "cpu B"


def test_summary_spreads_curves_flattening_and_the_claims():
    runs = {}
    for seed, shift in enumerate((-0.02, 0.0, 0.02)):
        # Layer 0 grows local (distance 6 -> 2, mass 0.1 -> 0.5); layer 1 stays wide.
        runs[f"learned|seed={seed}|epochs=8"] = _run(
            {0: 0.1, 4: 0.5 + shift, 6: 0.6 + shift, 8: 0.605 + shift},
            {0: [6.0 + shift, 6.0], 4: [3.0, 5.0], 6: [2.0 + shift, 5.5], 8: [2.0 + shift, 5.5]},
            {0: [0.1, 0.1], 4: [0.3, 0.1], 6: [0.5, 0.1], 8: [0.5 + shift, 0.1]})
        runs[f"resnet18|seed={seed}|epochs=8"] = _run({0: 0.1, 6: 0.6 + 2 * shift, 8: 0.62 + 2 * shift})
        # Still climbing by 0.2 in its last quarter: not flattened.
        runs[f"quadratic|seed={seed}|epochs=8"] = _run(
            {0: 0.1, 6: 0.2 + shift, 8: 0.4 + shift},
            {0: [2.0, 2.0], 6: [4.0, 3.0], 8: [6.0 + shift, 3.0]}, {0: [0.5, 0.5], 6: [0.3, 0.3], 8: [0.1, 0.3]})
    runs["learned+convolutional@0.1|seed=0|epochs=8"] = runs["learned|seed=0|epochs=8"]  # no claim: not a study model
    summary = rp.summarize(runs)
    learned, layer0_end = summary["learned|epochs=8"], summary["learned|epochs=8"]["locality"]["8"][0]
    assert learned["seeds"] == [0, 1, 2] and learned["quarter_epoch"] == 6 and learned["flattened"] is True
    assert (learned["test_accuracy"]["mean"], learned["test_accuracy"]["std"], learned["curve"]["4"]["mean"],
            learned["last_quarter_change"]["mean"]) == pytest.approx((0.605, 0.02, 0.5, 0.005))
    assert summary["quadratic|epochs=8"]["flattened"] is False and "locality" not in summary["resnet18|epochs=8"]
    # Per layer, the heads' mean (heads at d and d + 0.1) and the most local head.
    assert (layer0_end["mean_distance"]["mean"], layer0_end["most_local_distance"]["mean"]) == pytest.approx((2.05, 2))
    assert {(row["claim"], row["model"]): row["verdict"] for row in rp.claims(summary, 8)} == {
        (LOCAL, "learned"): "held", (DEEPER, "learned"): "held", (LOCAL, "quadratic"): "not here",
        (DEEPER, "quadratic"): "not here", (MATCHES, "learned"): "held",  # 0.605 against 0.62, std 0.04
        (MATCHES, "quadratic"): "not here"}
    assert rp.claims(summary, 60) == []  # nothing measured at that budget
    # One seed: no spread, no flattening verdict; moved the right way but not beyond a spread: partly; one layer has no
    # depth to compare.
    one = rp.summarize({"learned|seed=0|epochs=4": _run({0: 0.1, 3: 0.3, 4: 0.31}, {0: [5.0], 3: [4.0], 4: [3.0]},
                                                        {0: [0.1], 3: [0.2], 4: [0.3]})})
    assert one["learned|epochs=4"]["test_accuracy"]["std"] is None and one["learned|epochs=4"]["flattened"] is None
    assert [(row["claim"], row["verdict"]) for row in rp.claims(one, 4)] == [(LOCAL, "partly")]
    # Snapshots too sparse to have a last quarter: no flattening verdict.
    sparse = rp.summarize({f"learned|seed={s}|epochs=8": _run({0: 0.1, 8: 0.5 + s / 100}) for s in range(2)})
    assert sparse["learned|epochs=8"]["quarter_epoch"] is None and sparse["learned|epochs=8"]["flattened"] is None


@pytest.fixture
def pages(monkeypatch, tmp_path):
    """``pages(runs, **fields)`` writes the reproduction report (its summary and budget made from ``runs``) that
    ``performance_tables`` reads, beside an empty data-efficiency one."""
    monkeypatch.setattr(benchmark_tables, "RESULTS", tmp_path)
    files.write_json(str(tmp_path / "data_efficiency.json"), {"summary": {}, "training_images": {}})
    return lambda runs, **fields: files.write_json(str(tmp_path / "reproduction.json"), {
        "runs": runs, "summary": rp.summarize(runs), "budget": rp.main_budget(runs),
        "data": {"training_images": 100, "test_images": 50}, **fields})


def _cells(table):
    """The body rows of a generated Markdown table, each a list of its cells as written."""
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("|")][2:]


def test_seeds_that_agree_exactly_have_no_flattening_verdict(pages):
    # A spread of 0 measures no change against: the last quarter's +0.015 is neither within it nor beyond the seeds'
    # noise, which two seeds that happen to agree do not show.
    runs = {f"learned|seed={seed}|epochs=4": _run({0: 0.1, 3: 0.29 + seed / 100, 4: 0.31}) for seed in (0, 1)}
    entry = rp.summarize(runs)["learned|epochs=4"]
    assert entry["test_accuracy"]["std"] == 0 and entry["last_quarter_change"]["mean"] == pytest.approx(0.015)
    assert entry["flattened"] is None
    pages(runs)
    assert ["`sa_learned_small`", "4", "2", "0.310 ± 0.000", "-", "+0.015 (3-4)", "-"] in \
        _cells(performance_tables.reproduction_budgets())
    # Nor does doubling the budget, both budgets' seeds agreeing: +0.04 is neither within nor beyond.
    runs.update({f"learned|seed={seed}|epochs=8": _run({0: 0.1, 6: 0.35, 8: 0.35}) for seed in (0, 1)})
    assert rp.summarize(runs)["learned|epochs=8"]["against_shorter"] == {"epochs": 4, "change": 0.04,
                                                                         "within_spread": None}


def test_each_budget_is_compared_with_the_next_shorter_one_within_the_seeds_spread():
    runs = {"learned|seed=0|epochs=32": _run({0: 0.1, 32: 0.5}),  # one seed: the std is 16's
            "quadratic|seed=0|epochs=16": _run({0: 0.1, 16: 0.45}),  # +0.05 against a std of 0.01
            "quadratic|seed=0|epochs=32": _run({0: 0.1, 32: 0.452})}  # one seed each: no spread
    for seed, shift in enumerate((-0.01, 0.0, 0.01)):  # learned at 16: +0.015, beyond 8's std (0.01), within 16's
        runs.update({f"learned|seed={seed}|epochs=8": _run({0: 0.1, 8: 0.5 + shift}),
                     f"learned|seed={seed}|epochs=16": _run({0: 0.1, 16: 0.515 + 2 * shift}),
                     f"quadratic|seed={seed}|epochs=8": _run({0: 0.1, 8: 0.4 + shift})})
    against = {key: entry["against_shorter"] for key, entry in rp.summarize(runs).items()}
    assert against["learned|epochs=8"] is None and against["quadratic|epochs=8"] is None
    # Budgets in numeric order: 16 follows 8, though "16" sorts before "8" as text.
    assert against["learned|epochs=16"] == {"epochs": 8, "change": pytest.approx(0.015), "within_spread": True}
    assert against["learned|epochs=32"]["epochs"] == 16 and against["learned|epochs=32"]["within_spread"] is True
    assert against["quadratic|epochs=16"] == {"epochs": 8, "change": pytest.approx(0.05), "within_spread": False}
    assert against["quadratic|epochs=32"]["within_spread"] is None


def test_the_budget_is_the_longest_where_most_models_ran_and_gated_is_not_asked_to_grow_local():
    runs = {f"learned|seed={s}|epochs=60": None for s in range(3)}
    runs.update({"learned|seed=0|epochs=30": None, "resnet18|seed=0|epochs=30": None})
    assert rp.main_budget(runs) == 30 and rp.main_budget({}) is None  # two models at 30, one at 60
    assert rp.main_budget({"gated|seed=0|epochs=30": None, "gated|seed=0|epochs=60": None}) == 60  # a tie: the longer
    # Runs landing out of the plan's order: three seeds of two models at the longer budget outnumber the shorter
    # budget's runs, but a model that has not run there keeps the tables at the shorter.
    runs = {f"{m}|seed=0|epochs=120": None for m in ("learned", "quadratic", "content")}
    runs.update({f"{m}|seed={s}|epochs=240": None for m in ("learned", "quadratic") for s in range(3)})
    assert rp.main_budget(runs) == 120
    assert rp.main_budget({**runs, "content|seed=0|epochs=240": None}) == 240
    # One seed of each model at a longer budget ties on models; the budget of more runs stays.
    assert rp.main_budget({**runs, "content|seed=0|epochs=240": None, **{
        f"{m}|seed=0|epochs=480": None for m in ("learned", "quadratic", "content")}}) == 240
    assert rp.starts_at_random("learned") and rp.starts_at_random("content") and not rp.starts_at_random("gated")
    summary = rp.summarize({"gated|seed=0|epochs=4": _run({0: 0.1, 2: 0.2, 4: 0.3}, {
        0: [1.0, 2.0], 2: [2.0, 3.0], 4: [3.0, 4.0]}, {0: [0.9, 0.5], 2: [0.5, 0.4], 4: [0.3, 0.3]})})
    assert [row["claim"] for row in rp.claims(summary, 4)] == [DEEPER]


def _report_runs():
    """Learned, quadratic and ResNet18 at 8 epochs (the budget, three seeds each, seeds 0 and 1 on one CPU class and
    seed 1 the least disturbed, seed 2 on another), learned at 4 (one seed), a comparison variant at 8."""
    runs = {}
    for seed, (shift, seconds) in enumerate(((0.0, 30.0), (0.01, 20.0), (0.02, 40.0))):
        for model, base in (("learned", 0.5), ("quadratic", 0.48), ("resnet18", 0.6),
                            ("quadratic+convolutional@0.1/2", 0.45)):
            run = runs[rp.run_key(model, seed, 8)] = _run(
                {0: 0.1, 6: base + shift, 8: base + shift},
                *(({e: [6.0 - e / 2, 6.0] for e in (0, 6, 8)}, {e: [0.1 + e / 20, 0.2] for e in (0, 6, 8)})
                  if model != "resnet18" else ()),
                median_epoch_seconds=seconds, cpu="cpu B" if seed == 2 else "cpu A",
                parameters={"resnet18": 11_000_000, "quadratic": 175_000}.get(model, 190_000),
                **({} if model == "resnet18" else {"locality_images": 32}),
                flags={"model": rp.data_efficiency.parse_variant(model)["model"], "dataset": "cifar10",
                       "epochs": 8, "seed": seed, "snapshot_every": 2})
            if model == "quadratic":  # two layers of two heads, moving from (e, -e) to (e / 2, -e)
                for snapshot in run["snapshots"]:
                    snapshot["centers"] = [[[e / (2 if snapshot["epoch"] else 1), -e] for e in (1.0, 2.0)]] * 2
    return {**runs, "learned|seed=0|epochs=4": _run({0: 0.1, 3: 0.3, 4: 0.31}, {e: [5.0, 6.0] for e in (0, 3, 4)}, {
        e: [0.2, 0.1] for e in (0, 3, 4)}, median_epoch_seconds=25.0, cpu="cpu B")}


def test_the_gates_table_reads_each_layers_gates_at_the_start_and_the_end(pages, monkeypatch):
    runs = _report_runs()
    ends = ([[0.9, 0.4, 0.8], [0.2, 0.3, 0.7]], [[0.9, 0.6, 0.6], [0.4, 0.5, 0.6]])  # per seed, layer, head
    for seed, end in enumerate(ends):
        run = runs[rp.run_key("gated", seed, 8)] = _run({0: 0.1, 6: 0.5, 8: 0.5}, {e: [2.0, 3.0] for e in (0, 6, 8)},
                                                        {e: [0.5, 0.4] for e in (0, 6, 8)})
        for snapshot, gates in zip(run["snapshots"], ([[0.73] * 3] * 2, [[0.1] * 3] * 2, end)):
            snapshot["gates"] = gates  # the middle snapshot's are read by no column
    pages(runs)
    monkeypatch.setattr(rp, "BUDGET", 8)
    table = performance_tables.reproduction_gates()
    assert "content heads: gates below 0.5 at the end, per seed" in table
    # Layer 1 of seed 1 has a head at exactly 0.5: not turned to content.
    assert _cells(table) == [["`sa_gated_small`", "0", "0.73 ± 0.00 → 0.70 ± 0.00", "0.50 ± 0.14", "1, 0", "2"],
                             ["`sa_gated_small`", "1", "0.73 ± 0.00 → 0.45 ± 0.07", "0.30 ± 0.14", "2, 1", "2"]]
    assert rp.gate_summary([runs["learned|seed=0|epochs=8"]]) is None
    # A run whose first snapshot has no gates is left out, with the seeds column; a layer some run has no gates in
    # (not gated) is not a row.
    gated = [runs[rp.run_key("gated", seed, 8)] for seed in (0, 1)]
    partial = {**gated[1], "snapshots": [{k: v for k, v in gated[1]["snapshots"][0].items() if k != "gates"},
                                         *gated[1]["snapshots"][1:]]}
    ungated = {**gated[1], "snapshots": [*gated[1]["snapshots"][:-1], {**gated[1]["snapshots"][-1],
                                                                       "gates": [ends[1][0], None]}]}
    assert [(g["layer"], g["seeds"], g["heads"], g["content_heads"]) for g in rp.gate_summary([gated[0], partial])] \
        == [(0, 1, 3, [1]), (1, 1, 3, [2])]
    assert [(g["layer"], g["content_heads"]) for g in rp.gate_summary([gated[0], ungated])] == [(0, [1, 0])]


def test_the_pages_figures_are_drawn_from_every_budget(pages, monkeypatch, tmp_path):
    axes = pytest.importorskip("matplotlib.axes")
    drawn, traced, titles, baselines, ylabels = [], [], [], [], []  # traced: (label, y values) of every line

    def recording(seen, real):
        return lambda axis, value, **kw: seen.append(value) or real(axis, value, **kw)

    for method, seen in (("set_title", titles), ("axhline", baselines), ("set_ylabel", ylabels)):
        monkeypatch.setattr(axes.Axes, method, recording(seen, getattr(axes.Axes, method)))
    real_plot = axes.Axes.plot

    def plot(axis, *args, **kwargs):
        drawn.append(kwargs.get("label"))
        traced.append((kwargs.get("label"), [float(y) for y in np.atleast_1d(args[1])] if len(args) > 1 else None))
        return real_plot(axis, *args, **kwargs)

    monkeypatch.setattr(axes.Axes, "plot", plot)
    runs = _report_runs()
    pages(runs)
    performance_tables.plot_reproduction_curves(tmp_path / "curves.png")
    assert [label for label in drawn if label] == ["sa_learned_small (3 seeds)", "sa_learned_small, 4 epochs (1 seed)",
                                                    "sa_quadratic_small (3 seeds)", "resnet18 (3 seeds)"]
    assert (tmp_path / "curves.png").stat().st_size > 0
    # Locality against training time: a panel per attention model, titled with its seeds.
    pages({**runs, "gated|seed=0|epochs=8": _run({0: 0.1, 6: 0.5, 8: 0.5}, {e: [3.0, 4.0] for e in (0, 6, 8)},
                                                 {e: [0.5, 0.4] for e in (0, 6, 8)})}, budget=8)
    for seen in (traced, titles, baselines, ylabels):
        seen.clear()
    performance_tables.plot_reproduction_locality(tmp_path / "locality.png")
    assert titles == ["sa_learned_small (3 seeds)", "sa_quadratic_small (3 seeds)", "sa_gated_small (1 seed)"]
    # A row per metric, in the order of its label: the learned model's first layer (heads at d and d + 0.1) falls from
    # 6.05 to 2.05 grid pixels, its mass rises from 0.1 to 0.5, its entropy stays 3.
    assert [label.split("\n")[0] for label in ylabels if label] == ["mean attention distance", "mass in the 3x3",
                                                                     "entropy (nats)"]
    learned_layer_0 = [ys for label, ys in traced if label == "layer 0"][::3]
    assert learned_layer_0 == [pytest.approx([6.05, 3.05, 2.05]), pytest.approx([0.1, 0.4, 0.5]), [3.0] * 3]
    # The distance and entropy panels show uniform attention's value on the 16x16 grid from its central 8x8 queries:
    # the mean over those 64 queries of the mean distance to all 256 keys, and the entropy of 256 equal probabilities
    # (the mass row has none: no peak).
    rows, cols = np.mgrid[0:16, 0:16]
    expected = np.mean([np.hypot(rows - r, cols - c).mean() for r in range(4, 12) for c in range(4, 12)])
    assert baselines == [pytest.approx(expected, abs=1e-9)] * 3 + [pytest.approx(np.log(256), abs=1e-6)] * 3 \
        and 6.6 < expected < 6.7
    # Per layer and head: the track, its start and its end (seed 0's centers, as the snapshots hold them). A head whose
    # attention ends uniform (in the run's maps: layer 0's head 1, 1/16 on each key of a 4x4 grid) ends in a cross
    # named as such: its center says nothing; a wide one (0.2 at its peak, 3.2 times uniform's) is drawn as any other.
    quadratic = runs["quadratic|seed=0|epochs=8"]["snapshots"][-1]
    peaked, wide, flat = np.full((4, 4), 0.02), np.full((4, 4), 0.8 / 15), np.full((4, 4), 1 / 16)
    peaked[1, 2], wide[0, 0] = 0.7, 0.2
    for maps, labels in ((None, ["head 0", "head 1"] * 2),
                         ([[peaked, flat], [wide, peaked]], ["head 0", "head 1: near-uniform", "head 0", "head 1"])):
        if maps is not None:
            quadratic["maps"] = np.array(maps).tolist()
        pages(runs)
        drawn.clear()
        performance_tables.plot_reproduction_centers(tmp_path / "centers.png")
        assert [label for label in drawn if label] == labels
    # Maps that are not the centers' heads cannot say which head is which.
    quadratic["maps"] = [[peaked.tolist(), flat.tolist()]]
    pages(runs)
    with pytest.raises(ValueError, match=r"maps \(layers, heads\) \(1, 2\) do not match its centers' \(2, 2\)"):
        performance_tables.plot_reproduction_centers(tmp_path / "centers.png")
    pages({k: v for k, v in runs.items() if not k.startswith("quadratic|")})
    performance_tables.plot_reproduction_centers(tmp_path / "none.png")  # no quadratic run: nothing drawn
    assert not (tmp_path / "none.png").exists()


def test_the_pages_tables_read_every_budget_and_comparison_variant(pages):
    runs = _report_runs()
    pages(runs)
    # Minutes a run per CPU class: its least disturbed seed's median epoch (20 s on cpu A, not seed 0's 30 s; 40 s on
    # cpu B) times the epochs.
    assert _cells(performance_tables.reproduction_accuracy())[0] == [
        "`sa_learned_small`", "190,000", "3", "0.510 ± 0.010", "0.500-0.520", "+0.000 (6-8)", "yes",
        "3 (cpu A); 5 (cpu B)"]
    assert _cells(performance_tables.models())[2] == ["`resnet18`", "11,000,000", "0.610 ± 0.010", "3",
                                                      "3 (cpu A); 5 (cpu B)"]
    budgets = _cells(performance_tables.reproduction_budgets())
    # The study's models first in its order, each budget ascending; comparison variants last.
    assert [row[:3] for row in budgets] == [["`sa_learned_small`", "4", "1"], ["`sa_learned_small`", "8", "3"],
                                            ["`sa_quadratic_small`", "8", "3"], ["`resnet18`", "8", "3"],
                                            ["`sa_quadratic_small+convolutional@0.1/2`", "8", "3"]]
    assert budgets[0][3:] == ["0.310", "-", "+0.010 (3-4)", "- (one seed)"]
    assert budgets[1][3:5] == ["0.510 ± 0.010", "+0.200 from 4, beyond the spread"]
    # The locality caption's baselines: uniform attention on the small presets' 16x16 grid (checked against a direct
    # computation in the figures' test), not recorded numbers.
    assert "uniform attention: distance 6.68, entropy 5.55" in performance_tables.reproduction_locality()
    assert ["convolutional >= random", "cifar10-mini:100, 8", "`quadratic+convolutional@0.1/2` 0.460 (3)",
            "`quadratic` 0.490 (3)", "-0.030", "no", "0.010"] in _cells(performance_tables.efficiency_targets())
    # A second seed at 4 (0.71: a std of 0.28) puts 8's change within the spread; ResNet18 at 16 and 32, one seed
    # each, has none.
    pages({**runs, "learned|seed=1|epochs=4": _run({0: 0.1, 3: 0.7, 4: 0.71}),
           "resnet18|seed=0|epochs=16": _run({0: 0.1, 12: 0.6, 16: 0.6}),
           "resnet18|seed=0|epochs=32": _run({0: 0.1, 24: 0.6, 32: 0.61})}, budget=8)
    budgets = {tuple(row[:2]): row for row in _cells(performance_tables.reproduction_budgets())}
    assert budgets["`sa_learned_small`", "8"][4] == "+0.000 from 4, within the spread"
    assert budgets["`resnet18`", "32"][4] == "+0.010 from 16"


def test_gated_against_content_at_each_budget_both_ran(pages):
    """A row per budget where both ran (not 2 epochs: content only); gated ahead from the first snapshot after its last
    one behind or level (level at epoch 4: not ahead), or not at the end."""
    pages({"gated|seed=0|epochs=8": _run({0: 0.1, 2: 0.2, 4: 0.35, 6: 0.4, 8: 0.45}),
           "gated|seed=1|epochs=8": _run({0: 0.1, 2: 0.22, 4: 0.33, 6: 0.42, 8: 0.47}),
           "content|seed=0|epochs=8": _run({0: 0.1, 2: 0.25, 4: 0.34, 6: 0.38, 8: 0.4}),
           "gated|seed=0|epochs=4": _run({0: 0.1, 2: 0.3, 4: 0.3}), "content|seed=0|epochs=4": _run(
               {0: 0.1, 2: 0.2, 4: 0.32}), "content|seed=0|epochs=2": _run({0: 0.1, 2: 0.2})})
    assert _cells(performance_tables.reproduction_gated_against_content()) == [
        ["4", "0.300 (1)", "0.320 (1)", "-0.020", "not at the end"],
        ["8", "0.460 ± 0.014 (2)", "0.400 (1)", "+0.060", "from epoch 6"]]
    # Ahead at every snapshot but initialization; no snapshot shared but initialization: no verdict.
    pages({"gated|seed=0|epochs=4": _run({0: 0.1, 2: 0.3, 4: 0.4}), "content|seed=0|epochs=4": _run(
        {0: 0.2, 2: 0.2, 4: 0.2}), "gated|seed=0|epochs=6": _run({0: 0.1, 3: 0.3}),
           "content|seed=0|epochs=6": _run({0: 0.1, 4: 0.2})})
    assert [row[-1] for row in _cells(performance_tables.reproduction_gated_against_content())] == ["throughout", "-"]


def test_a_last_layer_farther_than_uniform_attention_is_said_to_attend_to_far_pixels(pages):
    # Two layers: the last ends at 7.05 grid pixels on the 16x16 grid, beyond uniform attention's 6.68 (the first at
    # 4.05-4.15 and the quadratic model's last at 6.05 stay below it).
    runs = {}
    for seed in (0, 1):
        runs[rp.run_key("learned", seed, 8)] = _run({0: 0.1, 6: 0.5, 8: 0.5 + seed / 100},
                                                    {0: [6.0, 6.0], 6: [5.0, 6.0], 8: [4.0 + seed / 10, 7.0]},
                                                    {e: [0.1, 0.1] for e in (0, 6, 8)})
        runs[rp.run_key("quadratic", seed, 8)] = _run({0: 0.1, 6: 0.5, 8: 0.5 + seed / 100},
                                                      {0: [3.0, 3.0], 6: [3.0, 5.0], 8: [2.0 + seed / 10, 6.0]},
                                                      {e: [0.5, 0.5] for e in (0, 6, 8)})
    pages(runs)
    cells = _cells(performance_tables.reproduction_claims())
    rows = {tuple(row[:2]): row for row in cells}
    assert rows[DEEPER, "`sa_learned_small`"][2:] == [
        "distance, first layer 4.10 ± 0.07, last 7.05 ± 0.00 (beyond uniform attention's: far pixels)", "2", "**held**"]
    assert rows[DEEPER, "`sa_quadratic_small`"][2].endswith("last 6.05 ± 0.00")
    # Theorem 1 comes first, from the tests that check it, not from the runs.
    assert cells[0][:2] == [
        "a self-attention layer of K² heads can express any KxK convolution (Theorem 1)", "`sa_conv.conversion`"]


def test_the_little_data_page_compares_recipes_and_the_equal_size_claim_joins_the_claims(pages, tmp_path, monkeypatch):
    """The little-data report (recipe variants and ResNet-20 at 8 epochs) beside the reproduction report's paper-recipe
    runs: one table best first, the heads' locality paper → small_data, a curve per preset and recipe, and the claim
    at equal size on the reproduction page."""
    # The reproduction report's own budget is another (4); its runs at the little study's (8) are the ones compared.
    # Its ResNet-20 run under the paper's recipe is left out: the little study ran that preset and recipe too.
    paper = {**_report_runs(), "resnet20|seed=0|epochs=8": _run({0: 0.1, 8: 0.3}, parameters=272_000)}
    pages(paper, budget=4)
    little = {}
    for seed, shift in enumerate((0.0, 0.02, 0.04)):
        little[rp.run_key("quadratic:small_data", seed, 8)] = _run(
            {0: 0.1, 6: 0.55 + shift, 8: 0.6 + shift}, {e: [4.0 - e / 4, 6.5] for e in (0, 6, 8)},
            {e: [0.2 + e / 40, 0.1] for e in (0, 6, 8)}, parameters=175_000, cpu="cpu A", median_epoch_seconds=30.0)
        little[rp.run_key("resnet20:small_data", seed, 8)] = _run({0: 0.1, 6: 0.6, 8: 0.64 + shift},
                                                                   parameters=272_000, cpu="cpu A")
        little[rp.run_key("resnet20", seed, 8)] = _run({0: 0.1, 6: 0.5, 8: 0.55 + shift}, parameters=272_000)
    files.write_json(str(tmp_path / "little_data.json"), {
        "runs": little, "summary": rp.summarize(little), "budget": rp.main_budget(little),
        "data": {"training_images": 100, "test_images": 50}})
    assert rp.main_budget(little) == 8
    # Best first; the paper recipe's runs of the same preset and ResNet18 from the other report; not the learned one.
    assert [row[:5] for row in _cells(performance_tables.little_data())] == [
        ["`resnet20`", "small_data", "272,000", "0.660 ± 0.020", "3"],
        ["`sa_quadratic_small`", "small_data", "175,000", "0.620 ± 0.020", "3"],
        ["`resnet18`", "paper", "11,000,000", "0.610 ± 0.010", "3"],
        ["`resnet20`", "paper", "272,000", "0.570 ± 0.020", "3"],
        ["`sa_quadratic_small`", "paper", "175,000", "0.490 ± 0.010", "3"]]
    # Layer 0 of the quadratic model ends at 2.05 grid pixels under both recipes (heads at 2 and 2.1), its mass at
    # 0.1 + 8/20 under the paper's and 0.2 + 8/40 here.
    cells = _cells(performance_tables.little_data_locality())
    assert cells[0] == ["`sa_quadratic_small`", "0", "2.05 ± 0.00 → 2.05 ± 0.00", "0.50 ± 0.00 → 0.40 ± 0.00",
                        cells[0][4]] and [row[1] for row in cells] == ["0", "1"]
    # 0.62 ± 0.02 against ResNet-20's 0.66 ± 0.02 under the same recipe: beyond one std, within two.
    claims = {tuple(row[:2]): row for row in _cells(performance_tables.reproduction_claims())}
    assert claims["attention matches a ResNet of its size", "`sa_quadratic_small` (`small_data`)"][2:] == [
        "0.620 ± 0.020 (3) against `resnet20`'s 0.660 ± 0.020 (3)", "3", "**partly**"]
    assert [r["verdict"] for r in rp.claims(rp.summarize(little), 8) if "convolution" in r] == ["partly"]
    # The README's table at the little study's budget: the little study's paper-recipe ResNet-20 last, where the
    # reproduction report has none; where it has one, only its own.
    pages({k: v for k, v in paper.items() if not k.startswith("resnet20|")})
    assert _cells(performance_tables.models())[-1][:4] == ["`resnet20`", "272,000", "0.570 ± 0.020", "3"]
    assert "paper's recipe (`resnet20`: the little-data study's);" in performance_tables.models()
    pages(paper)
    assert [row[:4] for row in _cells(performance_tables.models()) if row[0] == "`resnet20`"] == [
        ["`resnet20`", "272,000", "0.300", "1"]] and "little-data" not in performance_tables.models()
    pages(paper, budget=4)
    # No claim of the paper-recipe ResNet-20 or against ResNet18 from this report (it has no ResNet18 run).
    assert {r["claim"] for r in rp.claims(rp.summarize(little), 8)} == {LOCAL, DEEPER,
                                                                        "attention matches a ResNet of its size"}
    axes = pytest.importorskip("matplotlib.axes")
    styles, real_plot = [], axes.Axes.plot
    monkeypatch.setattr(axes.Axes, "plot", lambda axis, *a, **k: styles.append((k.get("label"), k.get(
        "linestyle", "-"))) or real_plot(axis, *a, **k))
    performance_tables.plot_little_data_curves(tmp_path / "little.png")
    assert [s for s in styles if s[0]] == [
        ("sa_quadratic_small (3 seeds), small_data", "-"), ("sa_quadratic_small (3 seeds), paper", "--"),
        ("resnet20 (3 seeds), paper", "--"), ("resnet20 (3 seeds), small_data", "-")]
    # Locality: a column for the attention model, a row per metric, each layer solid under small_data and dashed
    # under the paper's: layer 0's mass ends at 0.4 here and 0.5 there (as in the table above).
    lines = []
    monkeypatch.setattr(axes.Axes, "plot", lambda axis, x, y, *a, **k: lines.append((k.get("label"), k.get(
        "linestyle", "-"), list(y))) or real_plot(axis, x, y, *a, **k))
    performance_tables.plot_little_data_locality(tmp_path / "locality.png")
    row = [("layer 0", "-"), ("layer 1", "-"), ("layer 0, paper's recipe", "--"), ("layer 1, paper's recipe", "--")]
    assert [line[:2] for line in lines] == row * 3 and (tmp_path / "locality.png").stat().st_size > 0
    assert [line[2][-1] for line in lines[4:8:2]] == [pytest.approx(0.4), pytest.approx(0.5)]


def test_the_ablation_table_groups_the_small_data_runs_by_augmentation(pages, tmp_path):
    """The ablation report's runs by model and augmentation, best first, seeds pooled; runs of another recipe or
    of another budget than the little-data study's left out. The little-data study's small_data runs of the same
    models join the recipe's augmentation, one run a seed."""
    def run(accuracy, validation, seed, augmentation="pad_crop_flip", **flags):
        return {"test_accuracy": accuracy, "best_val_accuracy": validation, "flags": {
            "model": "sa_quadratic_small", "recipe": "small_data", "epochs": 8, "seed": seed,
            "augmentation": augmentation, **flags}}

    whole = "pad_crop_flip,rand_augment,random_erasing,mixup,cutmix"
    ablation = {"a": run(0.60, 0.55, 0, whole), "b": run(0.62, 0.57, 1, whole), "c": run(0.9, 0.9, 0, whole,
                model="resnet20"), "d": run(0.9, 0.9, 0, epochs=4), "e": run(0.65, 0.60, 0, "pad_crop_flip,rand_augment"),
                "f": run(0.70, 0.66, 0), "g": run(0.9, 0.9, 0, recipe="paper")}
    study = {"s0": run(0.70, 0.66, 0), "s1": run(0.74, 0.70, 1), "learned": run(0.5, 0.5, 0, model="sa_learned_small"),
             "paper": run(0.9, 0.9, 2, recipe="paper")}
    for entry in study.values():
        del entry["flags"]["augmentation"]  # the study's runs take the recipe's
    files.write_json(str(tmp_path / "little_data.json"), {"runs": study, "budget": 8})
    files.write_json(str(tmp_path / "small_data_ablation.json"), {"runs": ablation})
    assert _cells(performance_tables.little_data_ablation()) == [
        ["`resnet20`", f"`{whole}`", "0.900", "0.900", "1"],
        ["`sa_quadratic_small`", "`pad_crop_flip`", "0.720 ± 0.028", "0.680 ± 0.028", "2"],
        ["`sa_quadratic_small`", "`pad_crop_flip,rand_augment`", "0.650", "0.600", "1"],
        ["`sa_quadratic_small`", f"`{whole}`", "0.610 ± 0.014", "0.560 ± 0.014", "2"]]


def test_the_bfloat16_accuracy_table_sets_each_model_beside_its_float32_runs(pages, tmp_path):
    # float32: two models at the budget (8) and one at another; bfloat16: runs read with and without snapshots.
    float32 = {f"{model}|seed={seed}|epochs={epochs}": _run({0: 0.1, epochs: accuracy})
               for model, epochs, accuracies in (("quadratic", 8, (0.60, 0.64)), ("gated", 8, (0.70, 0.72)),
                                                 ("learned", 4, (0.5, 0.5)))
               for seed, accuracy in enumerate(accuracies)}
    pages(float32)
    files.write_json(str(tmp_path / "bfloat16_training.json"), {
        "runs": {"gated|seed=0|epochs=8": {"test_accuracy": 0.60, "precision": "mixed_bfloat16"},
                 "gated|seed=0|epochs=4": {"test_accuracy": 0.1, "precision": "mixed_bfloat16"}},
        "runs_without_snapshots": {f"quadratic|seed={s}|epochs=8": {"test_accuracy": a, "precision": "mixed_bfloat16"}
                                   for s, a in enumerate((0.60, 0.64, 0.71))}})
    # Within the spread as everywhere: the larger std of the two sides (bfloat16's here, beyond float32's).
    assert _cells(performance_tables.training_bfloat16_accuracy()) == [
        ["`sa_quadratic_small`", "0.620 ± 0.028 (2)", "0.650 ± 0.056 (3)", "mixed_bfloat16", "+0.030", "yes"],
        ["`sa_gated_small`", "0.710 ± 0.014 (2)", "0.600 (1)", "mixed_bfloat16", "-0.110", "no"]]
