"""hetsync's imports flow one way (docs/architecture.md, "Imports").

The static import graph of ``hetsync/`` -- every ``import`` statement, at a module's top or inside a function, and
the package ``__init__`` each import runs first -- has no cycle; the layers engine <- methods <- training <- Keras
and loop front ends <- public API are never crossed upwards; the few imports left inside functions say why.
Pure ``ast``: nothing is imported, so a cycle is found even where Python would happen to resolve it."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_DEFERRED = 8


def _modules():
    mods = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "hetsync")):
        for name in files:
            if name.endswith(".py") and not name.endswith(("_pb2.py", "_pb2_grpc.py")):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
    return mods


def _targets(node, module, is_package):
    """The dotted names an import statement names (``from a import b``: ``a`` and ``a.b``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def import_graph():
    """(module -> set of hetsync modules it imports, [(module, line) of imports inside functions])."""
    mods = _modules()
    graph, deferred = {m: set() for m in mods}, []
    for module, path in mods.items():
        source = open(path, encoding="utf-8").read()
        lines = source.split("\n")
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            found = set()
            for name in _targets(node, module, path.endswith("__init__.py")):
                parts = name.split(".")
                # importing a.b.c runs a/__init__ and a/b/__init__ first (not a cycle when a is this module's own
                # package: Python has it in sys.modules already)
                for i in range(1, len(parts) + 1):
                    prefix = ".".join(parts[:i])
                    if prefix in mods and prefix != module and not (module + ".").startswith(prefix + "."):
                        found.add(prefix)
            graph[module] |= found
            if found and node.col_offset > 0:
                deferred.append((module, node.lineno, lines[node.lineno - 1] + lines[node.lineno - 2]))
    return graph, deferred


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                return stack[stack.index(t):] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


ENGINE_BINDINGS = {"hetsync.ops", "hetsync.ops_hop", "hetsync.ops_partial"}


def _layer(module):
    if module in ENGINE_BINDINGS:
        return 0, "engine bindings"
    if module.startswith("hetsync.algorithms"):
        return 1, "methods"
    if module.startswith("hetsync.training") or module == "hetsync.switching":
        return 2, "training"
    if module == "hetsync.keras" or module.startswith("hetsync.callbacks"):
        return 3, "Keras and loop front ends"
    if module in ("hetsync", "hetsync.optimizer", "hetsync.observe", "hetsync.saving"):
        return 4, "public API"
    return None


def test_the_import_graph_has_no_cycle():
    graph, _ = import_graph()
    assert len(graph) > 50 and graph["hetsync.training.loop"], "the walk found no modules or no imports"
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    """The check above could not fail if the finder never found one: a made-up graph with a cycle through a
    package's __init__."""
    graph = {"a": {"b.c"}, "b": {"b.d"}, "b.c": set(), "b.d": {"a"}}
    graph["a"].add("b")  # importing b.c runs b/__init__ first
    assert _cycle(graph) in (["a", "b", "b.d", "a"], ["b", "b.d", "a", "b"])
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_layers_are_never_crossed_upwards():
    graph, _ = import_graph()
    upward = []
    for module, targets in graph.items():
        mine = _layer(module)
        for target in targets:
            theirs = _layer(target)
            if mine and theirs and theirs[0] > mine[0]:
                upward.append(f"{module} ({mine[1]}) imports {target} ({theirs[1]})")
    assert not upward, "imports against the layers:\n" + "\n".join(sorted(upward))
    imported = set().union(*(graph[m] for m in ENGINE_BINDINGS))
    assert not imported - ENGINE_BINDINGS, "the engine bindings import hetsync"


def test_few_imports_inside_functions_each_saying_why():
    _, deferred = import_graph()
    assert len(deferred) <= MAX_DEFERRED, f"{len(deferred)} imports inside functions: {deferred}"
    silent = [f"{m}:{line}" for m, line, text in deferred if "deferred" not in text]
    assert not silent, f"imports inside functions without a '# deferred: why' comment: {silent}"
