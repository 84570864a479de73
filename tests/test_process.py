"""Process-wide state: importing the project changes nothing; a program's entry point configures
its process once (`trainers.process`) and records what ran. Nothing here depends on the CPU it
runs on: the CPU facts are fed in."""

import json
import logging
import os
import subprocess
import sys

import pytest

from tests.conftest import PROJECT_ROOT
from trainers import process
from sa_conv.transformer import SEED_WATCH_FILTER, SeedWatchFilter

ENV = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
ENV["PYTHONPATH"] = str(PROJECT_ROOT)

# Runs in a fresh process: the state a module could change, before and after importing it.
_IMPORT_PROBE = r"""
import json, os, sys, pkgutil, importlib, logging
dup2_targets = []
_dup2 = os.dup2
os.dup2 = lambda fd, fd2, *a: (dup2_targets.append(fd2), _dup2(fd, fd2, *a))[1]
def state():
    stat = os.fstat(2)
    policy = None
    if "keras" in sys.modules:
        policy = sys.modules["keras"].config.dtype_policy().name
    backend = None
    if "matplotlib" in sys.modules:
        backend = sys.modules["matplotlib"].rcParams._get_backend_or_none()
    return {"env": dict(os.environ), "stderr": [stat.st_dev, stat.st_ino], "policy": policy, "backend": backend,
            "tf_filters": len(logging.getLogger("tensorflow").filters), "root_handlers": len(logging.getLogger().handlers)}
mode, names = sys.argv[1], sys.argv[2:]
before = state()
for name in names:
    if mode == "package":
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, name + "."):
            importlib.import_module(info.name)
    else:
        importlib.import_module(name)
after = state()
ours = ("sa_conv", "trainers", "export", "programs", "benchmarks", "tests")
third_party = sorted({m for m in sys.modules if "." not in m and m.isidentifier() and not m.startswith("_")
                      and getattr(sys.modules[m], "__file__", None)}
                     - set(sys.stdlib_module_names) - set(ours))
print(json.dumps({"before": before, "after": after, "dup2_targets": dup2_targets, "third_party": third_party}))
"""


def _probe(mode, *names, **env):
    proc = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, mode, *names], cwd=PROJECT_ROOT,
                          env={**ENV, **env}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _changed(probe):
    before, after = probe["before"]["env"], probe["after"]["env"]
    return {k: after.get(k) for k in set(before) | set(after) if before.get(k) != after.get(k)}


def test_importing_the_packages_and_all_their_modules_changes_no_process_state():
    """Imported in a fresh process, every module of every package: no environment variable
    beyond what their third-party dependencies set themselves on import (measured in a second
    process importing just them), standard error untouched (not even redirected for a while),
    the global dtype policy float32, no logging filter or handler added, matplotlib's backend
    not chosen. One process for all five packages: each check compares the state before the
    first import with the state after the last, so a change by any module shows."""
    ours = _probe("package", "sa_conv", "trainers", "export", "programs", "benchmarks")
    theirs = _probe("modules", *ours["third_party"])
    assert {"keras", "numpy"} <= set(ours["third_party"])  # the probe saw the imports
    assert _changed(ours) == _changed(theirs)
    assert ours["dup2_targets"] == [] and ours["after"]["stderr"] == ours["before"]["stderr"]
    assert ours["after"]["policy"] == "float32"
    for key in ("tf_filters", "root_handlers", "backend"):
        assert ours["after"][key] == theirs["after"][key], key


def test_import_probe_sees_what_the_old_package_init_did(tmp_path):
    """The probe is not blind: a package that sets the oneDNN variable and redirects standard
    error on import (as ``trainers/__init__.py`` once did) is caught."""
    package = tmp_path / "noisy"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import os\nos.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '1')\n"
        "saved = os.dup(2)\nos.dup2(os.open(os.devnull, os.O_WRONLY), 2)\nos.dup2(saved, 2)\n")
    probe = _probe("package", "noisy", PYTHONPATH=f"{tmp_path}:{PROJECT_ROOT}")
    assert _changed(probe) == {"TF_ENABLE_ONEDNN_OPTS": "1"}
    assert probe["dup2_targets"] == [2, 2]


# ------------------------------------------------------------------------------ configure


@pytest.mark.parametrize("argv,environ,machine,expected", [
    ([], {}, "x86_64", {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "1"}),
    ([], {}, "AMD64", {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "1"}),
    ([], {}, "aarch64", {"TF_CPP_MIN_LOG_LEVEL": "2"}),  # TensorFlow's own choice there
    (["--verbosity=1"], {}, "x86_64", {"TF_ENABLE_ONEDNN_OPTS": "1"}),
    (["-v", "2"], {}, "x86_64", {"TF_ENABLE_ONEDNN_OPTS": "1"}),
    (["--verbosity=0"], {}, "x86_64", {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "1"}),
    ([], {"TF_ENABLE_ONEDNN_OPTS": "0"}, "x86_64", {"TF_CPP_MIN_LOG_LEVEL": "2"}),  # the user's setting wins
    ([], {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_ENABLE_ONEDNN_OPTS": "1"}, "x86_64", {}),
])
def test_program_environment(argv, environ, machine, expected):
    assert process.program_environment(argv, environ, machine) == expected


_CONFIGURE = """
import json, logging, os, sys
from trainers import process
first = process.configure(sys.argv[1:])
again = process.configure([])
import tensorflow as tf
from sa_conv.transformer import SEED_WATCH_FILTER
print(json.dumps({"first": first, "same": first is again, "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                  "log_level": os.environ.get("TF_CPP_MIN_LOG_LEVEL"),
                  "filtered": SEED_WATCH_FILTER in logging.getLogger("tensorflow").filters,
                  "record": process.describe("float32")}))
"""


@pytest.mark.parametrize("onednn", [None, "0", "1"])
def test_configure_sets_the_program_defaults_once_and_records_them(onednn):
    env = dict(ENV, **({} if onednn is None else {"TF_ENABLE_ONEDNN_OPTS": onednn}))
    proc = subprocess.run([sys.executable, "-c", _CONFIGURE], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    x86 = out["record"]["cpu"]["machine"].lower() in ("x86_64", "amd64")
    expected = onednn if onednn is not None else ("1" if x86 else None)
    assert out["onednn"] == expected and out["log_level"] == "2"
    assert out["same"] and out["filtered"]
    assert out["first"]["environment_set"] == {"TF_CPP_MIN_LOG_LEVEL": "2",
                                               **({"TF_ENABLE_ONEDNN_OPTS": "1"} if expected == "1" and onednn is None
                                                  else {})}
    record = out["record"]
    assert record["configured_by_program"] and record["precision"] == "float32"
    assert record["environment"].get("TF_ENABLE_ONEDNN_OPTS") == expected
    if expected is not None:  # an explicit setting: TensorFlow follows it on any CPU
        assert record["onednn"]["on"] is (expected == "1")
        assert record["onednn"]["why"].endswith("this program (on x86-64)" if onednn is None else "the user")


def test_configure_after_tensorflow_loaded_sets_no_environment():
    code = ("import os, json, tensorflow\nfrom trainers import process\n"
            "print(json.dumps([process.configure([]), os.environ.get('TF_ENABLE_ONEDNN_OPTS')]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    configured, onednn = json.loads(proc.stdout.strip().splitlines()[-1])
    assert configured == {"environment_set": {}, "tensorflow_loaded_before": True} and onednn is None


# ------------------------------------------------------------------------------ the record

X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8
"""
AVX2_CPUINFO = "model name\t: AMD EPYC 7B12\nflags\t\t: fpu sse4_2 avx avx2 fma f16c\n"
ARM_CPUINFO = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd asimddp sve sve2 bf16 i8mm\nCPU part\t: 0xd4f\n"


def test_cpu_info_reads_model_and_extensions():
    assert process.cpu_info(X86_CPUINFO, "x86_64") == {
        "machine": "x86_64", "model": "Intel(R) Xeon(R) Platinum 8480C",
        "extensions": ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                       "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"]}
    assert process.cpu_info(AVX2_CPUINFO, "x86_64")["extensions"] == ["sse4_2", "avx", "avx2", "fma", "f16c"]
    arm = process.cpu_info(ARM_CPUINFO, "aarch64")
    assert arm["model"] == "0xd4f" and arm["extensions"] == ["asimd", "asimddp", "sve", "sve2", "bf16", "i8mm"]
    assert process.cpu_info("", "riscv64")["extensions"] == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TensorFlow's default rule is Linux's")
@pytest.mark.parametrize("cpuinfo,machine,environ,on,why", [
    (X86_CPUINFO, "x86_64", {}, True, "default, on with avx512_vnni, avx512_bf16, amx_tile"),
    (AVX2_CPUINFO, "x86_64", {}, False, "default, off without"),
    (ARM_CPUINFO, "aarch64", {}, False, "default, off without"),
    (AVX2_CPUINFO, "x86_64", {"TF_ENABLE_ONEDNN_OPTS": "1"}, True, "=1 set by the user"),
    (X86_CPUINFO, "x86_64", {"TF_ENABLE_ONEDNN_OPTS": "0"}, False, "=0 set by the user"),
    (X86_CPUINFO, "x86_64", {"TF_ENABLE_ONEDNN_OPTS": ""}, True, "default"),
])
def test_onednn_choice_from_fed_cpu_flags(cpuinfo, machine, environ, on, why):
    got_on, got_why = process.onednn_choice(environ, process.cpu_info(cpuinfo, machine), None)
    assert got_on is on and why in got_why


def test_onednn_choice_names_the_program_when_it_set_the_variable():
    configured = {"environment_set": {"TF_ENABLE_ONEDNN_OPTS": "1"}}
    on, why = process.onednn_choice({"TF_ENABLE_ONEDNN_OPTS": "1"}, process.cpu_info(AVX2_CPUINFO, "x86_64"),
                                    configured)
    assert on and why == "TF_ENABLE_ONEDNN_OPTS=1 set by this program (on x86-64)"


def test_child_environment_leaves_out_what_configure_set(monkeypatch):
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    monkeypatch.setenv("SA_CONV_PROBE", "kept")
    child = process.child_environment({"environment_set": {"TF_ENABLE_ONEDNN_OPTS": "1"}})
    assert "TF_ENABLE_ONEDNN_OPTS" not in child and child["SA_CONV_PROBE"] == "kept"


# ------------------------------------------------------------------------------ filters, allocator


def _record(message):
    return logging.LogRecord("tensorflow", logging.WARNING, __file__, 1, message, None, None)


def test_seed_watch_filter_drops_only_the_integer_seed_warning():
    assert SEED_WATCH_FILTER.filter(_record(SeedWatchFilter.MESSAGE + "; got tf.int32")) is False
    assert SEED_WATCH_FILTER.filter(_record("Some other warning")) is True


def test_keep_freed_memory_is_set_once_per_process():
    code = ("import json\nfrom trainers import process, memory\ncalls = []\n"
            "memory.keep_freed_memory = lambda: calls.append(1) or True\n"
            "print(json.dumps([process.keep_freed_memory(True), process.keep_freed_memory(False), "
            "process.keep_freed_memory(True), len(calls), process.describe()['allocator']]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, True, True, 1,
                                                                 {"keep_freed_memory": True, "applied": True}]


@pytest.mark.slow
def test_a_benchmark_records_the_process_it_measured(tmp_path):
    """The throughput benchmark configures its process in ``main`` and writes that record to its
    JSON beside the results; its measuring child configures itself from the user's environment
    (the parent's own settings are not passed down as the user's)."""
    output = tmp_path / "throughput.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--cases=sa_quadratic_small", "--train_steps=1",
                           "--infer_steps=1", f"--output={output}"], cwd=PROJECT_ROOT, env=ENV, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(output.read_text())
    (result,) = report["results"]
    assert result["case"] == "sa_quadratic_small" and result["train_images_per_second"] > 0
    recorded = report["process"]
    assert recorded["configured_by_program"] and recorded["tensorflow"] and recorded["cpu"]["machine"]
    x86 = recorded["cpu"]["machine"].lower() in ("x86_64", "amd64")
    for record in (recorded, result["process"]):
        assert record["environment"].get("TF_ENABLE_ONEDNN_OPTS") == ("1" if x86 else None)
        if x86:
            assert record["onednn"] == {"on": True, "why": "TF_ENABLE_ONEDNN_OPTS=1 set by this program (on x86-64)"}
