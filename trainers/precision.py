"""``--mixed_precision=auto`` and ``--precision=auto``: bfloat16 where the hardware computes it.

bfloat16 pays only on units that multiply it natively: x86-64 CPUs with AVX512_BF16 or AMX
(``amx_bf16``; TensorFlow's oneDNN kernels use them), and NVIDIA GPUs of compute capability 8.0
(Ampere) and newer. Elsewhere the 16-bit kernels are emulated and slower than float32
(docs/performance.md), so ``auto`` stays in float32 there. The choice and its reason are logged
and recorded with the run (``config.json``) and the export (``metadata.json``).

`choose` is a pure function of the CPU's flags and the GPUs' compute capabilities, so it is
tested by feeding them; `detect` reads this machine's.
"""

from __future__ import annotations

# /proc/cpuinfo flags of CPU units that compute bfloat16 products natively.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# GPUs with bfloat16 tensor cores: NVIDIA Ampere (compute capability 8.0) and newer.
BF16_GPU_CAPABILITY = (8, 0)
CHOICES = ("auto", "float32", "bfloat16")


def choose(cpu_flags, gpu_capabilities) -> tuple[str, str]:
    """``("bfloat16" | "float32", why)`` for a machine whose CPU has ``cpu_flags`` (e.g.
    `trainers.process.cpu_info`'s ``extensions``) and whose GPUs have ``gpu_capabilities``
    (``(major, minor)`` per GPU; empty: none). With GPUs, they decide (the model runs there):
    bfloat16 only if every one has compute capability 8.0 or more. Without, the CPU decides."""
    capabilities = [tuple(int(x) for x in c) for c in gpu_capabilities]
    if capabilities:
        old = [c for c in capabilities if c < BF16_GPU_CAPABILITY]
        if old:
            return "float32", (f"GPU compute capability {'.'.join(map(str, min(old)))} < "
                               f"{'.'.join(map(str, BF16_GPU_CAPABILITY))}: no bfloat16 tensor cores")
        return "bfloat16", (f"GPUs of compute capability {', '.join('.'.join(map(str, c)) for c in capabilities)} "
                            "have bfloat16 tensor cores")
    units = [f for f in BF16_CPU_FLAGS if f in set(cpu_flags)]
    if units:
        return "bfloat16", f"CPU with {', '.join(units)} (native bfloat16 products)"
    return "float32", f"CPU without {' or '.join(BF16_CPU_FLAGS)}: bfloat16 would be emulated"


def gpu_capabilities() -> list[tuple[int, int]]:
    """Compute capabilities of this process's visible GPUs (TensorFlow's view); [] without."""
    import tensorflow as tf

    found = []
    for device in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(device).get("compute_capability")
        if capability:
            found.append(tuple(capability))
    return found


def detect() -> tuple[str, str]:
    """`choose` for this machine."""
    from trainers.process import cpu_info

    return choose(cpu_info()["extensions"], gpu_capabilities())


def resolve(requested: str, detector=None) -> tuple[str, str]:
    """``(dtype, why)`` for a ``requested`` precision: ``"auto"`` asks ``detector``; an explicit
    ``"float32"`` or ``"bfloat16"`` is taken as given."""
    if requested not in CHOICES:
        raise ValueError(f"precision must be one of {', '.join(CHOICES)}, got {requested!r}.")
    if requested == "auto":
        dtype, why = (detector or detect)()
        return dtype, f"auto: {why}"
    return requested, "requested"


KEPT = "auto, kept from the resumed run: "  # the reason of a precision a resumed run keeps


def training_policy(requested: str, detector=None, resumed: dict | None = None) -> tuple[str, str]:
    """The Keras dtype policy of ``--mixed_precision=requested`` and why: ``"auto"`` gives
    ``"mixed_bfloat16"`` (float32 variables, bfloat16 compute) where `choose` says bfloat16, else
    ``"float32"``; any other value is taken as given.

    ``resumed``: the ``precision`` a run being resumed recorded (``{"policy", "why"}`` of its
    ``config.json``). ``"auto"`` keeps it, so that a run resumed on another CPU class goes on in
    the precision its epochs so far were trained in (emulated, and slower, where the CPU lacks
    the units) instead of changing it mid-run."""
    if requested != "auto":
        return requested, "requested"
    if resumed and resumed.get("policy"):
        # The first choice's reason, however many times the run was resumed since.
        first = resumed.get("why", "recorded").removeprefix(KEPT).removeprefix("auto: ")
        return resumed["policy"], KEPT + first
    dtype, why = resolve("auto", detector)
    return ("mixed_bfloat16" if dtype == "bfloat16" else "float32"), why
