"""--mixed_precision=auto and --precision=auto (trainers.precision): bfloat16 where the hardware
multiplies it natively, decided from CPU flags and GPU compute capabilities fed here."""

import pytest

from trainers import precision

AVX2 = ["sse4_2", "avx", "avx2", "fma", "f16c"]
AVX512 = AVX2 + ["avx512f", "avx512bw", "avx512vl", "avx512_vnni"]


@pytest.mark.parametrize("flags,gpus,dtype,why", [
    (AVX2, [], "float32", "CPU without avx512_bf16 or amx_bf16"),
    (AVX512, [], "float32", "emulated"),
    (AVX512 + ["avx512_bf16"], [], "bfloat16", "CPU with avx512_bf16"),
    (AVX512 + ["avx512_bf16", "amx_tile", "amx_bf16"], [], "bfloat16", "avx512_bf16, amx_bf16"),
    (["amx_bf16"], [], "bfloat16", "amx_bf16"),
    (["asimd", "bf16"], [], "float32", "CPU without"),  # aarch64's bf16 flag: not what TF's oneDNN x86 kernels use
    (AVX2, [(8, 0)], "bfloat16", "compute capability 8.0"),
    (AVX2, [(9, 0), (8, 6)], "bfloat16", "9.0, 8.6"),
    (AVX512 + ["amx_bf16"], [(7, 5)], "float32", "compute capability 7.5 < 8.0"),  # the GPU decides
    (AVX2, [(8, 0), (7, 0)], "float32", "7.0 < 8.0"),
])
def test_choice_from_cpu_flags_and_gpu_capabilities(flags, gpus, dtype, why):
    got, reason = precision.choose(flags, gpus)
    assert got == dtype and why in reason


def test_resolve_and_training_policy():
    bf16 = lambda: ("bfloat16", "CPU with amx_bf16 (native bfloat16 products)")  # noqa: E731
    f32 = lambda: ("float32", "CPU without avx512_bf16 or amx_bf16")  # noqa: E731
    assert precision.resolve("auto", bf16) == ("bfloat16", "auto: CPU with amx_bf16 (native bfloat16 products)")
    assert precision.resolve("float32", bf16) == ("float32", "requested")
    assert precision.training_policy("auto", bf16)[0] == "mixed_bfloat16"
    assert precision.training_policy("auto", f32) == ("float32", "auto: CPU without avx512_bf16 or amx_bf16")
    assert precision.training_policy("mixed_float16", bf16) == ("mixed_float16", "requested")
    with pytest.raises(ValueError, match="precision must be one of auto, float32, bfloat16"):
        precision.resolve("fp8")


def test_this_machine_gets_an_answer_and_the_task_records_it(tmp_path, monkeypatch):
    """`detect` reads this machine (whatever it is); the Task resolves auto once and the trainer
    writes the policy and its reason to config.json."""
    import dataclasses
    import json

    from trainers import train as train_lib
    from trainers.task import Task
    from trainers.config import make_config

    dtype, why = precision.detect()
    assert dtype in ("float32", "bfloat16") and why
    monkeypatch.setattr(precision, "detect", lambda: ("bfloat16", "CPU with amx_bf16 (fed by the test)"))
    config = make_config(overrides=dict(model="sa_quadratic_small", num_layers=1, hidden_size=16, mlp_size=16,
                                        dataset="synthetic", epochs=1, max_steps=1, global_batch_size=50,
                                        validation_size=100, strategy="one_device", mixed_precision="auto",
                                        model_dir=str(tmp_path / "run")))
    logs = []
    trainer = train_lib.Trainer(config, log=logs.append, interactive=False)
    trainer.run()
    assert trainer.task.precision == "mixed_bfloat16"
    assert sa_blocks_dtype(trainer.model) == "bfloat16"
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())
    assert recorded["precision"] == {"policy": "mixed_bfloat16", "why": "auto: CPU with amx_bf16 (fed by the test)"}
    assert any("precision mixed_bfloat16 (auto: CPU with amx_bf16" in line for line in logs)
    # Resumed on a CPU without the units, the run goes on in the precision it started with; a new one
    # in the same place decides afresh.
    monkeypatch.setattr(precision, "detect", lambda: ("float32", "CPU without avx512_bf16 (fed by the test)"))
    resumed = Task(dataclasses.replace(config, epochs=2, max_steps=2), log=logs.append)
    assert resumed.precision == "mixed_bfloat16"
    assert resumed.precision_reason == "auto, kept from the resumed run: CPU with amx_bf16 (fed by the test)"
    # Resumed again, it keeps the first choice's reason, not a longer one each time.
    assert precision.training_policy("auto", resumed={"policy": "mixed_bfloat16", "why": resumed.precision_reason}) \
        == ("mixed_bfloat16", resumed.precision_reason)
    fresh = Task(dataclasses.replace(config, model_dir=str(tmp_path / "other")), log=logs.append)
    assert fresh.precision == "float32"


def sa_blocks_dtype(model):
    import sa_conv

    return {b.compute_dtype for b in sa_conv.attention_blocks(model)}.pop()
