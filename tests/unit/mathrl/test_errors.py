"""Every exception the project defines is under one base, mathrl.errors.MathRLException, and
the registries' errors are UnknownNames (issue 44 item 5)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

from mathrl import errors
from mathrl.errors import MathRLException, UnknownName
from runtime import errors as runtime_errors
from store import errors as store_errors

pytestmark = pytest.mark.quick

PACKAGES = ("mathrl", "store", "runtime", "evaluator", "trainer", "config", "kinds", "service", "worker", "api")
# modules that cannot be imported in a test, with why (their classes are still read from the source)
NOT_IMPORTED = {
    "evaluator.sandbox_harness": "the sandbox's own interpreter: it reads its cases from stdin on import",
}
# exceptions not (yet) under the base, with why
OUTSIDE: dict[str, str] = {}


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        path = importlib.import_module(package).__path__
        names += [m.name for m in pkgutil.walk_packages(path, f"{package}.")]
    return sorted(names)


def _exceptions() -> dict[str, type[BaseException]]:
    """Every exception class the project's modules define, by dotted name."""
    for name in _modules():
        if name not in NOT_IMPORTED:
            importlib.import_module(name)
    found: dict[str, type[BaseException]] = {}
    stack: list[type[BaseException]] = [BaseException]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.split(".")[0] in PACKAGES:
                found[f"{sub.__module__}.{sub.__qualname__}"] = sub
            stack.append(sub)
    return found


def test_every_exception_is_under_the_base() -> None:
    found = _exceptions()
    assert len(found) >= 30  # the walk did find them
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, MathRLException))
    assert outside == sorted(set(OUTSIDE) & set(found)), "every exception derives from mathrl.errors.MathRLException"


def test_modules_not_imported_define_no_class() -> None:
    for name in NOT_IMPORTED:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        classes = [n.name for n in ast.walk(ast.parse(Path(spec.origin).read_text())) if isinstance(n, ast.ClassDef)]
        assert classes == [], f"{name} defines {classes}: import it here or check them another way"


ERRORS_MODULES = ("mathrl.errors", "store.errors", "runtime.errors")


def test_exceptions_are_defined_in_the_errors_modules() -> None:
    """Only the API's Problems (HTTP details, raised only by the API) and private helpers are
    defined elsewhere; every other one lives in an errors module (the SDK's, the store's or the
    server's), re-exported where it is raised."""
    elsewhere = {
        name
        for name, cls in _exceptions().items()
        if cls.__module__ not in ERRORS_MODULES and name not in OUTSIDE and not cls.__name__.startswith("_")
    }
    assert elsewhere == {"api.problems.Problem", "api.admission.QuotaProblem"}


def _names_in_the_sdk() -> set[str]:
    """Every name the SDK's modules other than mathrl/errors.py use."""
    root = Path(errors.__file__).parent
    used: set[str] = set()
    for path in root.rglob("*.py"):
        if path == Path(errors.__file__):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.alias):
                used.add(node.asname or node.name)
    return used


def test_the_sdk_errors_module_holds_only_what_an_sdk_user_can_meet() -> None:
    """Issue 68.6: a class in mathrl/errors.py is raised or caught by the SDK's own code (a module
    of mathrl/ names it), is an error answer `error_for` gives, or is a base of one of those. The
    server's own (a lease lost, a drain, a checkpoint that failed) are in store/ and runtime/."""
    sdk = {
        cls
        for name, cls in vars(errors).items()
        if isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__ == "mathrl.errors"
    }
    used = _names_in_the_sdk()
    answers = {type(errors.error_for(status, {})) for status in (400, 401, 403, 404, 409, 418, 422, 429, 500, 503)}
    met = {cls for cls in sdk if cls.__name__ in used} | answers
    bases = {base for cls in met for base in cls.__mro__ if base in sdk}
    assert sdk - bases == set(), f"not met by an SDK user, move server-side: {sorted(c.__name__ for c in sdk - bases)}"
    from runtime.errors import LeaseLost
    from store.errors import Unstorable

    assert not hasattr(errors, "LeaseLost") and not hasattr(errors, "Unstorable")
    assert issubclass(LeaseLost, MathRLException) and issubclass(Unstorable, MathRLException)


def test_the_registries_errors_are_unknown_names() -> None:
    from evaluator.benchmarks import REGISTRY, UnknownBenchmark
    from evaluator.recipes import RECIPES, UnknownRecipe
    from trainer.rewards import UnknownReward

    for cls in (UnknownBenchmark, UnknownRecipe, UnknownReward):
        assert issubclass(cls, UnknownName) and issubclass(cls, ValueError)
    with pytest.raises(UnknownBenchmark, match=r"^unknown benchmark 'gsm9k'\. Did you mean 'gsm8k"):
        REGISTRY["gsm9k"]
    with pytest.raises(UnknownName, match=r"^unknown recipe 'nope'\."):
        RECIPES["nope"]


def test_the_built_in_bases_are_kept() -> None:
    """`except ValueError` and `except RuntimeError` still catch what they caught."""
    for cls in (
        errors.FieldError,
        runtime_errors.Refused,
        errors.UnknownName,
        errors.PatternError,
        errors.TemplateError,
        errors.FormulaVariableError,
        errors.FileFormatError,
        errors.IllegalTransition,
        store_errors.Unstorable,
        store_errors.NotPausable,
        runtime_errors.RefusedURL,
        runtime_errors.RefError,
        runtime_errors.ParquetError,
    ):
        assert issubclass(cls, ValueError), cls
    for cls in (
        runtime_errors.NotAvailable,
        runtime_errors.SandboxUnavailable,
        runtime_errors.MemoryRefused,
        runtime_errors.CheckpointWriteError,
        runtime_errors.RayUnavailable,
    ):
        assert issubclass(cls, RuntimeError), cls


def test_errors_imports_nothing_of_the_project() -> None:
    """Every module may import mathrl.errors: it imports none of them."""
    tree = ast.parse(Path(errors.__file__).read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    ]
    assert not [m for m in imported if m.split(".")[0] in PACKAGES]
