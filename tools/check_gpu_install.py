"""Checks, without a GPU, that the documented GPU install resolves to one working TensorFlow:
``pip install --dry-run '.[gpu]'`` in a clean resolution must pick ``tensorflow`` with its CUDA
libraries and never ``tensorflow-cpu`` (two distributions writing the same package). Also checks
that the CPU install picks ``tensorflow-cpu`` and no CUDA library. ``make check-install``."""

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def resolve(extra: str) -> set[str]:
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--report", report, f".[{extra}]"], cwd=ROOT, check=True)
        with open(report) as f:
            return {item["metadata"]["name"].lower().replace("_", "-") for item in json.load(f)["install"]}


def main() -> int:
    failures = []
    gpu, cpu = resolve("gpu"), resolve("cpu")
    if "tensorflow" not in gpu or "tensorflow-cpu" in gpu:
        failures.append(f"[gpu] must install tensorflow and not tensorflow-cpu: {sorted(p for p in gpu if 'tensorflow' in p)}")
    if not {"nvidia-cudnn-cu12", "nvidia-cublas-cu12"} <= gpu:
        failures.append("[gpu] must bring the CUDA libraries (tensorflow[and-cuda]).")
    if "tensorflow-cpu" not in cpu or "tensorflow" in cpu or any(p.startswith("nvidia-") for p in cpu):
        failures.append(f"[cpu] must install tensorflow-cpu alone: {sorted(p for p in cpu if 'tensorflow' in p or 'nvidia' in p)}")
    for failure in failures:
        print("check_gpu_install: " + failure, file=sys.stderr)
    print(f"check_gpu_install: [gpu] resolves to {len(gpu)} packages with tensorflow and "
          f"{sum(p.startswith('nvidia-') for p in gpu)} CUDA libraries; [cpu] to {len(cpu)} with tensorflow-cpu: "
          + ("FAILED" if failures else "OK"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
