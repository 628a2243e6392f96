"""Whether a line of a user's training script sits inside a rank-conditional branch.

When the ranks of a job issue different collectives, one of them usually entered a branch guarded
by the rank (`if dist.get_rank() == 0: dist.all_reduce(x)`) and the others skipped it. This module
reads the script's source (never runs or imports it) and names the branches that enclose a line:
`if`/`elif`/`else` tests, conditional expressions, `while` tests, comprehension filters, early exits
before the line (`if rank != 0: return`) and Lightning/Accelerate "main process only" decorators,
each kept only when its test reads the rank.

"Reads the rank" is decided on names, as written by people who never read this code: calls such as
`get_rank()` (any receiver), names and attributes such as `local_rank`, `is_global_zero` or
`process_index`, environment reads of `RANK`/`LOCAL_RANK`/`SLURM_PROCID`-style variables, the first
parameter of a function handed to `spawn`, and variables (or `self.` attributes) computed from any of
those by arithmetic, comparison, logic or conversion, transitively.

Pure: the standard library only (`ast` does the reading), nothing else of ddp_doctor, no torch.
"""
from __future__ import annotations

import ast
import functools
import io
import os
import re
import stat
import tokenize
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

__all__ = ["RankBranch", "rank_branches", "rank_branches_of_file"]

# A condition's source text is cut to this many characters (an ellipsis marks the cut).
_MAX_CONDITION = 120

# Identifiers that read the rank although no "rank" word is in them (compared lower-cased, after
# camelCase is split: isMainProcess -> is_main_process).
_RANKY_EXACT = frozenset({
    "is_main_process", "is_local_main_process", "is_global_zero", "is_world_process_zero",
    "is_local_process_zero", "process_index", "local_process_index", "is_master", "master_process",
    "is_main_rank", "is_chief", "get_ordinal", "get_local_ordinal", "is_master_ordinal", "procid",
    "local_procid",
})
# Words of an identifier that say "the rank" (global_rank, ddp_rank, get_rank, RANK, rank0, ...).
_RANK_WORDS = frozenset({"rank", "rank0", "procid", "localid"})
# Words that make "rank" mean something else: a LoRA adapter's or a matrix's rank, or another
# process's rank that every process knows alike (src_rank, root_rank, first_rank, num_ranks).
_NOT_RANK_WORDS = frozenset({
    "lora", "matrix", "svd", "adapter", "ranks", "tensor", "src", "dst", "source", "dest", "destination",
    "root", "peer", "target", "owner", "first", "last", "next", "prev", "previous", "max", "min", "num",
    "lowest", "highest", "other", "remote", "sender", "receiver", "send", "recv", "from", "to", "expected",
})
# Words that may follow "rank" in a name that is still the process's rank (rank_id, rank_zero_only).
_RANK_SUFFIXES = frozenset({"id", "idx", "index", "no", "num", "zero", "0", "only", "str", "int"})
# Environment variable names: upper case, one word RANK/PROCID/LOCALID (OMPI_COMM_WORLD_RANK,
# SLURM_PROCID, SMDATAPARALLEL_LOCAL_RANK, PMI_RANK, ...), or a word ending in RANK.
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*\Z")
_LINE_END = re.compile(r"(?<=\n)|(?<=\r)(?!\n)")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

# Decorators after which a function's body runs on one process only.
_MAIN_ONLY_DECORATORS = frozenset({
    "rank_zero_only", "on_main_process", "on_local_main_process", "on_process", "on_local_process",
    "on_last_process", "master_only", "main_process_only",
})
# Calls that end the enclosing block: sys.exit(), exit(), quit(), os._exit(), os.abort().
_EXIT_CALLS = frozenset({"exit", "_exit", "quit", "abort"})
# Calls that start worker processes with their index as the first argument of the target.
_SPAWN_CALLS = frozenset({"spawn", "start_processes"})
# Method calls whose result is still the value of their argument (int, rounding, tensor.item()).
_CONVERTERS = frozenset({"int", "float", "bool", "str", "abs", "floor", "ceil", "item", "int64", "int32"})

# Nodes with nothing inside that binds a name or reads the rank: the binder does not go into them.
_LEAVES = frozenset({
    ast.Name, ast.Constant, ast.Pass, ast.Break, ast.Continue, ast.alias, ast.arg, type(None),
    *ast.expr_context.__subclasses__(), *ast.operator.__subclasses__(), *ast.boolop.__subclasses__(),
    *ast.unaryop.__subclasses__(), *ast.cmpop.__subclasses__(),
})

_Function = Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda]


@dataclass(frozen=True)
class RankBranch:
    """One rank-conditional branch that encloses a line of a script."""

    line: int  # the line of the `if`/`elif`/`while` keyword, of a ternary's or filter's test, or of the decorator
    condition: str  # the condition as written, whitespace collapsed, e.g. "dist.get_rank() == 0"
    taken_when: str  # "true": the line is reached when the condition holds; "false": when it does not
    reads: str  # the rank-ish thing the condition reads: "get_rank()", "RANK", "is_global_zero", "local_rank"


def rank_branches(source: str, line: int) -> list[RankBranch]:
    """The rank-conditional branches enclosing `line` of `source`, innermost first; [] when none,
    when the source does not parse, or the line is outside it."""
    try:
        if not isinstance(line, int) or line < 1:
            return []
        analysis = _analyse(source)
        if analysis is None or line > analysis.n_lines:
            return []
        walk = _Walk(analysis, line)
        walk.stmts(analysis.tree.body, analysis.module_scope)
        return list(reversed(walk.out))
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):  # too deep, not text: no answer
        return []


def rank_branches_of_file(path: str, line: int, *, max_bytes: int = 2_000_000) -> list[RankBranch]:
    """Same, reading the file: a regular file only (never a FIFO or a device), at most max_bytes
    read, decoded as UTF-8 with errors='replace'; [] on any error. Never raises."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return []
        # O_NONBLOCK: should the path become a FIFO between the stat and the open, the open does not wait.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
            chunks = []
            left = max_bytes
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
        text = b"".join(chunks).decode("utf-8", errors="replace")
        if text.startswith("\ufeff"):
            text = text[1:]
        return rank_branches(text, line)
    except (OSError, ValueError, SyntaxError, RecursionError, MemoryError, TypeError):  # unreadable: no answer
        return []


# ---------------------------------------------------------------------------------------------
# Names that read the rank


@functools.lru_cache(maxsize=1024)
def _ranky_identifier(name: str) -> bool:
    """Whether an identifier (a name, an attribute, a called function) names the rank."""
    low = _CAMEL.sub("_", name).lower()
    if low.strip("_") in _RANKY_EXACT:
        return True
    words = [w for w in low.split("_") if w]
    if any(w in _NOT_RANK_WORDS for w in words):
        return False
    for i, word in enumerate(words):
        if word in _RANK_WORDS:
            return all(w in _RANK_SUFFIXES for w in words[i + 1:])  # not rank_metadata, rank_to_gpu
    return False


def _ranky_env(value: object) -> bool:
    """Whether a string constant is the name of an environment variable that holds a rank."""
    if not isinstance(value, str) or not _ENV_NAME.match(value):
        return False
    return any(w in ("RANK", "PROCID", "LOCALID") or w.endswith("RANK") for w in value.split("_"))


def _final_name(node: ast.AST) -> Optional[str]:
    """`get_rank` of `torch.distributed.get_rank`, `rank_zero_only` of `rank_zero_only(...)`."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


class _Scope:
    """A module, function, lambda or class body: the names it binds and which of them hold the rank."""

    __slots__ = ("parent", "is_class", "bound", "ranky", "globals_", "nonlocals")

    def __init__(self, parent: Optional[_Scope], is_class: bool = False) -> None:
        self.parent = parent
        self.is_class = is_class
        self.bound: set[str] = set()
        self.ranky: set[str] = set()
        self.globals_: set[str] = set()
        self.nonlocals: set[str] = set()

    def module(self) -> _Scope:
        s = self
        while s.parent is not None:
            s = s.parent
        return s

    def holds_rank(self, name: str) -> bool:
        """Whether `name`, read here, is a variable computed from the rank (Python's lookup: the
        innermost scope that binds the name decides; class bodies are skipped for nested functions)."""
        s: Optional[_Scope] = self
        first = True
        while s is not None:
            if not (s.is_class and not first):
                if name in s.ranky:
                    return True
                if name in s.bound and name not in s.globals_ and name not in s.nonlocals:
                    return False
            first = False
            s = s.parent
        return False

    def binding_scope(self, name: str) -> _Scope:
        """The scope an assignment to `name` here binds (after `global`/`nonlocal`)."""
        if name in self.globals_:
            return self.module()
        if name in self.nonlocals:
            s = self.parent
            while s is not None:
                if not s.is_class and s.parent is not None and name in s.bound and name not in s.nonlocals:
                    return s
                s = s.parent
        return self


class _Analysis:
    """A parsed script and what its scopes know of the rank."""

    def __init__(self, source: str, tree: ast.Module) -> None:
        self.source = source
        self.tree = tree
        self.lines = _split_lines(source)
        self.n_lines = len(self.lines)
        self.module_scope = _Scope(None)
        self.scopes: dict[int, _Scope] = {}  # id(function/lambda/class node) -> its scope
        self.ranky_attrs: set[str] = set()  # `self.is_main = accelerator.is_main_process` -> "is_main"

    # -- reading the rank ------------------------------------------------------------------------

    def node_read(self, node: ast.AST, scope: _Scope) -> Optional[str]:
        """What this node itself reads of the rank (not looking inside it), or None."""
        if isinstance(node, ast.Call):
            name = _final_name(node.func)
            if name and _ranky_identifier(name):
                return name + "()"
            if node.args and isinstance(node.args[0], ast.Constant) and _ranky_env(node.args[0].value):
                return str(node.args[0].value)  # os.environ.get("RANK"), os.getenv("LOCAL_RANK")
        elif isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and _ranky_env(key.value):
                return str(key.value)  # os.environ["RANK"]
        elif isinstance(node, ast.Attribute):
            if isinstance(node.ctx, ast.Load) and (_ranky_identifier(node.attr) or node.attr in self.ranky_attrs):
                return node.attr
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load) and (_ranky_identifier(node.id) or scope.holds_rank(node.id)):
                return node.id
        return None

    def reads(self, expr: ast.AST, scope: _Scope) -> Optional[str]:
        """What a condition reads of the rank in any part of it (breadth first), or None."""
        for node in ast.walk(expr):
            found = self.node_read(node, scope)
            if found:
                return found
        return None

    def derives(self, expr: ast.AST, scope: _Scope) -> bool:
        """Whether a value is computed from the rank: read directly, or through arithmetic,
        comparisons, logic, conditionals, tuples, subscripts, conversions (int(...), .item()) and
        plain helper calls (`is_main(rank)`). Not through constructors, keyword arguments or method
        calls on something else (`torch.device("cuda", local_rank)`, `DDP(model, device_ids=[rank])`,
        f-strings): those values are the same kind of thing on every rank."""
        stack = [expr]
        while stack:
            node = stack.pop()
            if self.node_read(node, scope):
                return True
            if isinstance(node, ast.BinOp):
                stack += (node.left, node.right)
            elif isinstance(node, ast.UnaryOp):
                stack.append(node.operand)
            elif isinstance(node, ast.BoolOp):
                stack += node.values
            elif isinstance(node, ast.Compare):
                stack.append(node.left)
                stack += node.comparators
            elif isinstance(node, ast.IfExp):
                stack += (node.test, node.body, node.orelse)
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                stack += node.elts
            elif isinstance(node, (ast.Starred, ast.NamedExpr, ast.Await, ast.Attribute)):
                stack.append(node.value)
            elif isinstance(node, ast.Subscript):
                stack += (node.value, node.slice)
            elif isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute):
                    stack.append(func.value)  # str(rank).zfill(2), rank_tensor.item()
                    if func.attr in _CONVERTERS:
                        stack += node.args
                elif isinstance(func, ast.Name) and not func.id[:1].isupper():
                    stack += node.args  # int(...), bool(...), is_main(rank); not Class(...)
        return False

    # -- text --------------------------------------------------------------------------------------

    def text(self, node: ast.AST) -> str:
        """The node's source as written, whitespace collapsed, cut to _MAX_CONDITION characters."""
        segment = self._segment(node)
        if segment is None:
            try:
                segment = ast.unparse(node)
            except (ValueError, AttributeError, RecursionError):  # an odd node: no text rather than none at all
                segment = ""
        if "#" in segment and "\n" in segment.strip():
            segment = _without_comments(segment)
        return _cut(" ".join(segment.split()))

    def _segment(self, node: ast.AST) -> Optional[str]:
        """ast.get_source_segment, with the lines split once per script rather than once per call
        (the offsets are of UTF-8 bytes)."""
        lineno, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
        col, end_col = getattr(node, "col_offset", None), getattr(node, "end_col_offset", None)
        if None in (lineno, end, col, end_col):
            return None
        lines = self.lines[lineno - 1: end]
        if not lines:
            return None
        if len(lines) == 1:
            return lines[0].encode()[col:end_col].decode(errors="replace")
        first = lines[0].encode()[col:].decode(errors="replace")
        last = lines[-1].encode()[:end_col].decode(errors="replace")
        return "".join([first, *lines[1:-1], last])


def _cut(text: str) -> str:
    """At most _MAX_CONDITION characters; an ellipsis marks a cut."""
    return text if len(text) <= _MAX_CONDITION else text[: _MAX_CONDITION - 3] + "..."


def _without_comments(segment: str) -> str:
    """A multi-line condition's text without its comments (`rank == 0  # main only` ends its line)."""
    wrapped = "(" + segment + ")"  # inside brackets, the lines after the first continue the expression
    lines = wrapped.splitlines(keepends=True)
    try:
        comments = [tok.start for tok in tokenize.generate_tokens(io.StringIO(wrapped).readline)
                    if tok.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):  # not tokenizable on its own: keep the text as it is
        return segment
    for row, col in reversed(comments):
        lines[row - 1] = lines[row - 1][:col] + "\n"
    return "".join(lines)[1:-1]


def _split_lines(source: str) -> list[str]:
    """The lines as the parser counts them (ends kept): a form feed or U+2028 ends none."""
    lines = _LINE_END.split(source)
    if lines and not lines[-1]:
        lines.pop()
    return lines


@functools.lru_cache(maxsize=4)
def _analyse(source: str) -> Optional[_Analysis]:
    """Parse the script and work out, for each scope, which variables hold the rank. Cached for the
    few scripts a judge asks about line after line (an analysis weighs some 25 times its source)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # not Python, null bytes, too deep
        return None
    analysis = _Analysis(source, tree)
    _Binder(analysis).run()
    return analysis


# ---------------------------------------------------------------------------------------------
# Which variables hold the rank


class _Assignment:
    __slots__ = ("kind", "name", "value", "scope")

    def __init__(self, kind: str, name: str, value: ast.AST, scope: _Scope) -> None:
        self.kind = kind  # "name" or "attr"
        self.name = name
        self.value = value
        self.scope = scope  # where the value is evaluated (and, for a name, where it is bound)


class _Binder:
    """One pass over the tree (no recursion: any depth ast accepts), then a worklist until every
    variable computed from the rank, directly or through others, is marked."""

    def __init__(self, analysis: _Analysis) -> None:
        self.a = analysis
        self.assignments: list[_Assignment] = []
        self.spawned: set[str] = set()  # functions handed to mp.spawn(fn, ...)
        self.functions: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, _Scope, bool]] = []

    def run(self) -> None:
        handlers: dict[type, Callable[[Any, _Scope], Optional[list[tuple[ast.AST, _Scope]]]]] = {
            ast.FunctionDef: self._function, ast.AsyncFunctionDef: self._function, ast.Lambda: self._function,
            ast.ClassDef: self._class, ast.Global: self._global, ast.Nonlocal: self._nonlocal,
            ast.Assign: self._assign, ast.AugAssign: self._assign_one, ast.AnnAssign: self._assign_one,
            ast.NamedExpr: self._assign_one, ast.For: self._for, ast.AsyncFor: self._for,
            ast.withitem: self._withitem, ast.ExceptHandler: self._except, ast.Import: self._import,
            ast.ImportFrom: self._import, ast.Call: self._call,
        }
        stack: list[tuple[ast.AST, _Scope]] = [(self.a.tree, self.a.module_scope)]
        while stack:  # depth first, the order is of no matter: every binding is looked at once
            node, scope = stack.pop()
            handler = handlers.get(type(node))
            if handler is not None:
                children = handler(node, scope)
                if children is not None:
                    stack += children
                    continue
            for field in node._fields:
                value = getattr(node, field, None)
                if type(value) is list:
                    stack += [(c, scope) for c in value if type(c) not in _LEAVES and isinstance(c, ast.AST)]
                elif type(value) not in _LEAVES and isinstance(value, ast.AST):
                    stack.append((value, scope))
        for fn, fscope, is_method in self.functions:
            if fn.name in self.spawned:
                params = [*fn.args.posonlyargs, *fn.args.args][1 if is_method else 0:]
                if params:
                    fscope.ranky.add(params[0].arg)  # def worker(gpu, args) under mp.spawn(worker, ...)
        self._propagate()

    # Each handler records what its node binds; it returns the children to visit with the scope each
    # is evaluated in, or None for all of them in the same scope.

    def _class(self, node: ast.ClassDef, scope: _Scope) -> list[tuple[ast.AST, _Scope]]:
        scope.bound.add(node.name)
        inner = _Scope(scope, is_class=True)
        self.a.scopes[id(node)] = inner
        outer = [*node.decorator_list, *node.bases, *node.keywords]
        return [(n, scope) for n in outer] + [(n, inner) for n in node.body]

    def _global(self, node: ast.Global, scope: _Scope) -> None:
        scope.globals_.update(node.names)

    def _nonlocal(self, node: ast.Nonlocal, scope: _Scope) -> None:
        scope.nonlocals.update(node.names)

    def _assign(self, node: ast.Assign, scope: _Scope) -> None:
        for target in node.targets:
            self._bind(target, node.value, scope)

    def _assign_one(self, node: Union[ast.AugAssign, ast.AnnAssign, ast.NamedExpr], scope: _Scope) -> None:
        if node.value is not None:
            self._bind(node.target, node.value, scope)

    def _for(self, node: Union[ast.For, ast.AsyncFor], scope: _Scope) -> None:
        self._bind_plain(node.target, scope)

    def _withitem(self, node: ast.withitem, scope: _Scope) -> None:
        if node.optional_vars is not None:
            self._bind_plain(node.optional_vars, scope)

    def _except(self, node: ast.ExceptHandler, scope: _Scope) -> None:
        if node.name:
            scope.bound.add(node.name)

    def _import(self, node: Union[ast.Import, ast.ImportFrom], scope: _Scope) -> None:
        for alias in node.names:
            scope.bound.add((alias.asname or alias.name).split(".")[0])

    def _call(self, node: ast.Call, scope: _Scope) -> None:
        if _final_name(node.func) in _SPAWN_CALLS and node.args and isinstance(node.args[0], ast.Name):
            self.spawned.add(node.args[0].id)

    def _function(self, node: _Function, scope: _Scope) -> list[tuple[ast.AST, _Scope]]:
        args = node.args
        outer: list[ast.AST] = [*args.defaults, *[d for d in args.kw_defaults if d is not None]]
        if not isinstance(node, ast.Lambda):
            scope.bound.add(node.name)
            outer += node.decorator_list
            outer += [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.annotation]
            if node.returns is not None:
                outer.append(node.returns)
        parent = scope
        while parent.is_class and parent.parent is not None:  # methods do not see the class body
            parent = parent.parent
        inner = _Scope(parent)
        self.a.scopes[id(node)] = inner
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        params += [a for a in (args.vararg, args.kwarg) if a is not None]
        inner.bound.update(p.arg for p in params)
        if not isinstance(node, ast.Lambda):
            self.functions.append((node, inner, scope.is_class))
        body = [node.body] if isinstance(node, ast.Lambda) else node.body
        return [(n, scope) for n in outer] + [(n, inner) for n in body]

    def _bind(self, target: ast.AST, value: ast.AST, scope: _Scope) -> None:
        """Record `target = value`; tuples pair up element by element when both sides are tuples."""
        if isinstance(target, (ast.Tuple, ast.List)):
            values = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
            starred = any(isinstance(e, ast.Starred) for e in [*target.elts, *(values or [])])
            if values is not None and len(values) == len(target.elts) and not starred:
                for t, v in zip(target.elts, values):
                    self._bind(t, v, scope)
            else:
                for t in target.elts:
                    self._bind(t, value, scope)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, value, scope)
        elif isinstance(target, ast.Name):
            scope.bound.add(target.id)
            self.assignments.append(_Assignment("name", target.id, value, scope))
            if scope.is_class:  # a class attribute: read as self.<name> in the methods
                self.assignments.append(_Assignment("attr", target.id, value, scope))
        elif isinstance(target, ast.Attribute):
            self.assignments.append(_Assignment("attr", target.attr, value, scope))

    def _bind_plain(self, target: ast.AST, scope: _Scope) -> None:
        """A name bound to something that is not the rank (a loop variable, `with ... as x`)."""
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                scope.bound.add(node.id)

    def _propagate(self) -> None:
        """Mark every assigned variable whose value is computed from the rank, to a fixpoint: when
        one is marked, the assignments that read it are looked at again."""
        readers: dict[str, list[_Assignment]] = {}
        for asg in self.assignments:
            for node in ast.walk(asg.value):
                key = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
                if key is not None:
                    readers.setdefault(key, []).append(asg)
        work = list(reversed(self.assignments))
        while work:
            asg = work.pop()
            if asg.kind == "name":
                home = asg.scope.binding_scope(asg.name)
                if asg.name in home.ranky or not self.a.derives(asg.value, asg.scope):
                    continue
                home.ranky.add(asg.name)
            else:
                if asg.name in self.a.ranky_attrs or not self.a.derives(asg.value, asg.scope):
                    continue
                self.a.ranky_attrs.add(asg.name)
            work += readers.get(asg.name, ())


# ---------------------------------------------------------------------------------------------
# The branches around a line


def _span(node: ast.AST) -> tuple[int, int]:
    """First and last line of a node; a decorated definition starts at its first decorator."""
    start = node.lineno
    for dec in getattr(node, "decorator_list", ()) or ():
        start = min(start, dec.lineno)
    return start, node.end_lineno or node.lineno


def _contains(node: ast.AST, line: int) -> bool:
    start, end = _span(node)
    return start <= line <= end


def _index(stmts: list[ast.stmt], line: int) -> Optional[int]:
    """Which statement of a block holds the line (the last one, should two share it)."""
    found = None
    for i, st in enumerate(stmts):
        start, end = _span(st)
        if start > line:
            break
        if line <= end:
            found = i
    return found


def _always_exits(stmts: Iterable[ast.stmt]) -> bool:
    """Whether a block never falls through: it returns, raises, continues, breaks or exits."""
    for st in stmts:
        if isinstance(st, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
            return True
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and _final_name(st.value.func) in _EXIT_CALLS:
            return True
        if isinstance(st, ast.If) and st.orelse and _always_exits(st.body) and _always_exits(st.orelse):
            return True
        if isinstance(st, (ast.With, ast.AsyncWith)) and _always_exits(st.body):
            return True
    return False


class _Walk:
    """Goes down from the module to the line, collecting the rank-conditional branches on the way
    (outermost first); entering a function, or a lambda's body below its first line, starts the
    list afresh."""

    def __init__(self, analysis: _Analysis, line: int) -> None:
        self.a = analysis
        self.line = line
        self.out: list[RankBranch] = []

    def _add(self, line: int, test: ast.AST, taken: bool, scope: _Scope) -> None:
        found = self.a.reads(test, scope)
        if found:
            self.out.append(RankBranch(line, self.a.text(test), "true" if taken else "false", found))

    def stmts(self, stmts: list[ast.stmt], scope: _Scope) -> bool:
        """Go into the statement of the block that holds the line, after noting the early exits
        before it (`if rank != 0: return`); False when no statement of the block holds it."""
        i = _index(stmts, self.line)
        if i is None:
            return False
        for prev in stmts[:i]:
            if isinstance(prev, ast.If):
                body_exits, else_exits = _always_exits(prev.body), _always_exits(prev.orelse)
                if body_exits != else_exits:
                    self._add(prev.lineno, prev.test, else_exits, scope)
        self.stmt(stmts[i], scope)
        return True

    def stmt(self, st: ast.stmt, scope: _Scope) -> None:
        line = self.line
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = self.a.scopes.get(id(st), scope)
            if _index(st.body, line) is not None:
                self.out = []
                for dec in st.decorator_list:
                    name = _final_name(dec)
                    if name in _MAIN_ONLY_DECORATORS:
                        self.out.append(RankBranch(dec.lineno, "@" + self.a.text(dec), "true", name))
                self.stmts(st.body, inner)
            else:
                self.exprs([*st.decorator_list, *st.args.defaults, *st.args.kw_defaults], scope)
        elif isinstance(st, ast.ClassDef):
            inner = self.a.scopes.get(id(st), scope)
            if not self.stmts(st.body, inner):
                self.exprs([*st.decorator_list, *st.bases, *st.keywords], scope)
        elif isinstance(st, (ast.If, ast.While)):
            if _index(st.body, line) is not None:
                self._add(st.lineno, st.test, True, scope)
                self.stmts(st.body, scope)
            elif _index(st.orelse, line) is not None:
                self._add(st.lineno, st.test, False, scope)
                self.stmts(st.orelse, scope)
            else:
                self.exprs([st.test], scope)
        elif isinstance(st, (ast.For, ast.AsyncFor)):
            if not (self.stmts(st.body, scope) or self.stmts(st.orelse, scope)):
                self.exprs([st.iter], scope)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            if not self.stmts(st.body, scope):
                self.exprs([item.context_expr for item in st.items], scope)
        elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
            if not (self.stmts(st.body, scope) or self.stmts(st.orelse, scope) or self.stmts(st.finalbody, scope)):
                for handler in st.handlers:
                    if _contains(handler, line):
                        if not self.stmts(handler.body, scope) and handler.type is not None:
                            self.exprs([handler.type], scope)
                        break
        elif type(st).__name__ == "Match":  # Python 3.10+
            subject = st.subject  # type: ignore[attr-defined]
            for case in st.cases:  # type: ignore[attr-defined]
                if _index(case.body, line) is not None:
                    found = self.a.reads(subject, scope) or (case.guard and self.a.reads(case.guard, scope))
                    if found:
                        text = f"match {self.a.text(subject)}: case {self.a.text(case.pattern)}"
                        if case.guard is not None:
                            text += f" if {self.a.text(case.guard)}"
                        self.out.append(RankBranch(case.pattern.lineno, _cut(text), "true", found))
                    self.stmts(case.body, scope)
                    return
            self.exprs([subject], scope)
        else:
            self.exprs(list(ast.iter_child_nodes(st)), scope)

    def exprs(self, nodes: Iterable[Optional[ast.AST]], scope: _Scope) -> None:
        """Go into every expression that spans the line (several may share one line)."""
        for node in nodes:
            if node is not None and hasattr(node, "lineno") and _contains(node, self.line):
                self.expr(node, scope)
            elif isinstance(node, ast.comprehension):  # no position of its own
                self.expr(node, scope)

    def expr(self, node: ast.AST, scope: _Scope) -> None:
        line = self.line
        if isinstance(node, ast.IfExp):
            in_body, in_else = _contains(node.body, line), _contains(node.orelse, line)
            if in_body and in_else:  # one line: the side that calls something is the one a frame points at
                has_call = [any(isinstance(n, ast.Call) for n in ast.walk(side)) for side in (node.body, node.orelse)]
                in_body = has_call[0] or not has_call[1]
                in_else = not in_body
            if in_body or in_else:
                self._add(node.test.lineno, node.test, in_body, scope)
                self.expr(node.body if in_body else node.orelse, scope)
            else:
                self.exprs([node.test], scope)
        elif isinstance(node, ast.Lambda):
            if _contains(node.body, line):
                if line > node.lineno:  # a line of the lambda's own: its branches only; on the line that
                    self.out = []  # defines it (and often calls it: map, sorted), the enclosing ones hold too
                self.expr(node.body, self.a.scopes.get(id(node), scope))
            else:
                self.exprs([*node.args.defaults, *node.args.kw_defaults], scope)
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            results = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            if any(_contains(r, line) for r in results):
                for gen in node.generators:
                    for cond in gen.ifs:
                        self._add(cond.lineno, cond, True, scope)
                self.exprs(results, scope)
            else:
                self.exprs(node.generators, scope)
        else:
            self.exprs(ast.iter_child_nodes(node), scope)
