"""The architecture rules of docs/architecture.md, checked from the import graph (ast only).

`violations(root)` reads every module under the packages below `root` and returns one line per
broken rule (empty: all hold). Every `import` counts, including those inside functions: an import
deferred into a function still makes the module depend on the other at run time, and hiding a
cycle that way is what the cycle rule exists to catch. Module names in the rules are data, so that
a move changes one line here; `tests/test_architecture.py` runs the rules on the repository and
plants one violation per rule to show that each fires.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("reference_engine", "adapters", "experiments")
MAX_LINES = 400
LINE_LIMITED = PACKAGES + ("tests", "scripts")  # folders whose .py files must stay under MAX_LINES

# Model layers: what runs a forward pass. They never learn about scheduling, KV blocks or requests.
MODEL_LAYERS = ("reference_engine.model", "reference_engine.attention", "reference_engine.kernels",
                "reference_engine.distributed.layers", "reference_engine.distributed.sharding")
SCHEDULING_KV_REQUESTS = ("reference_engine.core", "reference_engine.engine")
# The runner reads the scheduler's per-step record; it never holds the KV-cache manager or the pool.
# Tensor parallelism (distributed/) runs the runner on every rank: the same rule holds there.
RUNNER = ("reference_engine.worker", "reference_engine.distributed")
KV_OWNERSHIP = ("reference_engine.core.kv_cache_manager", "reference_engine.core.block_pool",
                "reference_engine.core.prefix_cache", "reference_engine.core.scheduler")
# What launching a harness module as a program looks like: "-m experiments.cli", or the bare module name.
LAUNCH = re.compile(r"(^|\s)-m\s+experiments\b|^experiments(\.\w+)+$")
# One engine, one folder: adapters/engines/<name>/. The harness reads specs and names none of them.
ENGINES = "adapters.engines"
# The engine's process boundary: the front ends and the core share only engine/messages.py. A front end
# names engine_core for the core's entry point alone (what a thread or a child process runs).
FRONT_ENDS = ("reference_engine.engine.client", "reference_engine.engine.async_engine",
              "reference_engine.engine.engine_process", "reference_engine.engine.data_parallel")
CORE_SIDE = ("reference_engine.engine.engine_core", "reference_engine.engine.llm_engine")
CORE_ENTRIES = {"core_main", "thread_main"}
# What engine/ may import from worker/: the runner's public interface (its class and step output, the
# dispatch table, the step record), never the memory, kernel or batch internals below it.
ENGINE_WORKER_API = ("reference_engine.worker.model_runner", "reference_engine.worker.paths",
                     "reference_engine.worker.step_record")
# The only modules at the top of each package (everything else lives in a folder named after its stage).
TOP = {"adapters": {"__init__.py", "base.py", "registry.py"}, "experiments": {"__init__.py", "cli.py"}}


@dataclass
class Module:
    name: str
    path: Path
    imports: set[str] = field(default_factory=set)  # project modules, resolved
    strings: list[str] = field(default_factory=list)  # string constants that are not docstrings
    private: list[str] = field(default_factory=list)  # "module._name" imported from another module
    names: dict[str, set[str]] = field(default_factory=dict)  # module -> names taken from it ("*": the module)


def _name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def load(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Module]:
    """Every module of `packages` under `root`, with the project modules it imports anywhere."""
    files = [p for pkg in packages if (root / pkg).is_dir() for p in sorted((root / pkg).rglob("*.py"))]
    mods = {_name(root, p): Module(_name(root, p), p) for p in files}
    for m in mods.values():
        tree = ast.parse(m.path.read_text(), str(m.path))
        is_pkg = m.path.name == "__init__.py"
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    m.imports.add(a.name)
                    m.names.setdefault(a.name, set()).add("*")
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, up level - 1
                    pkg = m.name.split(".") if is_pkg else m.name.split(".")[:-1]
                    pkg = pkg[:len(pkg) - node.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                for a in node.names:  # `from pkg import submodule` imports the submodule
                    sub = f"{base}.{a.name}"
                    m.names.setdefault(sub if sub in mods else base, set()).add("*" if sub in mods else a.name)
                    m.imports.add(sub if sub in mods else base)
                    if a.name.startswith("_") and not a.name.startswith("__") and base.split(".")[0] in packages:
                        m.private.append(sub)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):  # types.SimpleNamespace
                m.names.setdefault(node.value.id, set()).add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                m.strings.append(node.value)
        m.imports = {_resolve(i, mods) for i in m.imports} - {None, m.name}
    return mods


def _resolve(name: str, mods: dict[str, Module]) -> str | None:
    """The project module an import names (its longest known prefix), None outside the project."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in mods:
            return ".".join(parts[:n])
    return None


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def cycles(mods: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(mods):
        if start in index:
            continue
        work = [(start, iter(sorted(mods[start].imports)))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(mods[w].imports))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def engine_names(root: Path) -> set[str]:
    """The engines: one folder each under adapters/engines/."""
    folder = root / ENGINES.replace(".", "/")
    return {d.name for d in folder.iterdir() if d.is_dir() and (d / "__init__.py").is_file()} if folder.is_dir() else set()


def violations(root: Path) -> list[str]:
    mods = load(root)
    engines = engine_names(root)
    out = []
    for m in mods.values():
        def forbid(prefixes: tuple[str, ...], rule: str) -> None:
            out.extend(f"{m.name} imports {i}: {rule}" for i in sorted(m.imports) if _under(i, prefixes))

        if _under(m.name, ("reference_engine",)):
            forbid(("adapters", "experiments"), "the engine never imports adapters or the harness")
        out.extend(f"{m.name} imports {p}: a private name of another module" for p in m.private)
        if _under(m.name, ("adapters",)):
            forbid(("experiments",), "adapters never import the harness")
            out.extend(f"{m.name} imports {i}: adapters use only the engine's public API (the `reference_engine`"
                       " package)" for i in sorted(m.imports) if _under(i, ("reference_engine",))
                       and i != "reference_engine")
            out.extend(f"{m.name} launches {s!r}: adapters never launch the harness's modules"
                       for s in m.strings if LAUNCH.search(s))
        if _under(m.name, MODEL_LAYERS):
            forbid(SCHEDULING_KV_REQUESTS, "model layers never import scheduling, KV or requests")
        if m.name in FRONT_ENDS:
            for i in sorted(m.imports):
                if i in CORE_SIDE and not (i == CORE_SIDE[0] and m.names.get(i, {"*"}) <= CORE_ENTRIES):
                    out.append(f"{m.name} imports {i} ({', '.join(sorted(m.names.get(i, ())))}): the front ends and "
                               "the core share only engine/messages.py (a front end names the core's entry point alone)")
        if m.name in CORE_SIDE:
            forbid(FRONT_ENDS, "the core never imports a front end: they share only engine/messages.py")
        if _under(m.name, ("reference_engine.engine",)):
            out.extend(f"{m.name} imports {i}: engine/ imports from worker/ only the runner's public interface "
                       f"({', '.join(n.rsplit('.', 1)[1] for n in ENGINE_WORKER_API)})" for i in sorted(m.imports)
                       if _under(i, ("reference_engine.worker",)) and not _under(i, ENGINE_WORKER_API))
            if "SimpleNamespace" in m.names.get("types", ()):
                out.append(f"{m.name} uses types.SimpleNamespace: the engine passes typed messages and dataclasses")
        if _under(m.name, RUNNER):
            forbid(KV_OWNERSHIP, "the runner never imports the KV-cache manager or the block pool")
        if _under(m.name, ("experiments",)):
            forbid((ENGINES,), "the harness names no engine: it reads each engine's spec (adapters.registry)")
            out.extend(f"{m.name} names engine {s!r}: the harness names no engine: it reads each engine's spec"
                       for s in sorted(set(m.strings) & engines))
        if _under(m.name, (ENGINES,)) and m.name.count(".") >= 2:
            own = ".".join(m.name.split(".")[:3])
            out.extend(f"{m.name} imports {i}: an engine folder imports no other engine's folder"
                       for i in sorted(m.imports) if _under(i, (ENGINES,)) and not _under(i, (own, ENGINES + ".__init__"))
                       and i != ENGINES)
    out.extend("import cycle: " + " -> ".join(c) for c in cycles(mods))
    for pkg, allowed in TOP.items():
        for p in sorted((root / pkg).glob("*.py")) if (root / pkg).is_dir() else []:
            if p.name not in allowed:
                out.append(f"{p.relative_to(root)}: no module at the top of {pkg}/ but {', '.join(sorted(allowed))} "
                           f"(each stage has a folder)")
    for folder in LINE_LIMITED:
        for p in sorted((root / folder).rglob("*.py")) if (root / folder).is_dir() else []:
            n = len(p.read_text().splitlines())
            if n > MAX_LINES:
                out.append(f"{p.relative_to(root)} has {n} lines: no file over {MAX_LINES}")
    return out
