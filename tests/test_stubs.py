"""The typed stubs (``.pyi``) of the compiled modules say what the modules really hold: every public function with
its parameters (names, order, defaults), every class with its constructor, methods and attributes, every
constant; and the package is marked as typed (``py.typed``)."""
import ast
import importlib
import importlib.machinery
import inspect
import re
from pathlib import Path

import pytest

import emfast
from emfast import _core

CORE = Path(_core.__file__).parent
COMPILED = sorted({path.name.split(".")[0] for path in CORE.iterdir()
                   if any(path.name.endswith(suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES)})
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def stub_of(name):
    path = CORE / f"{name}.pyi"
    assert path.is_file(), f"emfast._core.{name} is compiled but has no stub {path.name}"
    return {node.name if not isinstance(node, ast.AnnAssign) else node.target.id: node
            for node in ast.parse(path.read_text()).body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AnnAssign))}


def stub_parameters(function: ast.FunctionDef, skip_self=False):
    """(name, default or inspect.Parameter.empty) of each parameter of a stub's ``def``, in order."""
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args]
    defaults = [inspect.Parameter.empty] * (len(names) - len(arguments.defaults)) + \
        [ast.literal_eval(d) for d in arguments.defaults]
    pairs = list(zip(names, defaults))
    pairs += [(a.arg, inspect.Parameter.empty if d is None else ast.literal_eval(d))
              for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults)]
    return pairs[1:] if skip_self else pairs


def compiled_parameters(function, skip_self=False):
    pairs = [(p.name, p.default) for p in inspect.signature(function).parameters.values()]
    return pairs[1:] if skip_self else pairs


def constructor_parameters(cls):
    """(name, default) of a compiled class's constructor, from the signature Cython writes into its docstring
    (``embedsignature``): ``Name(int a, b=1, ...)``."""
    header = cls.__doc__.splitlines()[0]
    match = re.fullmatch(rf"{cls.__name__}\((.*)\)", header)
    assert match, f"{cls.__name__}: no signature line in its docstring: {header!r}"
    pairs = []
    for item in filter(None, (part.strip() for part in match.group(1).split(","))):
        declaration, _, default = item.partition("=")
        pairs.append((declaration.split()[-1], ast.literal_eval(default) if default else inspect.Parameter.empty))
    return pairs


def test_every_compiled_module_is_found():
    assert {"blend", "common", "gather", "intensity", "random", "rescale", "sampling", "targets", "warp"} <= set(COMPILED)


@pytest.mark.parametrize("name", COMPILED)
def test_stub_matches_the_compiled_module(name):
    module = importlib.import_module(f"emfast._core.{name}")
    stub = stub_of(name)
    public = {key: value for key, value in vars(module).items()
              if not key.startswith("_") and not inspect.ismodule(value)}
    assert set(stub) == set(public), f"{name}.pyi: missing {set(public) - set(stub)}, stale {set(stub) - set(public)}"
    for key, value in public.items():
        entry = stub[key]
        if isinstance(value, type):
            assert isinstance(entry, ast.ClassDef), f"{name}.{key} is a class"
            members = {node.name if isinstance(node, ast.FunctionDef) else node.target.id: node for node in entry.body
                       if isinstance(node, (ast.FunctionDef, ast.AnnAssign))}
            assert stub_parameters(members["__init__"], skip_self=True) == constructor_parameters(value), \
                f"{name}.{key}.__init__"
            for member in (m for m in dir(value) if not m.startswith("_")):
                assert member in members, f"{name}.pyi: {key}.{member} is missing"
                attribute = inspect.getattr_static(value, member)
                if callable(attribute):
                    assert stub_parameters(members[member], skip_self=True) == \
                        compiled_parameters(getattr(value, member), skip_self=True), f"{name}.{key}.{member}"
        elif callable(value):
            assert isinstance(entry, ast.FunctionDef), f"{name}.{key} is a function"
            assert stub_parameters(entry) == compiled_parameters(value), f"{name}.{key}"
        else:
            assert isinstance(entry, ast.AnnAssign), f"{name}.{key} is a constant"


def test_the_package_is_marked_typed():
    assert (Path(emfast.__file__).parent / "py.typed").is_file()


def test_stubs_and_marker_are_package_data():
    if not PYPROJECT.exists():
        pytest.skip("pyproject.toml is not beside the tests (an installed wheel's tests run without it)")
    import tomllib

    data = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-data"]["emfast"]
    assert "py.typed" in data and "_core/*.pyi" in data
