"""The data-efficiency benchmark (`benchmarks.data_efficiency`): its variant and dataset names, the subsets it trains
on, its plan on the study engine and the targets it checks."""

import json
import os

import numpy as np
import pytest

from benchmarks import data_efficiency as de
from benchmarks import harness

CONTENT, CONVOLUTIONAL = "sa_content_plus_learned_bias_small", {"attention_init": "convolutional"}


def test_every_variant_encoding_has_the_small_preset_it_trains():
    import sa_conv

    small = {name[len("sa_"):-len("_small")] for name in sa_conv.PRESETS if name.endswith("_small")}
    assert set(de.ATTENTION_ENCODINGS) == small
    for encoding in de.ATTENTION_ENCODINGS:
        assert de.parse_variant(encoding)["model"] in sa_conv.PRESETS


def test_variant_and_dataset_names():
    # Two spellings of one variant must key one run, or a resumed study trains it again.
    quadratic = {"model": "sa_quadratic_small", **CONVOLUTIONAL}
    for spelling, name, flags in [
            ("resnet18", "resnet18", {"model": "resnet18"}), ("quadratic_full", "quadratic_full", {
                "model": "sa_quadratic_full_small"}), ("content_plus_learned_bias", "content", {"model": CONTENT}),
            ("content_plus_learned_bias+mimetic", "content+mimetic", {"model": CONTENT, "attention_init": "mimetic"}),
            ("learned+convolutional@0.10", "learned+convolutional@0.1",
             {"model": "sa_learned_small", **CONVOLUTIONAL, "locality_strength": 0.1}),
            ("quadratic+convolutional@1.0/2.00", "quadratic+convolutional@1/2",
             {**quadratic, "locality_strength": 1.0, "locality_distance": 2.0}),
            ("quadratic+convolutional@0.00001", "quadratic+convolutional@0.00001",
             {**quadratic, "locality_strength": 1e-5}),
            ("resnet20", "resnet20", {"model": "resnet20"}),
            ("resnet20:small_data", "resnet20:small_data", {"model": "resnet20", "recipe": "small_data"}),
            ("quadratic+convolutional@0.10:small_data", "quadratic+convolutional@0.1:small_data",
             {**quadratic, "locality_strength": 0.1, "recipe": "small_data"})]:
        assert de.parse_variant(spelling) == de.parse_variant(name) == flags
        assert de.variant_name(spelling) == de.variant_name(name) == name
    bad = [(name, "ENCODING") for name in ("conv", "quadratic+", "quadratic@1", "Quadratic", "content_plus")]
    recipes = [("quadratic:paper", "Unknown recipe 'paper'"), ("resnet20:big_data", "Unknown recipe 'big_data'")]
    for name, error in bad + recipes + [("learned+convolutional@0.1.2", "are numbers")]:
        for parse in (de.parse_variant, de.variant_name):
            with pytest.raises(ValueError, match=error):
                parse(name)
    assert [de.parse_dataset(name) for name in ("shapes", "cifar10-mini:30", "cifar10-mini:100")] == [
        ("shapes", None), ("cifar10-mini", 0.3), ("cifar10-mini", 1.0)]
    for name in ("cifar10-mini:0", "cifar10-mini:101", "cifar10", "mnist"):
        with pytest.raises(ValueError, match="cifar10-mini:PERCENT"):
            de.parse_dataset(name)


@pytest.mark.parametrize("flag, error", [("--variants=quadratic,quadratik", "--variants: Unknown variant 'quadratik'"),
                                         ("--datasets=cifar100", "--datasets: ")])
def test_an_unknown_variant_or_dataset_is_a_usage_error(flag, error, tmp_path):
    proc = harness.run_module("benchmarks.data_efficiency", [flag, f"--output={tmp_path / 'r.json'}"])
    assert proc.returncode == 2 and error in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert os.listdir(tmp_path) == []


def _summary(runs, epochs=8):
    """`summarize` of ``{(variant, dataset): accuracies}``, a seed each."""
    return de.summarize({de.run_key(*place, s, epochs): {"test_accuracy": a} for place, accuracies in runs.items()
                         for s, a in enumerate(accuracies)})


def test_summary_over_seeds_and_the_targets_on_it():
    summary = de.summarize({de.run_key("q", "d", seed, epochs): {"test_accuracy": a}
                            for seed, a, epochs in ((2, 0.3, 8), (0, 0.2, 8), (1, 0.25, 8), (0, 0.4, 30))})
    assert summary == {"q|d|epochs=30": {"seeds": [0], "mean": 0.4, "std": None, "min": 0.4, "max": 0.4},
                       "q|d|epochs=8": {"seeds": [0, 1, 2], "mean": pytest.approx(0.25), "std": pytest.approx(0.05),
                                        "min": 0.2, "max": 0.3}}
    d = "cifar10-mini:100"  # and on shapes no convolutional twin, nor a random-initialized preset
    rows = {(r["target"], r["against"]): r for r in de.targets(_summary({
        ("content", d): (0.30, 0.32), ("gated", d): (0.34, 0.36), ("quadratic", d): (0.36,), ("learned", d): (0.33,),
        ("quadratic+convolutional@1", d): (0.30,), ("quadratic+convolutional@0.1", d): (0.37, 0.35),
        ("learned+convolutional@0.1", d): (0.32,), ("quadratic", "shapes"): (0.2,),
        ("content+mimetic", "shapes"): (0.5,)}))}
    margin, best = rows["gated >= content + 0.03", "content"], rows["gated >= every small preset", "quadratic"]
    quadratic, learned = rows["convolutional >= random", "quadratic"], rows["convolutional >= random", "learned"]
    assert len(rows) == 4 and margin["difference"] == pytest.approx(0.04) and margin["met"]
    assert margin["needed"] == de.GATED_MARGIN and margin["spread"] == pytest.approx(np.std([0.30, 0.32], ddof=1))
    assert best["difference"] == pytest.approx(-0.01) and not best["met"]  # the best of content, quadratic, learned
    assert quadratic["variant"] == "quadratic+convolutional@0.1" and quadratic["met"] and quadratic["seeds"] == 2
    assert learned["difference"] == pytest.approx(-0.01) and not learned["met"] and learned["spread"] is None
    # Within a dataset and budget only; by target, then epochs, then training images.
    summary = {**_summary({("gated", "a"): (0.5,), ("content", "b"): (0.1,)}), **_summary(
        {("gated", "a"): (0.5,), ("content", "a"): (0.46,), ("gated", "b"): (0.1,), ("content", "b"): (0.1,)}, 30)}
    margin, best = de.TARGETS[:2]
    assert [(r["dataset"], r["epochs"], r["target"], r["met"]) for r in de.targets(summary, {"a": 500, "b": 50})] == [
        ("b", 30, margin, False), ("a", 30, margin, True), ("b", 30, best, True), ("a", 30, best, True)]


def test_a_study_prepares_each_dataset_once_and_records_its_runs(tiny_cifar, tmp_path, monkeypatch):
    from trainers import data as data_lib
    from trainers import study

    path, generated = tiny_cifar
    with pytest.raises(ValueError, match="Unknown dataset"):
        de.prepare(["cifar100"], path, str(tmp_path / "data"))
    prepared, sizes = de.prepare(["cifar10-mini:30", "shapes"], path, str(tmp_path / "data"))
    data_dir = prepared["cifar10-mini:30"]["data_dir"]
    keep = data_lib.stratified_subset(generated.train.labels, 0.3, de.SUBSET_SEED)
    subset = data_lib.load_cifar10_files(data_dir)  # in the official format, with the whole test split
    for written, expected in ((subset.train.images, generated.train.images[keep]), (subset.test.images,
                              generated.test.images), (subset.train.labels, generated.train.labels[keep])):
        np.testing.assert_array_equal(written, expected)
    assert sizes == {"cifar10-mini:30": len(keep)}
    assert prepared["shapes"] == {"dataset": "shapes"} and os.listdir(tmp_path / "data") == ["cifar10-mini_30"]
    stamp = os.path.getmtime(data_dir)
    assert de.prepare(["cifar10-mini:30"], path, str(tmp_path / "data")) == ({"cifar10-mini:30": prepared[
        "cifar10-mini:30"]}, sizes) and os.path.getmtime(data_dir) == stamp  # written once
    load, sources = data_lib.load_cifar10_files, []
    monkeypatch.setattr(data_lib, "load_cifar10_files", lambda d: (sources.append(d) if d == path else None) or load(d))
    assert set(de.prepare(["cifar10-mini:20", "cifar10-mini:40"], path, str(tmp_path / "data"))[1]) == {
        "cifar10-mini:20", "cifar10-mini:40"} and sources == [path]  # the source read once for both
    with pytest.raises(ValueError, match="Unknown variant"):
        de.study_runs(["quadratic", "quadratik"], ["shapes"], [0], 2, prepared)
    runs = de.study_runs(["quadratic", "quadratic+convolutional@0.10"], ["cifar10-mini:30"], [0], 2, prepared)
    assert [run.key for run in runs] == ["quadratic|cifar10-mini:30|seed=0|epochs=2",
                                         "quadratic+convolutional@0.1|cifar10-mini:30|seed=0|epochs=2"]
    assert runs[1].flags == {"model": "sa_quadratic_small", **CONVOLUTIONAL, "locality_strength": 0.1,
                             "dataset": "cifar10", "data_dir": data_dir, "epochs": 2, "seed": 0,
                             "mixed_precision": "float32"}
    tiny = [study.Run(run.key, {**run.flags, "num_layers": 1, "global_batch_size": 25, "eval_batch_size": 25,
                                "strategy": "one_device"}) for run in runs]
    report = study.Report(str(tmp_path / "r.json"), keep=de.keep,
                          derive=lambda runs: {"training_images": sizes, "summary": de.summarize(runs)})
    study.run_study("data_efficiency", tiny, de.read_run, report.record, str(tmp_path / "study"), log=lambda s: None)
    written, run = report.read(), report.read()["runs"][runs[0].key]
    with open(tmp_path / "study" / "data_efficiency" / "trial_0000" / "results.json") as f:
        results = json.load(f)
    assert sorted(written["runs"]) == sorted(run.key for run in runs) and written["training_images"] == sizes
    assert (run["test_accuracy"], run["steps"]) == (results["test_accuracy"], results["steps"])
    assert run["precision"] == "float32" and "data_dir" not in run["flags"]
    assert written["summary"]["quadratic|cifar10-mini:30|epochs=2"]["mean"] == pytest.approx(run["test_accuracy"])
