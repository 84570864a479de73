"""Structure: the library imports no program, programs import each other only where one composes
another, and a new encoding is one class plus its registration that every consumer picks up."""

import ast
import pathlib
import types

import keras
import numpy as np
import pytest
from keras import ops

import sa_conv
from benchmarks import flops
from sa_conv import plotting
from sa_conv.encodings import base as encodings_base
from tests.conftest import PROJECT_ROOT
from trainers.config import default_jit_compile

PROGRAMS = ("trainers", "export", "programs", "benchmarks")
# `trainers` holds, beside the trainer, what every program shares (data pipeline, image files,
# command-line helpers, atomic files, the memory estimate, process set-up): any program may import
# it. Other imports between programs are entry points composing another, and only these.
SHARED_BY_PROGRAMS = "trainers"
COMPOSES = {"programs/demo.py": {"export"}, "programs/launch.py": {"export"},
            # Serving speed of the export's output; the export's SavedModel against the Keras model.
            "benchmarks/serving.py": {"export"}, "benchmarks/throughput.py": {"export"},
            # The export's TFLite files in two interpreters.
            "benchmarks/tflite_runtimes.py": {"export"},
            # TFLite's matmul peak, measured in the runtime the exported files run in.
            "benchmarks/harness.py": {"export"}}


def _imported_packages(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _sources(package):
    return sorted((PROJECT_ROOT / package).rglob("*.py"))


def test_the_library_imports_no_program():
    offenders = {str(p.relative_to(PROJECT_ROOT)): sorted(_imported_packages(p) & set(PROGRAMS))
                 for p in _sources("sa_conv")}
    assert {k: v for k, v in offenders.items() if v} == {}
    assert len(offenders) >= 15  # the walk really read the library


def test_programs_import_each_other_only_to_compose():
    found = {}
    for package in PROGRAMS:
        for path in _sources(package):
            rel = str(path.relative_to(PROJECT_ROOT))
            others = (_imported_packages(path) & set(PROGRAMS)) - {package, SHARED_BY_PROGRAMS}
            if others - COMPOSES.get(rel, set()):
                found[rel] = sorted(others)
    assert found == {}


def test_reference_knowledge_has_one_home_below_the_library():
    """`epfml_reference` (what sa-conv knows of the reference) imports only the standard library,
    so the reference side of a benchmark loads neither Keras nor TensorFlow; nothing runs a tool
    with ``runpy`` to borrow its constants; and no other module of the library, programs,
    benchmarks or tools writes the reference's normalization constants or its encoding flags."""
    import subprocess
    import sys

    path = PROJECT_ROOT / "epfml_reference.py"
    assert _imported_packages(path) <= {"__future__"}
    probe = ("import sys, epfml_reference; "
             "print(sorted(m for m in ('keras', 'tensorflow', 'numpy', 'torch', 'sa_conv') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
    paths = [p for tree in SOURCE_TREES for p in _sources(tree)]
    runs_a_tool = [str(p.relative_to(PROJECT_ROOT)) for p in paths if "runpy" in _imported_packages(p)]
    assert runs_a_tool == []
    constants = {0.2023, 0.1994, 0.4914, 0.4822}
    flags = {"use_attention_data", "attention_isotropic_gaussian"}
    copies = {}
    for p in paths:  # tests may pin the values; code takes them from epfml_reference
        if p.is_relative_to(PROJECT_ROOT / "tests"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            found = (isinstance(node, ast.Constant) and node.value in constants and not isinstance(node.value, bool)) \
                or (isinstance(node, ast.keyword) and node.arg in flags)
            if found:
                copies.setdefault(str(p.relative_to(PROJECT_ROOT)), node.lineno)
    assert copies == {}


def test_import_reader_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\n\ndef f():\n    from trainers import train\n    import export.export\n")
    assert _imported_packages(source) == {"os", "trainers", "export"}


# ------------------------------------------------------------------ the encoding interface


@pytest.fixture
def row_only_encoding():
    """A new encoding, written as a user would: one class and its registration. Position only,
    separable (a learned logit per head and row offset, nothing per column)."""

    @sa_conv.register_encoding("test_rows")
    class RowOffsetEncoding(sa_conv.RelativeEncoding):
        def __init__(self, num_heads, max_grid_size, **kwargs):
            super().__init__(**kwargs)
            self.num_heads, self.max_grid_size = num_heads, max_grid_size

        @classmethod
        def from_attention(cls, attention, input_dim):
            return cls(attention.num_heads, attention.max_grid_size, name="position_encoding")

        @classmethod
        def is_separable(cls):
            return True

        def build(self, input_shape=None):
            self.table = self.add_weight(name="table", shape=(2 * self.max_grid_size - 1, self.num_heads),
                                         initializer="random_normal", autocast=False)

        def factor_logits(self, height, width):
            idx = encodings_base.relative_indices(height, self.max_grid_size)
            row = ops.transpose(ops.take(self.table, idx, axis=0), (2, 0, 1))
            return row, ops.zeros((self.num_heads, width, width))

    yield RowOffsetEncoding
    sa_conv.encodings.unregister_encoding("test_rows")


def test_a_registered_encoding_reaches_every_consumer(row_only_encoding, tmp_path):
    assert "test_rows" in sa_conv.ENCODINGS
    config = sa_conv.get_config("sa_quadratic_small", encoding="test_rows", num_layers=1, hidden_size=16)
    model = sa_conv.build_model(config)
    layer = sa_conv.attention_blocks(model)[0].attention
    assert isinstance(layer.position_encoding, row_only_encoding)
    # The fast path asks the encoding: separable, so it runs at 16x16 and equals the dense path.
    assert layer.uses_fast_path(training=False, grid=(16, 16))
    x = np.random.default_rng(0).normal(size=(2, 16, 16, 16)).astype(np.float32)
    dense = sa_conv.MultiHeadSelfAttention2D(9, encoding="test_rows", fast_position_attention=False)
    dense.build(x.shape)
    dense.set_weights(layer.get_weights())
    np.testing.assert_allclose(ops.convert_to_numpy(layer(x)), ops.convert_to_numpy(dense(x)), atol=2e-5)
    # FLOPs count the separable aggregation; XLA stays off (position only); no centers to plot.
    parts = flops.attention_layer_flops(config, fast=True)
    assert parts["aggregation"] == 2 * 9 * 256 * 32 * 16 and "logits" not in parts
    assert default_jit_compile(config, 100, 0.0) is False
    assert plotting.has_centers(model) is False
    # Saved and reloaded like the built-in encodings.
    path = tmp_path / "test_rows.keras"
    model.save(path)
    images = np.random.default_rng(1).integers(0, 256, size=(2, 32, 32, 3)).astype(np.uint8)
    np.testing.assert_allclose(ops.convert_to_numpy(keras.models.load_model(path)(images)),
                               ops.convert_to_numpy(model(images)), atol=1e-6)
    # Served from its probabilities (the position-only serving form), on the separable path at 16x16.
    frozen = sa_conv.freeze_for_inference(model)
    served = sa_conv.attention_blocks(frozen)[0].attention
    assert served.encoding == "frozen:test_rows" and served.position_encoding.factored
    np.testing.assert_allclose(ops.convert_to_numpy(frozen(images)), ops.convert_to_numpy(model(images)), atol=1e-5)


@pytest.mark.parametrize("name", list(sa_conv.ENCODINGS))
def test_every_encoding_has_a_serving_form_or_is_served_as_trained(name):
    """An encoding's serving form is registered (`FROZEN_FORMS`) or None (a copy of the trained
    layer serves); the frozen spec keeps the trained encoding's position-only and separable traits."""
    spec = sa_conv.ENCODINGS[name]
    if spec.serving_form is None:
        with pytest.raises(ValueError, match="served as trained"):
            sa_conv.get_encoding(f"frozen:{name}")
        return
    frozen = sa_conv.get_encoding(f"frozen:{name}")
    assert frozen.cls is sa_conv.encodings.FROZEN_FORMS[spec.serving_form] and frozen.cls.serves_only
    assert (frozen.position_only, frozen.separable) == (spec.position_only, spec.separable and spec.position_only)
    assert frozen.name not in sa_conv.ENCODINGS  # a serving form is no choice for training


def test_registry_answers_for_the_built_in_encodings():
    traits = {name: (spec.position_only, spec.separable) for name, spec in sa_conv.ENCODINGS.items()}
    assert traits == {"quadratic": (True, True), "quadratic_full": (True, False),
                      "learned": (True, True), "content_with_relative_keys": (False, False),
                      "content_plus_learned_bias": (False, False), "sinusoidal": (True, True), "mlp": (True, False),
                      "gated": (False, False)}
    assert [default_jit_compile(sa_conv.get_config("sa_quadratic", encoding=n), 100, 4.0) for n in traits] == [
        False, False, False, True, True, False, False, True]
    assert default_jit_compile(sa_conv.get_config("resnet18"), 100, 0.0) is False


def test_registry_errors():
    with pytest.raises(ValueError, match="Unknown encoding 'nope'; choose one of quadratic, quadratic_full"):
        sa_conv.get_encoding("nope")
    with pytest.raises(TypeError, match="not a RelativeEncoding"):
        sa_conv.register_encoding("bad")(int)
    with pytest.raises(ValueError, match="already registered"):
        sa_conv.register_encoding("quadratic")(sa_conv.LearnedRelativeEncoding)
    with pytest.raises(ValueError, match="Unknown encoding"):
        sa_conv.MultiHeadSelfAttention2D(4, encoding="nope")


def test_conversion_goes_through_public_accessors():
    layer = sa_conv.MultiHeadSelfAttention2D(4, output_dim=3)
    layer.build((None, 5, 5, 2))
    kernel = np.arange(4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3)
    layer.set_value_map(kernel, np.ones(3, np.float32))
    np.testing.assert_array_equal(ops.convert_to_numpy(layer.value_kernel_per_head()), kernel)
    encoding = layer.position_encoding
    encoding.set_alphas([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(ops.convert_to_numpy(encoding.alphas()), [1, 2, 3, 4], rtol=1e-6)
    with pytest.raises(ValueError, match="shape \\(4, 2, 3\\)"):
        layer.set_value_map(np.zeros((2, 2, 3)))
    with pytest.raises(ValueError, match="positive"):
        encoding.set_alphas(0.0)


# ------------------------------------------------------------------ programs configure their process

PROGRAM_MODULES = ("trainers/train.py", "trainers/tune.py", "programs/visualize.py", "programs/demo.py",
                   "export/export.py", "programs/import_reference.py")


def _statements_before_configure(path):
    body = ast.parse(path.read_text()).body
    calls = [i for i, node in enumerate(body) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
             and ast.unparse(node.value) == "process.configure_if_main(__name__)"]
    return body[:calls[0]] if calls else None


@pytest.mark.parametrize("module", PROGRAM_MODULES)
def test_program_modules_configure_the_process_before_their_imports(module):
    """Run as ``python -m``, a program configures its process (`trainers.process`) before it
    imports anything that loads TensorFlow: only the docstring, ``from __future__``, ``os`` and
    ``sys`` (a script's path fix) and the import of `trainers.process` come first. Imported as a
    module, that call does nothing."""
    before = _statements_before_configure(PROJECT_ROOT / module)
    assert before is not None, f"{module} does not call process.configure_if_main(__name__)"
    imports = [ast.unparse(n) for n in before if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert imports[-1] == "from trainers import process" and all(
        i in ("from trainers import process", "import os", "import sys") or i.startswith("from __future__")
        for i in imports), imports
    assert __import__("trainers.process").process.configure_if_main("trainers.train") is None


@pytest.mark.parametrize("path", sorted(p.name for p in (PROJECT_ROOT / "benchmarks").glob("*.py")
                                        if "if __name__ == \"__main__\"" in p.read_text()))
def test_benchmarks_configure_the_process_in_main_before_tensorflow_loads(path):
    """A benchmark's module-level imports load neither TensorFlow nor Keras (so its ``main`` can
    configure the process first), and ``main`` parses its command line with `benchmarks.harness.parse`,
    which calls `trainers.process.configure` (but for the reference's side)."""
    source = (PROJECT_ROOT / "benchmarks" / path).read_text()
    tree = ast.parse(source)
    top = {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    top |= {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert not top & {"tensorflow", "keras", "sa_conv", "trainers", "export"}, top
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    # In main itself, not only in a child's code: `benchmarks.harness.parse` configures the process.
    assert "harness.parse(parser" in ast.unparse(main)


def test_console_scripts_configure_the_process_before_importing_their_program(monkeypatch):
    """Each console script (programs/launch.py) calls ``process.configure()`` first, then imports
    its program (an import statement after it, visible to this test and to Bazel) and runs it."""
    import importlib
    import re
    import sys

    from programs import launch
    from trainers import process

    setup = (PROJECT_ROOT / "setup.py").read_text()
    scripts = dict(re.findall(r'"(sa-conv-[a-z-]+)=([\w.:]+)"', setup))
    programs = {"sa-conv-train": "trainers.train", "sa-conv-tune": "trainers.tune", "sa-conv-study": "trainers.study",
                "sa-conv-export": "export.export",
                "sa-conv-visualize": "programs.visualize", "sa-conv-import-reference": "programs.import_reference"}
    assert set(scripts) == set(programs)
    seen = []
    for name in programs.values():
        package, module = name.rsplit(".", 1)
        fake = types.SimpleNamespace(run=lambda name=name: seen.append(f"run {name}"))
        monkeypatch.setitem(sys.modules, name, fake)
        monkeypatch.setattr(importlib.import_module(package), module, fake, raising=False)
    monkeypatch.setattr(process, "configure", lambda: seen.append("configure"))
    tree = ast.parse((PROJECT_ROOT / "programs" / "launch.py").read_text())
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    for script, target in scripts.items():
        module, function = target.split(":")
        assert module == "programs.launch"
        body = functions[function].body
        assert ast.unparse(body[0]) == "process.configure()" and isinstance(body[1], ast.ImportFrom), script
        seen.clear()
        getattr(launch, function)()
        assert seen == ["configure", f"run {programs[script]}"], script


# ------------------------------------------------------------------ no private access across modules

SOURCE_TREES = ("sa_conv", "trainers", "export", "programs", "benchmarks", "tests", "tools", "examples")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_definitions(tree) -> set[str]:
    """The private names a module defines: its functions, classes, module-level variables and
    the attributes it assigns (``self._x = ...``, ``obj._x = ...``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
                    elif isinstance(sub, ast.Attribute):
                        names.add(sub.attr)
    return {n for n in names if _private(n)}


_BY_NAME = {"setattr", "getattr", "hasattr", "delattr", "object"}  # object: mock.patch.object


def _private_uses(tree) -> list[tuple[int, str]]:
    """``obj._x`` on anything but ``self``/``cls``, ``from m import _x``, and the name as a string
    (``getattr(m, "_x")``, ``monkeypatch.setattr(m, "_x", ...)``, ``mock.patch.object(m, "_x")``):
    (line, name)."""
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                uses.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            name = node.args[1]
            if (called in _BY_NAME and isinstance(name, ast.Constant) and isinstance(name.value, str)
                    and _private(name.value)
                    and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))):
                uses.append((node.lineno, name.value))
        elif isinstance(node, ast.ImportFrom):
            uses += [(node.lineno, alias.name) for alias in node.names if _private(alias.name)]
    return sorted(uses, key=lambda use: use[0])


def private_access_across_modules(paths) -> dict[str, list[str]]:
    """Where a module uses a private name that another of ``paths`` defines and it does not."""
    trees = {path: ast.parse(pathlib.Path(path).read_text(), filename=str(path)) for path in paths}
    defined = {path: _private_definitions(tree) for path, tree in trees.items()}
    found = {}
    for path, tree in trees.items():
        elsewhere = set().union(*(names for other, names in defined.items() if other != path))
        hits = [f"line {line}: {name}" for line, name in _private_uses(tree)
                if name in elsewhere and name not in defined[path]]
        if hits:
            found[str(path)] = hits
    return found


def test_no_module_touches_another_modules_private_names():
    """Modules (tests and benchmarks included) use each other's public names only: no
    ``trainer._restore()``, no ``from trainers.data import _host_reachable``."""
    paths = [p for tree in SOURCE_TREES for p in _sources(tree)] + [PROJECT_ROOT / "epfml_reference.py"]
    assert len(paths) > 80
    found = private_access_across_modules(paths)
    assert {str(pathlib.Path(k).relative_to(PROJECT_ROOT)): v for k, v in found.items()} == {}


def test_private_access_check_catches_it(tmp_path):
    (tmp_path / "lib.py").write_text("def _helper():\n    pass\n\nclass T:\n    def _step(self):\n"
                                     "        self._state = 1\n")
    (tmp_path / "user.py").write_text("from lib import _helper\nimport lib\n\ndef f(t):\n    t._step()\n"
                                      "    return t._state, lib._helper, t._own\n\ndef _own():\n    pass\n"
                                      "\ndef g(monkeypatch):\n    monkeypatch.setattr(lib, '_helper', None)\n")
    found = private_access_across_modules(sorted(tmp_path.glob("*.py")))
    assert found == {str(tmp_path / "user.py"): ["line 1: _helper", "line 5: _step", "line 6: _state",
                                                 "line 6: _helper", "line 12: _helper"]}


DISTRIBUTION_NAMES = {"strategy", "distribute", "experimental_distribute_dataset", "num_replicas_in_sync"}


def distribution_in_code(source: str) -> list[str]:
    """The names of `DISTRIBUTION_NAMES` that ``source``'s code (not its docstrings or comments)
    uses, with their lines: what a single-replica Task must not touch."""
    found = []
    for node in ast.walk(ast.parse(source)):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else \
            node.arg if isinstance(node, ast.arg) else None
        if name in DISTRIBUTION_NAMES or (isinstance(node, ast.alias) and "distribute" in node.name):
            found.append((node.lineno, f"line {node.lineno}: {name or node.name}"))
    return [text for _, text in sorted(found)]


def test_the_task_is_a_single_replica_view_and_the_trainer_owns_the_strategy():
    """As in TF Model Garden: `trainers.task` never names a strategy (no ``strategy.run``,
    ``reduce`` or distributed datasets); the Trainer builds and runs its steps on the replicas."""
    assert distribution_in_code((PROJECT_ROOT / "trainers" / "task.py").read_text()) == []
    trainer = (PROJECT_ROOT / "trainers" / "train.py").read_text()
    assert "distribute.replicated_train_steps(" in trainer and "self.strategy.scope()" in trainer


def test_the_single_replica_check_catches_a_strategy():
    source = ('"""Mentions strategy.run in prose."""\nfrom trainers import distribute\n\n'
              'def step(self, fn):\n    # strategy in a comment\n    return self.strategy.run(fn)\n\n'
              'def build(strategy=None):\n    return tf.distribute.get_strategy()\n')
    assert distribution_in_code(source) == ["line 2: distribute", "line 6: strategy", "line 8: strategy",
                                            "line 9: distribute"]


def library_import_graph(root: pathlib.Path, package: str = "sa_conv") -> dict:
    """``{module: {modules of the package it imports}}``, imports inside functions included, for
    every module under ``root`` (the package directory); ``from package import name`` counts
    when ``name`` is a module."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                           for alias in node.names]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def import_cycles(graph: dict) -> set:
    """The modules of each strongly connected set of more than one module, as frozensets
    (Tarjan's algorithm); a package's ``__init__`` importing its own modules is left out."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), set(), [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w.startswith(v + "."):  # a package importing its submodules
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.add(w)
                if w == v:
                    break
            if len(members) > 1:
                found.add(frozenset(members))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_library_has_no_import_cycle():
    assert import_cycles(library_import_graph(PROJECT_ROOT / "sa_conv")) == set()


def test_the_cycle_check_sees_imports_inside_functions(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg import a\n")
    (package / "a.py").write_text("import numpy\nfrom pkg.sub import c\n")
    (package / "b.py").write_text("def f():\n    from pkg import a\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text("def g():\n    from pkg import b\n")
    graph = library_import_graph(package, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.c"} and graph["pkg.b"] == {"pkg.a"}
    assert import_cycles(graph) == {frozenset({"pkg.a", "pkg.b", "pkg.sub.c"})}


def encoding_class_dispatch(source: str, classes) -> list[str]:
    """The ``isinstance``/``issubclass`` calls of ``source`` whose class argument names one of
    ``classes`` (a bare name or an attribute, as imported), with their lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
            named = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node.args[1])
                     if isinstance(n, (ast.Name, ast.Attribute))}
            found += [f"line {node.lineno}: {name}" for name in sorted(named & set(classes))]
    return found


def _encoding_classes() -> set[str]:
    classes, todo = set(), [encodings_base.RelativeEncoding]
    while todo:
        cls = todo.pop()
        classes.add(cls.__name__)
        todo += cls.__subclasses__()
    return classes


# Theorem 1's converter and the reference importer are about particular encodings: they may name them.
ABOUT_PARTICULAR_ENCODINGS = ("sa_conv/conversion.py", "sa_conv/reference.py")


def test_no_consumer_dispatches_on_an_encoding_class():
    """Serving, the layers, export and the trainers ask an encoding what it does (its traits, its
    serving form, `sa_conv.encodings.base`); none branches on its class."""
    classes = _encoding_classes()
    assert {"GatedPositionalEncoding", "QuadraticEncoding", "FrozenGated", "FrozenProbabilities"} <= classes
    paths = [p for tree in ("sa_conv", "export", "trainers") for p in _sources(tree)
             if "encodings" not in p.relative_to(PROJECT_ROOT).parts
             and str(p.relative_to(PROJECT_ROOT)) not in ABOUT_PARTICULAR_ENCODINGS]
    assert len(paths) > 40
    found = {str(p.relative_to(PROJECT_ROOT)): hits for p in paths
             if (hits := encoding_class_dispatch(p.read_text(), classes))}
    assert found == {}


def test_the_dispatch_check_catches_a_branch_on_an_encoding_class():
    source = ('"""isinstance(x, GatedPositionalEncoding) in prose."""\nfrom sa_conv.encodings import gated\n\n'
              'def form(enc, layer):\n    if isinstance(enc, gated.GatedPositionalEncoding):\n        return 1\n'
              '    if isinstance(layer, (keras.layers.Dense, QuadraticEncoding)):\n        return 2\n'
              '    return isinstance(enc, dict)\n')
    assert encoding_class_dispatch(source, _encoding_classes()) == ["line 5: GatedPositionalEncoding",
                                                                     "line 7: QuadraticEncoding"]
