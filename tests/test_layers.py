"""The layering of approxlab: the import contract in pyproject.toml holds, studies stay on top.

``lint-imports`` (import-linter) checks the contracts written in ``[tool.importlinter]``;
the second test reads every module's imports itself, so that no module outside
``approxlab/studies`` and ``approxlab/cli.py`` imports ``approxlab.studies`` even if the
contract's list of modules falls behind the code.
"""

from __future__ import annotations

import ast
import os
import pathlib
import shutil
import subprocess
import sys

import importlinter  # noqa: F401  (a test dependency: fail loudly when it is missing)

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "approxlab"
ALLOWED_STUDY_IMPORTERS = ("approxlab.studies", "approxlab.cli", "approxlab.__main__")


def test_import_contract_holds():
    executable = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).parent / "lint-imports")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([executable, "--no-cache", "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_modules(path: pathlib.Path):
    """Absolute names of the modules ``path`` imports (relative imports resolved), with line numbers."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            yield module, node.lineno
            for alias in node.names:  # ``from . import studies``
                yield f"{module}.{alias.name}", node.lineno


def test_only_the_cli_and_the_studies_import_the_studies():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if name.startswith(ALLOWED_STUDY_IMPORTERS):
            continue
        for module, line in _imported_modules(path):
            if module == "approxlab.studies" or module.startswith("approxlab.studies."):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not offenders, "only approxlab/studies and approxlab/cli.py may import approxlab.studies:\n" + "\n".join(offenders)


def test_the_import_reader_sees_relative_imports():
    # The check above is only as good as its import reader: it must resolve relative imports.
    imports = {module for module, _ in _imported_modules(PACKAGE / "cli.py")}
    assert "approxlab.studies" in imports
    assert "approxlab.studies.driver" in imports


def test_no_import_circle_inside_the_studies():
    """No module of approxlab.studies imports one that (directly or not) imports it back; the contract above
    checks the layers between the studies' parts, this also covers the modules inside each study."""
    import grimp

    graph = grimp.build_graph("approxlab", cache_dir=None)
    modules = {m for m in graph.modules if m == "approxlab.studies" or m.startswith("approxlab.studies.")}
    circles = sorted(f"{importer} -> {imported} -> ... -> {importer}"
                     for importer in modules for imported in graph.find_modules_directly_imported_by(importer)
                     if imported in modules and graph.chain_exists(imported, importer))
    assert not circles, "\n".join(circles)


def _contract_layers(name_prefix: str) -> set[str]:
    """The module names (container-relative) in the layers of the contract whose name starts with ``name_prefix``."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"].startswith(name_prefix)]
    return {part.strip() for layer in contract["layers"] for part in layer.replace(":", "|").split("|")}


def test_every_module_of_the_cache_package_has_its_place_in_the_contracts():
    """approxlab.cache spans three levels of the library's layers, so its modules are named one by one: a module
    the contracts do not name would be checked by neither (its __init__ only re-exports, lazily)."""
    modules = sorted(path.stem for path in (PACKAGE / "cache").glob("*.py") if path.stem != "__init__")
    library, package = _contract_layers("layers:"), _contract_layers("cache:")
    unnamed = [m for m in modules if f"cache.{m}" not in library or m not in package]
    assert modules and not unnamed, f"modules of approxlab.cache missing from pyproject.toml's layers: {unnamed}"
