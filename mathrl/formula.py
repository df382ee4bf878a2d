"""A multi grader's `calculate_output` (OpenAI's grader JSON): arithmetic over its graders'
scores, parsed with `ast` and evaluated by walking a whitelist of nodes, never `eval`.

Allowed: numbers; the names of the multi grader's graders; + - * / and ^ or ** (power,
binding tighter than * and /); unary minus; parentheses; and the functions min, max, abs,
floor, ceil, exp, sqrt, log (OpenAI's list). Anything else (attributes, subscripts, calls of
other names, comparisons, strings, lambdas) is a FormulaError naming it."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mathrl.errors import FormulaError as FormulaError  # raised here; its callers import them from here
from mathrl.errors import FormulaVariableError as FormulaVariableError

FUNCTIONS: dict[str, Callable[..., float]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "floor": math.floor,
    "ceil": math.ceil,
    "exp": math.exp,
    "sqrt": math.sqrt,
    "log": math.log,
}
_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_STRUCTURE = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd, ast.Load, *_BINARY)
MAX_LENGTH = 1000
MAX_DEPTH = 200  # operators within operators: evaluating walks the tree recursively
MAX_EXPONENT = 64.0


def parse(formula: str, names: Iterable[str]) -> ast.Expression:
    """The formula's tree, checked against the whitelist and the grader `names`."""
    if len(formula) > MAX_LENGTH:
        raise FormulaError(f"the formula is over {MAX_LENGTH} characters")
    try:
        # '^' is a power in OpenAI's formulas, with a power's precedence (Python's '^' binds looser
        # than '+'); a formula holds no strings, so the text can be rewritten
        tree = ast.parse(formula.strip().replace("^", "**"), mode="eval")
    except SyntaxError as e:
        raise FormulaError(f"cannot parse {formula!r}: {e.msg}") from None
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]  # depth first, without recursion
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise FormulaError(f"the formula nests deeper than {MAX_DEPTH} levels: write it flatter")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr))
    known = set(names)
    callees = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}  # checked as calls below
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if id(node) not in callees and node.id not in known:  # a function's bare name is no value
                hint = f": {node.id} is a function, call it (e.g. {node.id}(a, b))" if node.id in FUNCTIONS else ""
                raise FormulaVariableError(
                    f"{node.id!r} is not one of the graders ({', '.join(sorted(known)) or 'none'}){hint}"
                )
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
                raise FormulaError(f"only {', '.join(FUNCTIONS)} may be called, with plain arguments")
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                raise FormulaError(f"{node.value!r} is not a number")
        elif not isinstance(node, _STRUCTURE):
            raise FormulaError(f"{type(node).__name__} is not allowed in a formula")
    return tree


def evaluate(formula: str, values: Mapping[str, float]) -> float:
    """The formula's value with each grader name bound to its score."""
    tree = parse(formula, values)

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant):
            return float(node.value)  # type: ignore[arg-type]  # parse() let only numbers through
        if isinstance(node, ast.Name):
            return float(values[node.id])
        if isinstance(node, ast.UnaryOp):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise FormulaError(f"an exponent of {right:g} is over {MAX_EXPONENT:g}")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            return float(FUNCTIONS[node.func.id](*(walk(a) for a in node.args)))
        raise FormulaError(f"{type(node).__name__} is not allowed in a formula")

    try:
        result = float(walk(tree))
    except (ZeroDivisionError, ValueError, OverflowError, TypeError) as e:
        if isinstance(e, FormulaError):
            raise
        raise FormulaError(f"{formula!r} cannot be computed: {e}") from None
    if not math.isfinite(result):
        raise FormulaError(f"{formula!r} is not finite ({result})")
    return result
