"""Bazel's BUILD says what the code does: every target's deps are exactly the first-party
packages its sources import (no missing dep, none unused), every test file has a target, and
every source file belongs to one library. BUILD is Starlark; the subset it uses is Python, so it
is evaluated here with stand-ins for the rules that record the targets."""

import ast
import pathlib

from tests import tiers
from tests.conftest import PROJECT_ROOT

FIRST_PARTY = {"epfml_reference", "sa_conv", "trainers", "export", "programs", "benchmarks", "tools", "tests"}


def read_build(path=PROJECT_ROOT / "BUILD"):
    """``{name: {"kind", "srcs", "deps", ...}}`` of the BUILD file at ``path``."""
    root = path.parent
    targets = {}

    def glob(include, exclude=()):
        found = {str(p.relative_to(root)) for pattern in include for p in root.glob(pattern) if p.is_file()}
        return sorted(found - set(exclude))

    def rule(kind):
        def record(name, srcs=(), deps=(), **kwargs):
            assert name not in targets, f"target {name} defined twice"
            targets[name] = {"kind": kind, "srcs": list(srcs), "deps": [d.lstrip(":") for d in deps], **kwargs}
        return record

    namespace = {"glob": glob, "package": lambda **kwargs: None, "py_library": rule("py_library"),
                 "py_binary": rule("py_binary"), "py_test": rule("py_test")}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102  (our own BUILD file)
    return targets


def imported_packages(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & FIRST_PARTY


def owner_packages(targets):
    """Package (or top-level module) -> the library target whose sources hold it."""
    owners = {}
    for name, target in targets.items():
        if target["kind"] == "py_library":
            for src in target["srcs"]:
                owners.setdefault(pathlib.Path(src).parts[0].removesuffix(".py"), set()).add(name)
    return owners


def dependency_problems(targets, root=PROJECT_ROOT):
    """What differs between each library's and binary's deps and its sources' imports."""
    owners = owner_packages(targets)
    problems = []
    for name, target in targets.items():
        if target["kind"] == "py_test":
            continue
        needed = set()
        if target["kind"] == "py_binary":  # its main is a module of its library, which brings the rest
            needed = set(owners[pathlib.Path(target["main"]).parts[0]])
        else:
            for src in target["srcs"]:
                for package in imported_packages(root / src):
                    # A package split over targets (tools/ and the test support's runner) is
                    # the importer's own when the importer holds part of it.
                    if name not in owners.get(package, ()):
                        needed |= owners.get(package, {f"<no library holds {package}>"})
        missing, unused = needed - set(target["deps"]), set(target["deps"]) - needed
        problems += [f"{name}: missing dep {d}" for d in sorted(missing)]
        problems += [f"{name}: unused dep {d}" for d in sorted(unused)]
    return problems


def test_library_and_binary_deps_are_exactly_their_imports():
    targets = read_build()
    assert {"epfml_reference", "sa_conv", "trainers", "export", "programs", "benchmarks", "tools", "train"} <= set(targets)
    assert dependency_problems(targets) == []


def test_the_dependency_check_finds_a_missing_and_an_unused_dep(tmp_path):
    for package in ("lib", "sa_conv", "trainers", "export"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "m.py").write_text("")
    (tmp_path / "lib" / "m.py").write_text("import sa_conv\nfrom trainers import task\n")
    # trainers/ split over two targets: its own imports need not the other; an outside importer needs both.
    (tmp_path / "trainers" / "m.py").write_text("from trainers import runner\n")
    (tmp_path / "trainers" / "runner.py").write_text("")
    (tmp_path / "BUILD").write_text("".join(f'py_library(name = "{p}", srcs = ["{p}/m.py"])\n'
                                            for p in ("sa_conv", "trainers", "export"))
                                    + 'py_library(name = "support", srcs = ["trainers/runner.py"])\n'
                                    + 'py_library(name = "lib", srcs = glob(["lib/*.py"]), deps = [":sa_conv", ":export"])\n')
    targets = read_build(tmp_path / "BUILD")
    assert dependency_problems(targets, tmp_path) == [
        "lib: missing dep support", "lib: missing dep trainers", "lib: unused dep export"]


def test_every_test_file_has_a_target_whose_deps_cover_its_imports():
    targets = read_build()
    tests = {n: t for n, t in targets.items() if t["kind"] == "py_test"}
    files = {p.stem for p in (PROJECT_ROOT / "tests").glob("test_*.py")}
    assert set(tests) == files
    owners = owner_packages(targets)
    imported = set()
    for name, target in tests.items():
        packages = imported_packages(PROJECT_ROOT / "tests" / f"{name}.py") - {"tests"}
        needed = set().union(*(owners[p] for p in packages)) if packages else set()
        imported |= needed
        assert needed <= set(target["deps"]), name
    # The shared deps of the tests are what the tests import, and their support library.
    (shared,) = {tuple(t["deps"]) for t in tests.values()}
    assert set(shared) == imported | {"test_support"}
    # `make test-kernels` names files that exist.
    assert set(tiers.KERNEL_SENSITIVE) <= files


def test_every_source_file_is_in_exactly_one_library():
    targets = read_build()
    held = [src for t in targets.values() if t["kind"] == "py_library" for src in t["srcs"]]
    assert len(held) == len(set(held))
    sources = {str(p.relative_to(PROJECT_ROOT)) for package in ("sa_conv", "trainers", "export", "programs", "benchmarks")
               for p in (PROJECT_ROOT / package).rglob("*.py")} | {"epfml_reference.py"}
    assert sources <= set(held)
