"""The data-efficiency benchmark (`benchmarks.data_efficiency`): its variant and dataset names,
the subsets and the folder dataset it trains on, its resumable plan and the targets it checks.
Training itself is the trainer's (tested in test_train); here ``measure`` is given a train
function that answers from the flags, so the plan's bookkeeping is what is tested."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from benchmarks import data_efficiency as de


def test_variant_names_become_trainer_flags():
    assert de.parse_variant("resnet18") == {"model": "resnet18"}
    assert de.parse_variant("quadratic") == {"model": "sa_quadratic_small"}
    assert de.parse_variant("content") == {"model": "sa_content_plus_learned_bias_small"}
    assert de.parse_variant("learned+convolutional@0.1") == {
        "model": "sa_learned_small", "attention_init": "convolutional", "locality_strength": 0.1}
    assert de.parse_variant("quadratic+convolutional@0.1/2") == {
        "model": "sa_quadratic_small", "attention_init": "convolutional", "locality_strength": 0.1,
        "locality_distance": 2.0}
    assert de.parse_variant("content+mimetic") == {"model": "sa_content_plus_learned_bias_small",
                                                   "attention_init": "mimetic"}
    for bad in ("conv", "quadratic+", "quadratic@1", "Quadratic"):
        with pytest.raises(ValueError, match="ENCODING"):
            de.parse_variant(bad)


def test_each_variant_has_one_name():
    # Two spellings of one variant must key one run, or a resumed study trains it again.
    for spelling, name in (("content_plus_learned_bias", "content"), ("content", "content"),
                           ("content_plus_learned_bias+mimetic", "content+mimetic"),
                           ("learned+convolutional@0.10", "learned+convolutional@0.1"),
                           ("quadratic+convolutional@1.0/2.00", "quadratic+convolutional@1/2"),
                           ("quadratic+convolutional@0.00001", "quadratic+convolutional@0.00001"),
                           ("quadratic_full", "quadratic_full"), ("resnet18", "resnet18")):
        assert de.variant_name(spelling) == name
        assert de.variant_name(name) == name
        assert de.parse_variant(name) == de.parse_variant(spelling)
    with pytest.raises(ValueError, match="are numbers"):
        de.variant_name("learned+convolutional@0.1.2")
    with pytest.raises(ValueError, match="ENCODING"):
        de.variant_name("content_plus")


@pytest.mark.parametrize("flag, error", [("--variants=quadratic,quadratik", "--variants: Unknown variant 'quadratik'"),
                                         ("--datasets=cifar100", "--datasets: ")])
def test_an_unknown_variant_or_dataset_is_a_usage_error(flag, error, tmp_path):
    from benchmarks import harness

    proc = harness.run_module("benchmarks.data_efficiency", [flag, f"--output={tmp_path / 'r.json'}"])
    assert proc.returncode == 2 and error in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert os.listdir(tmp_path) == []


def test_dataset_names():
    assert de.parse_dataset("shapes") == ("shapes", None)
    assert de.parse_dataset("cifar10-mini:30") == ("cifar10-mini", 0.3)
    assert de.parse_dataset("cifar10-mini:100") == ("cifar10-mini", 1.0)
    for bad in ("cifar10-mini:0", "cifar10-mini:101", "cifar10", "mnist"):
        with pytest.raises(ValueError, match="cifar10-mini:PERCENT"):
            de.parse_dataset(bad)


def test_subsets_are_stratified_and_nested():
    labels = np.repeat(np.arange(5), [10, 20, 30, 40, 50])
    small, large = de.stratified_subset(labels, 0.1), de.stratified_subset(labels, 0.3)
    assert np.bincount(labels[small]).tolist() == [1, 2, 3, 4, 5]
    assert np.bincount(labels[large]).tolist() == [3, 6, 9, 12, 15]
    assert set(small) <= set(large)  # a smaller percentage's images are among a larger one's
    assert np.array_equal(small, de.stratified_subset(labels, 0.1))
    assert not np.array_equal(small, de.stratified_subset(labels, 0.1, seed=de.SUBSET_SEED + 1))
    assert np.bincount(labels[de.stratified_subset(labels, 0.01)]).tolist() == [1] * 5  # at least one a class


def test_a_cifar_subset_is_written_in_the_official_format(tiny_cifar, tmp_path):
    from trainers import data as data_lib

    path, generated = tiny_cifar
    written, kept = de.write_cifar_subset(path, 0.3, str(tmp_path / "subset"))
    subset = data_lib.load_cifar10_files(written)
    keep = de.stratified_subset(generated.train.labels, 0.3)
    assert kept == len(keep) == len(subset.train.labels)
    np.testing.assert_array_equal(subset.train.images, generated.train.images[keep])
    np.testing.assert_array_equal(subset.train.labels, generated.train.labels[keep])
    np.testing.assert_array_equal(subset.test.images, generated.test.images)  # the whole test split


def test_the_shapes_folder(tmp_path):
    root = de.write_shapes_folder(str(tmp_path / "a"), train_per_class=3, test_per_class=2, seed=5)
    for split, count in (("train", 3), ("test", 2)):
        assert sorted(os.listdir(os.path.join(root, split))) == sorted(de.SHAPE_CLASSES)
        for kind in de.SHAPE_CLASSES:
            assert len(os.listdir(os.path.join(root, split, kind))) == count
    image = np.asarray(Image.open(os.path.join(root, "train", "ring", "0000.png")))
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8 and image.std() > 10
    again = de.write_shapes_folder(str(tmp_path / "b"), train_per_class=3, test_per_class=2, seed=5)
    assert np.array_equal(image, np.asarray(Image.open(os.path.join(again, "train", "ring", "0000.png"))))


def test_a_shape_is_drawn_where_its_class_says():
    """The class is in the picture: a filled square covers its centre, a ring leaves it empty."""
    rng = np.random.default_rng(0)
    for kind, centre_covered in (("square", True), ("circle", True), ("ring", False)):
        canvas = np.zeros((32, 32, 3))
        de.draw_shape(canvas, kind, np.random.default_rng(rng.integers(1 << 30)))
        drawn = canvas.any(axis=-1)
        ys, xs = np.nonzero(drawn)
        centre = drawn[int(round(ys.mean())), int(round(xs.mean()))]
        assert 10 < drawn.sum() < 32 * 32 / 2 and centre == centre_covered, kind


def test_summary_over_seeds():
    runs = {de.run_key("quadratic", "shapes", seed, 8): {"test_accuracy": acc}
            for seed, acc in ((2, 0.30), (0, 0.20), (1, 0.25))}
    runs[de.run_key("quadratic", "shapes", 0, 30)] = {"test_accuracy": 0.4}
    summary = de.summarize(runs)
    assert set(summary) == {"quadratic|shapes|epochs=8", "quadratic|shapes|epochs=30"}
    entry = summary["quadratic|shapes|epochs=8"]
    assert entry["seeds"] == [0, 1, 2] and entry["min"] == 0.20 and entry["max"] == 0.30
    assert entry["mean"] == pytest.approx(0.25) and entry["std"] == pytest.approx(0.05)
    assert summary["quadratic|shapes|epochs=30"]["std"] is None


def _entry(*accuracies):
    return de.summarize({de.run_key("v", "d", s, 8): {"test_accuracy": a} for s, a in enumerate(accuracies)})["v|d|epochs=8"]


def test_targets_take_the_best_strength_and_the_best_existing_preset():
    place = "cifar10-mini:100|epochs=8"
    summary = {f"content|{place}": _entry(0.30, 0.32), f"gated|{place}": _entry(0.34, 0.36),
               f"quadratic|{place}": _entry(0.36), f"learned|{place}": _entry(0.33),
               f"quadratic+convolutional@1|{place}": _entry(0.30),
               f"quadratic+convolutional@0.1|{place}": _entry(0.37, 0.35),
               f"learned+convolutional@0.1|{place}": _entry(0.32),
               "quadratic|shapes|epochs=8": _entry(0.2),  # no convolutional twin there: no row
               "content+mimetic|shapes|epochs=8": _entry(0.5)}  # not a random-initialized preset
    rows = {(r["target"], r["against"]): r for r in de.targets(summary)}
    assert len(rows) == 4
    margin = rows[("gated >= content + 0.03", "content")]
    assert margin["difference"] == pytest.approx(0.04) and margin["met"] and margin["needed"] == de.GATED_MARGIN
    assert margin["spread"] == pytest.approx(np.std([0.30, 0.32], ddof=1))
    best = rows[("gated >= every small preset", "quadratic")]  # the best of content, quadratic, learned
    assert best["difference"] == pytest.approx(-0.01) and not best["met"]
    quadratic = rows[("convolutional >= random", "quadratic")]
    assert quadratic["variant"] == "quadratic+convolutional@0.1" and quadratic["met"] and quadratic["seeds"] == 2
    learned = rows[("convolutional >= random", "learned")]
    assert learned["difference"] == pytest.approx(-0.01) and not learned["met"] and learned["spread"] is None


def test_targets_compare_only_within_a_dataset_and_budget():
    summary = {"gated|a|epochs=8": _entry(0.5), "content|b|epochs=8": _entry(0.1),
               "gated|a|epochs=30": _entry(0.5), "content|a|epochs=30": _entry(0.46)}
    rows = de.targets(summary)
    assert [(r["dataset"], r["epochs"], r["target"]) for r in rows] == [
        ("a", 30, "gated >= content + 0.03"), ("a", 30, "gated >= every small preset")]
    assert rows[0]["met"]  # +0.04
    ordered = de.targets({**summary, "gated|b|epochs=30": _entry(0.1), "content|b|epochs=30": _entry(0.1)},
                         sizes={"a": 500, "b": 50})
    assert [r["dataset"] for r in ordered if r["target"].startswith("gated >= content")] == ["b", "a"]


def test_a_study_prepares_each_dataset_once_and_records_its_runs(tiny_cifar, tmp_path):
    from trainers import study

    path, generated = tiny_cifar
    prepared, sizes = de.prepare(["cifar10-mini:30", "shapes"], path, str(tmp_path / "data"))
    assert sizes == {"cifar10-mini:30": len(de.stratified_subset(generated.train.labels, 0.3))}
    assert prepared["shapes"] == {"dataset": "folder:" + str(tmp_path / "data" / "shapes")}
    stamp = os.path.getmtime(prepared["cifar10-mini:30"]["data_dir"])
    assert de.prepare(["cifar10-mini:30"], path, str(tmp_path / "data")) == (
        {"cifar10-mini:30": prepared["cifar10-mini:30"]}, sizes)
    assert os.path.getmtime(prepared["cifar10-mini:30"]["data_dir"]) == stamp  # written once
    runs = de.study_runs(["quadratic", "quadratic+convolutional@0.10"], ["cifar10-mini:30"], [0], 2, prepared)
    assert [run.key for run in runs] == ["quadratic|cifar10-mini:30|seed=0|epochs=2",
                                         "quadratic+convolutional@0.1|cifar10-mini:30|seed=0|epochs=2"]
    assert runs[1].flags == {"model": "sa_quadratic_small", "attention_init": "convolutional", "locality_strength": 0.1,
                             "dataset": "cifar10", "data_dir": prepared["cifar10-mini:30"]["data_dir"], "epochs": 2,
                             "seed": 0}
    tiny = [study.Run(run.key, {**run.flags, "num_layers": 1, "global_batch_size": 25, "eval_batch_size": 25,
                                "strategy": "one_device"}) for run in runs]
    report = study.Report(str(tmp_path / "r.json"), keep=de.keep,
                          derive=lambda runs: {"training_images": sizes, "summary": de.summarize(runs)})
    study.run_study("data_efficiency", tiny, de.read_run, report.record, str(tmp_path / "study"), log=lambda s: None)
    written = report.read()
    assert sorted(written["runs"]) == sorted(run.key for run in runs) and written["training_images"] == sizes
    run = written["runs"][runs[0].key]
    with open(tmp_path / "study" / "data_efficiency" / "trial_0000" / "results.json") as f:
        results = json.load(f)
    assert (run["test_accuracy"], run["steps"]) == (results["test_accuracy"], results["steps"])
    assert "data_dir" not in run["flags"] and run["precision"] == "float32"
    assert written["summary"]["quadratic|cifar10-mini:30|epochs=2"]["mean"] == pytest.approx(run["test_accuracy"])


def test_a_bad_plan_is_refused_before_anything_trains(tmp_path):
    with pytest.raises(ValueError, match="Unknown variant"):
        de.study_runs(["quadratic", "quadratik"], ["shapes"], [0], 2, {"shapes": {}})
    with pytest.raises(ValueError, match="Unknown dataset"):
        de.prepare(["shapes", "cifar100"], "unused", str(tmp_path / "data"))
