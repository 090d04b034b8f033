"""A chat template's render, bounded: no template runs for hours or fills the memory.

jinja2's sandbox caps one ``range()`` at 100,000 items, but nested loops over ranges (or
over a long string), a string multiplied or doubled in a loop, or a power of big
integers ran inside ``load_counter`` / ``prepare`` for hours. transformers compiles a
template once per text (``_compile_jinja_template``, cached); :func:`bound` compiles it
again in the same environment with every ``for`` loop's iterable, every ``*``, ``**``,
``+`` and ``~`` routed through the counting functions below, and puts that code in the
cached template. While :func:`budget` is active (ctxguard's own renders), one render
may step through at most :data:`LOOP_ITEMS` loop items, make no string or list longer
than :data:`MAX_CHARS`, write at most :data:`MAX_CHARS` characters and run for at most
:data:`SECONDS`; past any of them it is a :class:`TemplateRefusedError`. Outside a
budget (someone else rendering the same template text in this process) the functions
do exactly what the operators do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

from jinja2 import Environment, TemplateSyntaxError, nodes
from jinja2.ext import Extension
from jinja2.visitor import NodeTransformer

from ctxguard.errors import TemplateRefusedError

LOOP_ITEMS = 10_000_000  # loop items one render may step through, all loops together
MAX_CHARS = 64 * 1024 * 1024  # the longest string or list, and the whole output
SECONDS = 60.0  # one render's time
_POW_BITS = 1 << 20  # an integer power's result, in bits
_NAMES = ("ctxguard_iter", "ctxguard_mul", "ctxguard_pow", "ctxguard_add")
_CONCAT = "ctxguard_concat"
_FIX = "make the chat template finish (a loop or a string it never ends?)"


_CLOCK_EVERY = 64  # steps between two reads of the clock (a step is a loop or a chunk)


class _Budget:
    __slots__ = ("end", "items", "output", "tick")

    def __init__(self) -> None:
        self.items = LOOP_ITEMS
        self.output = MAX_CHARS
        self.end = time.monotonic() + SECONDS
        self.tick = _CLOCK_EVERY

    def step(self, n: int) -> None:
        self.items -= n
        if self.items < 0:
            raise TemplateRefusedError(
                f"the chat template refused: one render stepped through more than "
                f"{LOOP_ITEMS:,} loop items; {_FIX}"
            )
        self.tick -= 1
        if self.tick <= 0:
            self.tick = _CLOCK_EVERY
            if time.monotonic() > self.end:
                raise TemplateRefusedError(
                    f"the chat template refused: one render ran past {SECONDS:g} s; {_FIX}"
                )


_active: ContextVar[_Budget | None] = ContextVar("ctxguard_render_budget", default=None)


class budget:
    """Renders inside the block are bounded (see the module docstring). A class, not a
    ``@contextmanager``: it runs around every render, twice per message counted."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _active.set(_Budget())

    def __exit__(self, *exc: object) -> None:
        _active.reset(self._token)


def _too_long(what: str, size: int) -> TemplateRefusedError:
    return TemplateRefusedError(
        f"the chat template refused: it makes {what} of {size:,} items, over {MAX_CHARS:,}; {_FIX}"
    )


class _Counted:
    """An iterable whose items are charged to the render's budget (its length kept)."""

    __slots__ = ("_budget", "_items", "_source")

    def __init__(self, source: Any, charged: _Budget) -> None:
        self._source = source
        self._items = iter(source)
        self._budget = charged

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        item = next(self._items)
        self._budget.step(1)
        return item

    def __len__(self) -> int:
        return len(self._source)


def _iter(source: Any) -> Any:
    charged = _active.get()
    if charged is None:
        return source
    if type(source) in _WHOLE and len(source) <= _CLOCK_EVERY:
        # a short loop (a message's parts, its tool calls): charged whole up front, no
        # wrapper per item; a long one is charged item by item, so the clock is read
        # within it however long each item's body takes
        charged.step(len(source))
        return source
    return _Counted(source, charged)


_WHOLE = frozenset({list, tuple, str, dict, range})
_SIZED = (str, list, tuple)


def _sized(value: Any) -> bool:
    return isinstance(value, _SIZED)


def _mul(left: Any, right: Any) -> Any:
    if _active.get() is not None:
        for seq, times in ((left, right), (right, left)):
            if _sized(seq) and isinstance(times, int) and len(seq) * times > MAX_CHARS:
                raise _too_long("a repeated string or list", len(seq) * times)
    return left * right


def _add(left: Any, right: Any) -> Any:
    # the cheap checks first: ``+`` runs for every piece of every message of every render
    if (
        isinstance(left, _SIZED)
        and isinstance(right, _SIZED)
        and len(left) + len(right) > MAX_CHARS
        and _active.get() is not None
    ):
        raise _too_long("a string or list", len(left) + len(right))
    return left + right


def _pow(left: Any, right: Any) -> Any:
    if (
        _active.get() is not None
        and type(left) is int
        and type(right) is int
        and right > 0
        and abs(left) > 1
        and right * abs(left).bit_length() > _POW_BITS
    ):
        raise TemplateRefusedError(
            f"the chat template refused: it raises an integer to a power of over "
            f"{_POW_BITS:,} bits; {_FIX}"
        )
    return left**right


def _concat(*parts: Any) -> str:
    texts = [str(p) for p in parts]  # what jinja's ``~`` does (str_join)
    if _active.get() is not None and sum(map(len, texts)) > MAX_CHARS:
        raise _too_long("a string", sum(map(len, texts)))
    return "".join(texts)


def _output(chunks: Iterable[Any]) -> str:
    """The environment's ``concat``: a render's output, charged to its budget."""
    charged = _active.get()
    if charged is None:
        return "".join(chunks)
    out: list[str] = []
    append = out.append
    left = charged.output
    step = charged.step
    for chunk in chunks:
        left -= len(chunk)
        if left < 0:
            raise _too_long("an output", MAX_CHARS - left)
        step(0)
        append(chunk)
    charged.output = left
    return "".join(out)


_lock = threading.Lock()
_checked: set[str] = set()  # template texts whose constants were checked


class _Generation(Extension):
    """transformers' ``{% generation %}`` tag, for parsing only."""

    tags = {"generation"}  # noqa: RUF012 (jinja's own attribute)

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _NotConstant(Exception):
    pass


_CHECKED_OPS: dict[type[nodes.Node], Any] = {}


def _value(node: nodes.Node) -> Any:
    """A constant expression's value, computed with the bounds (jinja computes it when
    it compiles: ``10 ** 100000000`` held transformers' compile, before any render)."""
    if isinstance(node, nodes.Const):
        return node.value
    if isinstance(node, nodes.List | nodes.Tuple):
        items = [_value(item) for item in node.items]
        return items if isinstance(node, nodes.List) else tuple(items)
    checked = _CHECKED_OPS.get(type(node))
    if checked is None:
        raise _NotConstant
    return checked(_value(node.left), _value(node.right))  # type: ignore[attr-defined]


def _check_constants(template: str) -> None:
    try:
        tree = Environment(extensions=["jinja2.ext.loopcontrols", _Generation]).parse(template)
    except TemplateSyntaxError:
        return  # transformers' compile says so
    with budget():
        for node in tree.find_all((nodes.Pow, nodes.Mul, nodes.Add)):
            try:
                _value(node)
            except (_NotConstant, ArithmeticError, TypeError, ValueError):
                continue  # (not constant, or an error the render itself will raise)


def bound(template: str) -> None:
    """Put the bounded code into transformers' cached compile of ``template`` (once per
    text; a transformers without that cache is left as it is). A template that does
    not compile raises jinja's ``TemplateSyntaxError``, as transformers' compile does."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # another transformers: renders are not bounded
        return
    if template not in _checked:
        _check_constants(template)
        _checked.add(template)
    compiled = _compile_jinja_template(template)
    if getattr(compiled, "_ctxguard_bounded", False):
        return
    with _lock:
        if getattr(compiled, "_ctxguard_bounded", False):
            return
        env = compiled.environment
        env.filters.update(zip(_NAMES, (_iter, _mul, _pow, _add), strict=True))
        env.filters[_CONCAT] = _concat
        env.concat = _output
        tree = _BoundedTree().visit(env.parse(template))
        fresh = env.template_class.from_code(env, env.compile(tree), compiled.globals, None)
        compiled.blocks = fresh.blocks
        compiled.root_render_func = fresh.root_render_func
        compiled._module = None
        compiled._debug_info = fresh._debug_info
        compiled._ctxguard_bounded = True


_CHECKED_OPS.update({nodes.Pow: _pow, nodes.Mul: _mul, nodes.Add: _add})


def _call(name: str, args: list[Any], lineno: int) -> nodes.Filter:
    # a filter, not a call: jinja calls a filter directly, a call through the sandbox's checks
    return nodes.Filter(args[0], name, args[1:], [], None, None, lineno=lineno)


class _BoundedTree(NodeTransformer):
    """Each loop's iterable, ``*``, ``**``, ``+`` and ``~`` through the functions above."""

    def visit_For(self, node: Any) -> Any:
        self.generic_visit(node)
        node.iter = _call(_NAMES[0], [node.iter], node.lineno)
        return node

    def visit_Mul(self, node: Any) -> Any:
        self.generic_visit(node)
        return _call(_NAMES[1], [node.left, node.right], node.lineno)

    def visit_Pow(self, node: Any) -> Any:
        self.generic_visit(node)
        return _call(_NAMES[2], [node.left, node.right], node.lineno)

    def visit_Add(self, node: Any) -> Any:
        self.generic_visit(node)
        return _call(_NAMES[3], [node.left, node.right], node.lineno)

    def visit_Concat(self, node: Any) -> Any:
        self.generic_visit(node)
        return _call(_CONCAT, list(node.nodes), node.lineno)
