"""The trainer's step rate and peak memory with and without ``--keep_freed_memory``
(`trainers.memory`), each run in its own process, alternating A B A B:

    .venv/bin/python benchmarks/malloc.py --output=benchmarks/results/malloc.json

Each run trains a preset for ``--steps`` optimizer steps on generated data through the trainer
itself (``trainers.train.train``, tf.data pipeline included) and reports the trainer's images/s
and the process's peak RSS. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = """
from trainers import process
process.configure()  # as the trainer's entry point does
import json, resource, sys
from trainers.config import make_config
from trainers.train import train
preset, keep, steps, model_dir = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4]
config = make_config(overrides=dict(model=preset, dataset="synthetic", epochs=1, max_steps=steps,
                                    keep_freed_memory=keep, model_dir=model_dir, strategy="one_device",
                                    validation_size=100, eval_batch_size=100))
results = train(config, log=lambda s: None)
print(json.dumps({"images_per_second": results["images_per_second"], "remat": results["model_config"]["remat"],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "process": process.describe(config.mixed_precision)}))
"""


def run_case(preset: str, keep: bool, steps: int) -> dict:
    from trainers import process

    with tempfile.TemporaryDirectory() as model_dir:
        out = subprocess.run([sys.executable, "-c", _CHILD, preset, "1" if keep else "0", str(steps), model_dir],
                             cwd=ROOT, capture_output=True, text=True, check=True,
                             env={**process.child_environment(), "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="sa_quadratic_small,resnet18")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--merge", action="store_true", help="Keep the presets already in --output.")
    parser.add_argument("--output", default=os.path.join(ROOT, "benchmarks", "results", "malloc.json"))
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from trainers import process

    process.configure()  # the parent's matmul peak under the kernels its children run with
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
    if args.merge and os.path.exists(args.output):
        with open(args.output) as f:
            earlier = json.load(f)
        for preset, entry in earlier["presets"].items():
            entry.setdefault("steps_per_run", earlier.get("steps_per_run"))
            table.setdefault(preset, entry)
    result = {"date": datetime.date.today().isoformat(), "machine": platform.platform(),
              "cores": os.cpu_count(), "batch": 100, "process": processes, "presets": table}
    sys.path.insert(0, ROOT)
    from trainers import files

    files.write_json(args.output, result)
    print(json.dumps({p: {k: round(v, 2) for k, v in t.items() if k != "runs"} for p, t in table.items()}))


if __name__ == "__main__":
    main()
