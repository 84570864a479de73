"""Shared fixtures: the real CIFAR-10 subset in ../shared (when present) and tiny datasets
that the tests write themselves in the official python format."""

import os
import pathlib
import selectors
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Exports in tests measure batch 1 only for the batching parameters, not a minute of doublings
# (export/tf_serving.py); the tests about the batching set their own budget.
os.environ.setdefault("SA_CONV_BATCHING_SECONDS", "0")
# Under xdist each worker's TensorFlow or PyTorch, and the programs its tests start, would run one
# op's kernels on a thread per core: two workers on two cores then keep twice as many threads busy
# as there are cores. Each worker gets its share of the cores instead, unless the user chose.
# (XLA's CPU client is left alone: one thread per op made the JAX pass slower.)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _SHARE = str(max(1, len(os.sched_getaffinity(0)) // _WORKERS))
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", _SHARE)
    os.environ.setdefault("OMP_NUM_THREADS", _SHARE)

PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[1]
CIFAR10_MINI = pathlib.Path(
    os.environ.get("SA_CONV_CIFAR10_MINI", PROJECT_ROOT.parent / "shared/datasets/cifar10-mini")
)


@pytest.fixture(scope="session")
def cifar10_mini_dir():
    """The real CIFAR-10 subset (4,170 train / 1,000 test images) shipped in ../shared."""
    if not (CIFAR10_MINI / "cifar-10-batches-py" / "data_batch_1").is_file():
        pytest.skip(f"real CIFAR-10 subset not found at {CIFAR10_MINI} (set SA_CONV_CIFAR10_MINI)")
    return str(CIFAR10_MINI)


@pytest.fixture(scope="session")
def tiny_cifar(tmp_path_factory):
    """A small dataset in the official format, written by the test session itself.

    Returns (path to cifar-10-batches-py, the CifarData written).
    """
    from trainers import data

    generated = data.make_synthetic(num_train=250, num_test=50, seed=3)
    directory = tmp_path_factory.mktemp("tiny_cifar")
    return data.write_cifar10_files(str(directory), generated), generated


@pytest.fixture(scope="session")
def real_images(tiny_cifar):
    """A few real CIFAR-10 images when ../shared is present, else the tiny generated ones."""
    from trainers import data

    if (CIFAR10_MINI / "cifar-10-batches-py" / "test_batch").is_file():
        return data.load_cifar10_files(str(CIFAR10_MINI)).test.images[:16]
    return tiny_cifar[1].test.images[:16]


@pytest.fixture(scope="session", autouse=True)
def _jax_compilation_cache(tmp_path_factory):
    """Under JAX, the programs XLA compiles are kept for the rest of the run, shared by the
    workers: many tests compile the same small layers' ops (the backends' pass took 13% less)."""
    import keras

    if keras.backend.backend() != "jax" or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    import jax

    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root  # shared by the workers
    jax.config.update("jax_compilation_cache_dir", str(root / "jax-compilation-cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(scope="session")
def made_once(tmp_path_factory):
    """``made_once(key, make)``: a directory that ``make(directory)`` filled, made once per test
    run however many xdist workers ask for it (the first to ask makes it under a file lock, the
    others wait and read it): for results that several tests read, such as a paper-size model.
    (``--dist=loadgroup`` would keep such tests on one worker, but does not group under pytest
    9.2: pytest-dev/pytest-xdist#1386.)"""
    import fcntl

    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root  # shared by the workers

    def get(key, make):
        directory = root / f"made-once-{key}"
        with open(root / f"made-once-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (directory / ".done").exists():
                directory.mkdir(exist_ok=True)
                make(directory)
                (directory / ".done").touch()
        return directory

    return get


def gradients(loss_fn, x, variables):
    """Gradients of the scalar ``loss_fn(x)`` with respect to the input ``x`` and ``variables``
    (Keras variables), as numpy arrays, on whichever Keras backend runs. Under JAX the gradient
    is compiled as one program (`jax.jit`), as Keras's JAX trainer runs its steps: op by op, each
    new shape would compile every primitive on its own."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = loss_fn(x)
        return [np.asarray(g) for g in tape.gradient(loss, [x, *variables])]
    if backend == "jax":
        import jax

        values = [v.value for v in variables]
        gx, gv = jax.jit(jax.grad(lambda x, values: _stateless(loss_fn, x, variables, values), argnums=(0, 1)))(x, values)
        return [np.asarray(gx), *map(np.asarray, gv)]
    if backend == "torch":
        import torch

        x = torch.tensor(x, requires_grad=True)
        for v in variables:
            v.value.grad = None
        loss_fn(x).backward()
        return [x.grad.numpy(), *(v.value.grad.numpy() for v in variables)]
    raise NotImplementedError(backend)


def _stateless(loss_fn, x, variables, values):
    import keras

    with keras.StatelessScope(state_mapping=list(zip(variables, values))):
        return loss_fn(x)


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="Only the fast tier: no test marked slow, no paper-size model (tests/tiers.py).")
    parser.addoption("--all", action="store_true",
                     help="Every tier: every preset at paper size too (`make test-all`; tests/tiers.py).")


def pytest_configure(config):
    np.set_printoptions(precision=4, suppress=True)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--all"):
        return
    skipped = ("slow", "paper", "paper_subset") if config.getoption("--fast") else ("paper",)
    deselected = [item for item in items if any(item.get_closest_marker(m) for m in skipped)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


def pytest_sessionfinish(session, exitstatus):
    # A file whose tests are all of another tier runs none (Bazel runs one file per target).
    if not session.config.getoption("--all") and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK


# ------------------------------------------------------------------ processes started by tests


def reserved_port() -> int:
    """A localhost TCP port that the OS chose (bind to port 0), left reserved for the child
    process it is handed to: a connection to it is accepted and closed from its side, which
    keeps the address in TIME_WAIT for a minute. Meanwhile the OS gives the port to no other
    bind (port 0 or not) except one that sets SO_REUSEADDR, as the gRPC servers of TensorFlow
    and keras-tuner do when the children bind it. (SO_REUSEPORT would let the test hold the port
    open, but TensorFlow's gRPC server turns it off.)"""
    with socket.socket() as server, socket.socket() as client:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        client.connect(server.getsockname())
        accepted, _ = server.accept()
        accepted.close()  # the side that closes first holds TIME_WAIT: the server's address
        return server.getsockname()[1]


def chief_and_two_workers(command, env, log_dir, until: str, on_kill=lambda lines: None) -> list[str]:
    """Runs ``command`` (from the project's root) as keras-tuner's chief and its workers ``tuner0`` and ``tuner1`` on
    a `reserved_port`, each logging to ``log_dir/ID.log``. ``tuner1`` is killed with SIGKILL once it prints a line
    with ``until``, ``on_kill`` is called with the lines it printed (then added to its log), and it is started again
    with its id. Every process must exit 0 (else AssertionError with its log's end); returns those lines."""
    port, logs = reserved_port(), {}

    def start(tuner_id, watch=False):
        logs[tuner_id] = pathlib.Path(log_dir) / f"{tuner_id}.log"
        log = open(logs[tuner_id], "a")
        return subprocess.Popen(command, cwd=PROJECT_ROOT, stderr=log, stdout=subprocess.PIPE if watch else log,
                                text=True, env={**env, "KERASTUNER_ORACLE_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1",
                                                "KERASTUNER_ORACLE_PORT": str(port), "KERASTUNER_TUNER_ID": tuner_id})

    chief = start("chief")
    workers = {"tuner0": start("tuner0"), "tuner1": start("tuner1", watch=True)}
    try:
        try:
            lines = read_until(workers["tuner1"], until, timeout=300)
        finally:
            os.kill(workers["tuner1"].pid, signal.SIGKILL)
            workers["tuner1"].wait()
        on_kill(lines)
        with open(logs["tuner1"], "a") as f:
            f.writelines(lines)
        workers["tuner1"] = start("tuner1")
        for name, proc in workers.items():
            assert proc.wait(timeout=600) == 0, logs[name].read_text()[-3000:]
        assert chief.wait(timeout=120) == 0, logs["chief"].read_text()[-3000:]
    finally:
        for proc in (chief, *workers.values()):
            if proc.poll() is None:
                proc.kill()
    return lines


def read_until(proc, text: str, timeout: float) -> list[str]:
    """Reads ``proc``'s standard output (a text pipe; start the child with ``PYTHONUNBUFFERED=1``)
    line by line until a line contains ``text``, and returns the lines read. It waits on the pipe
    itself (no polling): fails if the process ends first or ``timeout`` seconds pass."""
    lines = []
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no line with {text!r} within {timeout}s; read: {lines[-20:]}")
            if not selector.select(remaining):
                continue
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"the process ended (exit {proc.wait()}) before printing {text!r}; read: "
                                     f"{lines[-20:]}")
            lines.append(line)
            if text in line:
                return lines
