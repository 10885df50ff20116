"""Every public function and class of approxlab has a NumPy-style ``Examples`` section that runs as a
doctest (``--doctest-modules`` in ``pyproject.toml`` runs them with the tests).

Public: each name in the ``__all__`` of ``approxlab`` and of every module and package under it whose
dotted path has no component starting with ``_``, except the command-line layer (``approxlab.cli``,
``approxlab.studies``: documented by ``approxlab <study> --help``). A name is checked once, in the module
that defines it. A registered method (a :class:`~approxlab.methods.MethodSpec`) is checked through
its function, which its module hands to doctest in ``__test__``.
"""

import doctest
import functools
import importlib
import inspect
import pkgutil
import re

import approxlab
from approxlab.methods import MethodSpec

COMMAND_LINE = ("approxlab.cli", "approxlab.studies", "approxlab.__main__")

# Public names that have no Examples section yet, by defining module. The list only shrinks: a name
# that gains its examples must leave it (the test says so).
NO_EXAMPLES_YET = {
    # -- the numerical core ---------------------------------------------------------------------
    # -- data, statistics and tools -------------------------------------------------------------
}

_EXAMPLES = re.compile(r"^Examples\n-{8,}\n(?P<body>.*?)(?=^\S[^\n]*\n-{3,}\n|\Z)", re.M | re.S)


def public_modules():
    """The public modules of approxlab (the command-line layer excluded), imported."""
    names = ["approxlab"] + [info.name for info in pkgutil.walk_packages(approxlab.__path__, "approxlab.")]
    return [importlib.import_module(name) for name in names
            if not any(part.startswith("_") for part in name.split(".")[1:]) and not name.startswith(COMMAND_LINE)]


def documented(obj):
    """The object whose docstring documents ``obj`` (a method's function for a MethodSpec), or None
    for a public name that is not a function or class (a constant, a module)."""
    if isinstance(obj, MethodSpec):
        return obj.function
    if inspect.isclass(obj) or inspect.isroutine(inspect.unwrap(obj)) or isinstance(obj, functools.partial):
        return obj
    return None


def public_objects():
    """``{(defining module, qualified name): object}`` over every public module's ``__all__``."""
    found = {}
    for module in public_modules():
        names = getattr(module, "__all__", None)
        assert names is not None, f"{module.__name__} has no __all__: its public names are not declared"
        for name in names:
            obj = documented(getattr(module, name))
            if obj is None or not getattr(obj, "__module__", "").startswith("approxlab"):
                continue
            target = inspect.unwrap(obj)
            found[(obj.__module__, getattr(target, "__qualname__", name))] = obj
    return found


def doctest_names(module_name):
    """The names of the doctests that ``--doctest-modules`` collects from a module (with examples)."""
    module = importlib.import_module(module_name)
    return {test.name for test in doctest.DocTestFinder().find(module, module_name) if test.examples}


def missing_examples():
    """``{(module, name): why}`` for every public object without a collected Examples doctest."""
    missing, collected = {}, {}
    for (module, name), obj in public_objects().items():
        match = _EXAMPLES.search(inspect.getdoc(obj) or "")
        if match is None:
            missing[module, name] = "no Examples section"
        elif ">>>" not in match["body"]:
            missing[module, name] = "an Examples section without a >>> line"
        else:
            names = collected.setdefault(module, doctest_names(module))
            if not {f"{module}.{name}", f"{module}.__test__.{name}"} & names:
                missing[module, name] = "examples that doctest does not collect (a method: add it to __test__)"
    return missing


def test_every_public_name_has_examples():
    missing = missing_examples()
    unexpected = sorted(f"{module}.{name}: {why}" for (module, name), why in missing.items()
                        if name not in NO_EXAMPLES_YET.get(module, ()))
    assert not unexpected, "public names without a doctested Examples section:\n" + "\n".join(unexpected)


def test_the_list_of_names_without_examples_only_shrinks():
    missing = missing_examples()
    stale = sorted(f"{module}.{name}" for module, names in NO_EXAMPLES_YET.items() for name in names
                   if (module, name) not in missing)
    assert not stale, "these names have examples now (or are gone): remove them from NO_EXAMPLES_YET:\n" + \
        "\n".join(stale)
