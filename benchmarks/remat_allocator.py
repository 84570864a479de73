"""What rematerialized training costs, and how the allocators change it: the trainer's step on a
paper preset at batch 100, one process per variant, alternating (A B C D, then D C B A):

    .venv/bin/python -m benchmarks.remat_allocator       # benchmarks/results/remat_allocator.json

Variants (each is the trainer with its programs' environment, `trainers`: TensorFlow's oneDNN
kernels on, whose pool serves the large tensors):

* ``remat``: ``--remat=auto`` (on for the paper presets at batch 100) with the trainer's
  defaults (``--keep_freed_memory`` off under remat: freed malloc memory goes back);
* ``remat_one_malloc_arena``: the same with ``MALLOC_ARENA_MAX=1`` (glibc's default gives
  threads arenas of their own, up to 8 per core);
* ``remat_onednn_to_malloc``: the same with oneDNN's large tensors from malloc
  (``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1``), so every freed tensor goes back to the system;
* ``remat_no_xla``: ``remat`` with ``--nojit_compile`` (the same step as ``remat``: the trainer
  compiles no rematerialized model with XLA by default; each result's ``xla`` says what ran);
* ``no_remat``: ``--remat=none`` with its defaults (freed memory kept).

Each reports the fastest of ``--steps`` timed steps after a warm-up step, images/s, peak RSS, and
the process's minor page faults and system CPU seconds (memory handed back and faulted in
again shows there). Ratios are against ``no_remat``. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import time

from benchmarks import harness

# name: (--remat, --jit_compile (None: the trainer's default), environment)
VARIANTS = {
    "remat": ("auto", None, {}),
    "remat_one_malloc_arena": ("auto", None, {"MALLOC_ARENA_MAX": "1"}),
    "remat_onednn_to_malloc": ("auto", None, {"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1"}),
    "remat_no_xla": ("auto", False, {}),
    "no_remat": ("none", None, {}),
}
DEFAULT_VARIANTS = "remat,remat_one_malloc_arena,remat_onednn_to_malloc,no_remat"

def measure(preset: str, remat: str, steps: int, model_dir: str, jit) -> dict:
    """One variant in this process (configured as the trainer's entry point configures it): the
    trainer's step, timed, and what the process used."""
    import tensorflow as tf

    from trainers import distribute, process
    from trainers.config import make_config
    from trainers.task import Task

    config = make_config(overrides=dict(model=preset, dataset="synthetic", global_batch_size=100, eval_batch_size=100,
                                        validation_size=100, epochs=1, strategy="one_device", model_dir=model_dir,
                                        remat=remat, jit_compile=jit, mixed_precision="float32"))
    task = Task(config, log=lambda s: None)
    model = task.build_model()
    process.keep_freed_memory(task.keeps_freed_memory())  # as trainers.train.train does
    train_steps = distribute.local_train_steps(task, model, task.build_optimizer(model, task.build_schedule(
        task.total_steps())))
    iterator = iter(task.train_dataset(0))
    one = tf.constant(1)
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        train_steps(iterator, one).numpy()
        times.append(time.perf_counter() - start)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"remat": bool(task.model_config.remat), "xla": task.use_xla(),
            "keep_freed_memory": task.keeps_freed_memory(), "step_seconds": times[1:],
            "images_per_second": 100 / min(times[1:]), "peak_rss_mb": usage.ru_maxrss / 1024,
            "minor_page_faults": usage.ru_minflt, "system_seconds": usage.ru_stime,
            "user_seconds": usage.ru_utime, "process": process.describe(task.precision)}


def run_variant(preset: str, variant: str, steps: int) -> dict:
    remat, jit, extra = VARIANTS[variant]
    from trainers import process

    env = {k: v for k, v in process.child_environment().items()
           if k not in ("MALLOC_ARENA_MAX", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR")}
    try:
        return harness.run_training_side(__name__, variant, [f"--preset={preset}", f"--steps={steps}"],
                                         env={**env, **extra})
    except harness.SideError as failure:
        return {"failed": f"exit {failure.returncode}", "stderr_tail": failure.stderr[-1500:]}


def main() -> None:
    parser = harness.arguments(__doc__, "remat_allocator.json")
    parser.add_argument("--presets", default="sa_quadratic")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"Of {', '.join(VARIANTS)}.")
    parser.add_argument("--steps", type=int, default=2, help="Timed steps per run, after one warm-up step.")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--preset", help=argparse.SUPPRESS)
    parser.add_argument("--model_dir", help=argparse.SUPPRESS)
    args = harness.parse(parser)
    if args.side:  # one variant
        remat, jit, _ = VARIANTS[args.side]
        return harness.print_result(measure(args.preset, remat, args.steps, args.model_dir, jit))
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}.")
    table = {}
    for preset in args.presets.split(","):
        runs = {v: [] for v in variants}
        for round_ in range(args.rounds):
            for variant in (variants if round_ % 2 == 0 else variants[::-1]):
                runs[variant].append(run_variant(preset, variant, args.steps))
                print(preset, variant, runs[variant][-1], flush=True)
        ok = {v: [r for r in rs if "failed" not in r] for v, rs in runs.items()}
        best = {v: {"images_per_second": max(r["images_per_second"] for r in rs),
                    "peak_rss_mb": max(r["peak_rss_mb"] for r in rs)} for v, rs in ok.items() if rs}
        ratios = {}
        if "no_remat" in best:
            base = best["no_remat"]
            ratios = {v: {"speed_over_no_remat": b["images_per_second"] / base["images_per_second"],
                          "peak_rss_over_no_remat": b["peak_rss_mb"] / base["peak_rss_mb"]}
                      for v, b in best.items() if v != "no_remat"}
        table[preset] = {"runs": runs, "best": best, "ratios": ratios}
    date = datetime.date.today().isoformat()
    for entry in table.values():
        entry.update(date=date, steps_per_run=args.steps, rounds=args.rounds,
                     matmul_gflops=harness.matmul_peaks()["float32"])
    harness.write_report(args.output, {"batch": 100, "presets": table}, merge=args.merge)
    print(json.dumps({p: t["ratios"] for p, t in table.items()}, indent=1))


if __name__ == "__main__":
    main()
