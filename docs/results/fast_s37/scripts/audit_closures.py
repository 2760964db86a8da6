"""pytest plugin (``-p audit_closures``, CPU): for every reference capture, the tensors its function reaches
that ``closure_tensors`` misses (so a graph would not keep them), by path; printed at the end. Written when it did
not follow objects' attributes: tree plans and the fused decoder's tables showed up; with them followed, none
(session 37)."""
import collections
import dataclasses
import functools
import types

import torch

import specdec.graphs as graphs
import specdec.static as static

FOUND = collections.Counter()


def _deep(fn):
    out, seen = {}, set()

    def walk(obj, path, depth):
        if isinstance(obj, torch.Tensor):
            out.setdefault(id(obj), (obj, path))
            return
        if depth > 7 or id(obj) in seen or isinstance(obj, (torch.nn.Module, str, bytes, int, float, type)):
            return
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType):
            names = obj.__code__.co_freevars
            items = [(f"{obj.__name__}.{n}", c.cell_contents) for n, c in zip(names, obj.__closure__ or ())
                     if graphs._filled(c)]
            items += [(f"{obj.__name__}.default", d) for d in obj.__defaults__ or ()]
        elif isinstance(obj, functools.partial):
            items = [("partial.func", obj.func)] + [("partial.arg", a) for a in obj.args]
        elif isinstance(obj, types.MethodType):
            items = [("method.func", obj.__func__), ("method.self", obj.__self__)]
        elif isinstance(obj, (tuple, list)):
            items = [(f"{type(obj).__name__}[{i}]", x) for i, x in enumerate(obj)]
        elif isinstance(obj, dict):
            items = [(f"[{k!r}]"[:40], v) for k, v in obj.items()]
        elif dataclasses.is_dataclass(obj):
            items = [(f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
        elif hasattr(obj, "__dict__"):
            items = [(f"{type(obj).__name__}.{k}", v) for k, v in vars(obj).items()]
        else:
            return
        for name, item in items:
            walk(item, path + "/" + name, depth + 1)

    walk(fn, "", 0)
    return out


def _audited(capture):
    def run(fn, inputs, **kw):
        shallow = {id(t) for t in graphs.closure_tensors(fn)}
        given = {id(t) for t in graphs._leaves(inputs)}
        for i, (_, path) in _deep(fn).items():
            if i not in shallow and i not in given:
                FOUND[path] += 1
        return capture(fn, inputs, **kw)
    return run


graphs.capture_graph_ref = _audited(graphs.capture_graph_ref)
static.capture_graph_ref = graphs.capture_graph_ref


def pytest_sessionfinish(session):
    print("\nreached only through attributes:")
    for path, n in sorted(FOUND.items()):
        print(f"{n:6d} {path}")
