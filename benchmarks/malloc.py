"""The trainer's step rate and peak memory with and without ``--keep_freed_memory``
(`trainers.memory`), each run in its own process, alternating A B A B:

    .venv/bin/python -m benchmarks.malloc                # benchmarks/results/malloc.json

Each run trains a preset for ``--steps`` optimizer steps on generated data through the trainer
itself (``trainers.train.train``, tf.data pipeline included) and reports the trainer's images/s
and the process's peak RSS. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import resource

from benchmarks import harness


def measure(preset: str, keep: bool, steps: int, model_dir: str) -> dict:
    """One run in this process (configured as the trainer's entry point configures it): the
    trainer itself for ``steps`` steps, its images/s and the process's peak RSS."""
    from trainers import process, run_files
    from trainers.config import make_config
    from trainers.train import train

    config = make_config(overrides=dict(model=preset, dataset="synthetic", epochs=1, max_steps=steps,
                                        keep_freed_memory=keep, model_dir=model_dir, strategy="one_device",
                                        validation_size=100, eval_batch_size=100, mixed_precision="float32"))
    results = train(config, log=lambda s: None)
    return {"images_per_second": results["images_per_second"], "remat": results["model_config"]["remat"],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "process": process.describe(run_files.read_precision(model_dir))}


def run_case(preset: str, keep: bool, steps: int) -> dict:
    return harness.run_training_side(__name__, "keep" if keep else "return",
                                     [f"--presets={preset}", f"--steps={steps}"])


def main() -> None:
    parser = harness.arguments(__doc__, "malloc.json")
    parser.add_argument("--presets", default="sa_quadratic_small,resnet18")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model_dir", help=argparse.SUPPRESS)
    args = harness.parse(parser)
    if args.side:  # one run: "keep" or "return" freed memory
        return harness.print_result(measure(args.presets, args.side == "keep", args.steps, args.model_dir))
    table, processes = {}, {}
    for preset in args.presets.split(","):
        runs = {"keep": [], "return": []}
        for _ in range(args.repeats):
            for keep in (True, False):
                run = run_case(preset, keep, args.steps)
                processes["keep" if keep else "return"] = run.pop("process")
                runs["keep" if keep else "return"].append(run)
                print(preset, keep, run, flush=True)
        best = {k: max(r["images_per_second"] for r in v) for k, v in runs.items()}
        rss = {k: max(r["peak_rss_mb"] for r in v) for k, v in runs.items()}
        table[preset] = {"runs": runs, "speedup_keep_over_return": best["keep"] / best["return"],
                         "peak_rss_ratio_keep_over_return": rss["keep"] / rss["return"]}
    for entry in table.values():
        entry["steps_per_run"] = args.steps
    harness.write_report(args.output, {"batch": 100, "process": processes, "presets": table}, merge=args.merge)
    print(json.dumps({p: {k: round(v, 2) for k, v in t.items() if k != "runs"} for p, t in table.items()}))


if __name__ == "__main__":
    main()
