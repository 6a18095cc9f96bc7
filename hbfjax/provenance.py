"""Where a result came from: hbfjax's version and a digest of its sources, JAX, the devices and
processes that computed it (DESIGN.md §6: every sweep row carries it); and the import closure of one module,
with its digest, that keys each committed figure table (``experiments/common.py``)."""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

import jax

import hbfjax

ROOT = Path(hbfjax.__file__).resolve().parent.parent
REPO_PACKAGES = ("hbfjax", "experiments")  # the top-level packages whose files an import closure follows


@functools.lru_cache(maxsize=None)
def source_digest(folders: tuple[str, ...] = ("hbfjax",)) -> str:
    """First 16 hex digits of a SHA-256 over every ``.py`` file under ``folders`` (relative to the repo root),
    path and contents, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(p for d in folders for p in (ROOT / d).rglob("*.py")):
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def provenance() -> dict:
    """hbfjax_version, source_digest (of ``hbfjax/``), jax_version, device_kind (of the first device),
    device_count (every process's), process_count."""
    device = jax.devices()[0]
    return {"hbfjax_version": hbfjax.__version__, "source_digest": source_digest(), "jax_version": jax.__version__,
            "device_kind": f"{device.platform}:{device.device_kind}", "device_count": jax.device_count(),
            "process_count": jax.process_count()}


def module_path(module_name: str, root: Path = ROOT) -> Path | None:
    """The file of ``module_name`` under ``root`` (``a/b.py`` or the package's ``a/b/__init__.py``); None when
    it is not a module of :data:`REPO_PACKAGES` (a third-party module, or a name imported from a module)."""
    parts = module_name.split(".")
    if parts[0] not in REPO_PACKAGES or not all(parts):
        return None
    base = root.joinpath(*parts)
    return next((p for p in (base.parent / f"{parts[-1]}.py", base / "__init__.py") if p.is_file()), None)


@functools.lru_cache(maxsize=None)
def imported_names(source: str, module_name: str, is_package: bool) -> frozenset[str]:
    """Every module name that ``source`` (the text of ``module_name``) may import, anywhere in it (functions
    too): ``import a.b`` gives ``a.b``; ``from a import b`` gives ``a`` and ``a.b`` (``b`` may be a submodule);
    relative imports are resolved against ``module_name``'s package; ``importlib.import_module("a.b")`` gives
    ``a.b``, and one of an f-string ``f"a.b.{x}"`` gives ``a.b.*`` (every module under package ``a.b``)."""
    package = module_name.split(".") if is_package else module_name.split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and (dynamic := _import_module_target(node)):
            names.add(dynamic)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level and node.level - 1 >= len(package):
                continue  # above the top-level package: not importable
            up = package[:len(package) - node.level + 1] if node.level else []
            base = ".".join(up + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return frozenset(names)


def _import_module_target(call: ast.Call) -> str | None:
    """The module an ``importlib.import_module(name)`` call loads: ``name`` when a string constant,
    ``package.*`` when an f-string starting with the constant ``package.``; None for any other call."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called != "import_module" or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        package = str(arg.values[0].value).rpartition(".")[0]
        return f"{package}.*" if package else None
    return None


def _submodules(package: str, root: Path) -> list[str]:
    """Every module name under the package directory of ``package`` (recursively)."""
    folder = root.joinpath(*package.split("."))
    if package.split(".")[0] not in REPO_PACKAGES or not (folder / "__init__.py").is_file():
        return []
    return [".".join((package, *p.relative_to(folder).with_suffix("").parts)).removesuffix(".__init__")
            for p in sorted(folder.rglob("*.py"))]


def _with_parents(module_name: str) -> list[str]:
    """``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``: importing a submodule runs every enclosing package's ``__init__``."""
    parts = module_name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


@functools.lru_cache(maxsize=None)
def import_closure(module_name: str, root: Path = ROOT) -> tuple[Path, ...]:
    """The files (relative to ``root``, sorted) of ``module_name``, its enclosing packages and every module of
    :data:`REPO_PACKAGES` they import, transitively, found statically from the source (``ast``, see
    :func:`imported_names`; imports by other means, e.g. ``pkgutil`` scans, are not seen)."""
    if module_path(module_name, root) is None:
        raise ModuleNotFoundError(f"no module {module_name!r} under {root} (packages {', '.join(REPO_PACKAGES)})")
    seen: dict[str, Path] = {}
    todo = _with_parents(module_name)
    while todo:
        name = todo.pop()
        if name in seen or (path := module_path(name, root)) is None:
            continue
        seen[name] = path
        for imported in imported_names(path.read_text(), name, path.name == "__init__.py"):
            expanded = _submodules(imported[:-2], root) if imported.endswith(".*") else [imported]
            todo += [n for e in expanded for n in _with_parents(e) if n not in seen]
    return tuple(sorted(p.relative_to(root) for p in seen.values()))


@functools.lru_cache(maxsize=None)
def closure_digest(module_name: str, root: Path = ROOT) -> str:
    """First 16 hex digits of a SHA-256 over the path and contents of every file of
    :func:`import_closure` (``module_name``), in sorted order."""
    h = hashlib.sha256()
    for rel in import_closure(module_name, root):
        h.update(rel.as_posix().encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def closure_file_digests(module_name: str, root: Path = ROOT) -> dict[str, str]:
    """Relative path -> first 12 hex digits of the SHA-256 of its contents, for every file of
    :func:`import_closure` (``module_name``): says which files changed when :func:`closure_digest` did."""
    return {rel.as_posix(): hashlib.sha256((root / rel).read_bytes()).hexdigest()[:12]
            for rel in import_closure(module_name, root)}


def clear_closure_caches() -> None:
    """Forget every cached closure and digest (after sources changed within one process)."""
    for f in (imported_names, import_closure, closure_digest):
        f.cache_clear()
