"""The package's type stubs (python/xfmr/__init__.pyi) against the compiled
module xfmr._xfmr: the same public names, of the same kinds (class,
function, method, property); each function's and method's parameters as
the binding names them, positional or keyword-only, with its defaults; a
type on every parameter and return; and a docstring on every public name.

pybind11 writes a function's signature as its docstring's first line,
"name(self: T, arg: T, *, kw: T = default) -> R", which is what is read
here (it sets no __text_signature__). Run by ctest with the other tests.
"""
import ast
import pathlib

import pytest

import xfmr
from xfmr import _xfmr

SOURCE = pathlib.Path(__file__).resolve().parent.parent / "xfmr"  # python/xfmr, as checked in
STUBS_TEXT = (SOURCE / "__init__.pyi").read_text(encoding="utf-8")
STUBS = ast.parse(STUBS_TEXT)


def public(name):
    return not name.startswith("_")


# What the module has: {qualified name: (kind, object)}. A class's members
# are what its binding defines (its __dict__): public names, and the
# special methods it binds (__init__, __repr__, __len__, ...).
def runtime_names():
    out = {}
    for name in dir(_xfmr):
        if not public(name):
            continue
        obj = getattr(_xfmr, name)
        if isinstance(obj, type):
            out[name] = ("class", obj)
            for member, value in vars(obj).items():
                if isinstance(value, property) and public(member):
                    out[f"{name}.{member}"] = ("property" if value.fset is None else "settable property", value)
                elif type(value).__name__ == "instancemethod":  # a pybind11 method, special ones too
                    out[f"{name}.{member}"] = ("method", value)
                elif public(member):
                    out[f"{name}.{member}"] = ("unknown: " + type(value).__name__, value)
        elif callable(obj):
            out[name] = ("function", obj)
        else:
            out[name] = ("unknown: " + type(obj).__name__, obj)
    return out


# What the stubs have, in the same form: {qualified name: (kind, node)}.
def stub_names():
    out = {}
    for node in STUBS.body:
        if isinstance(node, ast.ClassDef) and public(node.name):
            out[node.name] = ("class", node)
            for member in node.body:
                if isinstance(member, ast.FunctionDef) and (public(member.name) or member.name.startswith("__")):
                    decorators = [ast.get_source_segment(STUBS_TEXT, d) for d in member.decorator_list]
                    qualified = f"{node.name}.{member.name}"
                    if "property" in decorators:
                        out[qualified] = ("property", member)
                    elif f"{member.name}.setter" in decorators:
                        out[qualified] = ("settable property", out[qualified][1])
                    else:
                        out[qualified] = ("method", member)
        elif isinstance(node, ast.FunctionDef) and public(node.name):
            out[node.name] = ("function", node)
    return out


RUNTIME = runtime_names()
STUBBED = stub_names()
CALLABLES = sorted(n for n, (kind, _) in RUNTIME.items() if kind in ("function", "method"))


def split_top_level(text):
    """text split at the commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def literal(text):
    """A default's value, typed (1 and 1.0 differ); one that is not a literal
    (an object's repr) as `...`, which is what the stub writes for it."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = ...
    return (type(value).__name__, value)


def binding_parameters(name, func):
    """[(name, kind, default)] from pybind11's signature line; default None when there is none."""
    first = (func.__doc__ or "").split("\n", 1)[0]
    short = name.rsplit(".", 1)[-1]
    assert not first.startswith("Overloaded function"), f"{name} is overloaded; stub each overload"
    assert first.startswith(short + "(") and ") -> " in first, f"{name}: no pybind11 signature in {first!r}"
    params, kind = [], "positional"
    for part in split_top_level(first[len(short) + 1 : first.rindex(") -> ")]):
        if part == "/":
            params = [(n, "positional-only", d) for n, _, d in params]
        elif part == "*":
            kind = "keyword-only"
        elif part.startswith("**"):
            params.append((part[2:].split(":")[0].strip(), "**", None))
        elif part.startswith("*"):
            params.append((part[1:].split(":")[0].strip(), "*", None))
            kind = "keyword-only"
        else:
            head, has_default, default = part.partition(" = ")
            params.append((head.split(":")[0].strip(), kind, literal(default) if has_default else None))
    return params


def stub_parameters(node):
    """[(name, kind, default)] of a stub's def, in binding_parameters' form."""
    a = node.args
    positional = [(p, "positional-only") for p in a.posonlyargs] + [(p, "positional") for p in a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [(p.arg, kind, d) for (p, kind), d in zip(positional, defaults)]
    if a.vararg:
        params.append((a.vararg.arg, "*", None))
    params += [(p.arg, "keyword-only", d) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append((a.kwarg.arg, "**", None))
    return [(n, kind, None if d is None else literal(ast.get_source_segment(STUBS_TEXT, d))) for n, kind, d in params]


def test_the_package_re_exports_the_modules_public_names():
    names = sorted(n for n in dir(_xfmr) if public(n))
    assert sorted(xfmr.__all__) == names
    assert sorted(n for n in dir(xfmr) if public(n)) == names
    for n in names:
        assert getattr(xfmr, n) is getattr(_xfmr, n), n
    stub_all = next(node.value for node in STUBS.body
                    if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["__all__"])
    assert sorted(ast.literal_eval(stub_all)) == names


def test_the_build_holds_the_package_as_checked_in():
    built = pathlib.Path(xfmr.__file__).parent
    for name in ("__init__.py", "__init__.pyi", "py.typed"):
        assert (built / name).read_bytes() == (SOURCE / name).read_bytes(), f"{built / name} is not {SOURCE / name}"


def test_the_stubs_name_what_the_module_has():
    runtime = {n: kind for n, (kind, _) in RUNTIME.items()}
    stubbed = {n: kind for n, (kind, _) in STUBBED.items()}
    assert not [n for n in runtime if n not in stubbed], "in the module, not the stubs"
    assert not [n for n in stubbed if n not in runtime], "in the stubs, not the module"
    assert runtime == stubbed


@pytest.mark.parametrize("name", sorted(n for n, (kind, _) in RUNTIME.items() if kind == "class"))
def test_a_classs_bases(name):
    bases = [b.__name__ for b in RUNTIME[name][1].__bases__ if b.__name__ not in ("pybind11_object", "object")]
    assert [ast.get_source_segment(STUBS_TEXT, b) for b in STUBBED[name][1].bases] == bases


@pytest.mark.parametrize("name", CALLABLES)
def test_stub_parameters_are_the_bindings(name):
    assert name in STUBBED, f"{name} is not in the stubs"
    assert stub_parameters(STUBBED[name][1]) == binding_parameters(name, RUNTIME[name][1])


@pytest.mark.parametrize("name", sorted(n for n, (kind, _) in STUBBED.items() if kind != "class"))
def test_every_stub_is_typed(name):
    node = STUBBED[name][1]
    a = node.args
    params = a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p]
    untyped = [p.arg for p in params if p.annotation is None and p.arg != "self"]
    assert not untyped and node.returns is not None, f"{name}: untyped {untyped or 'return'}"


@pytest.mark.parametrize("name", sorted(RUNTIME))
def test_every_public_name_has_a_docstring(name):
    kind, obj = RUNTIME[name]
    doc = obj.__doc__ or ""
    if kind in ("function", "method"):
        doc = doc.split("\n", 1)[1] if "\n" in doc else ""  # after pybind11's signature line
    assert doc.strip(), f"{name} has no docstring"


def test_the_package_and_module_have_docstrings():
    assert (xfmr.__doc__ or "").strip() and (_xfmr.__doc__ or "").strip()
