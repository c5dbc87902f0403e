"""The package's layers, lowest first: a module may import from its own layer and the layers
below it, never from one above (docs/architecture.md draws the same table)."""

import ast
from collections import deque
from collections.abc import Collection
from pathlib import Path

import transformer_mt

LAYERS = [
    # configs, errors, files, locks, devices, the torch build for the driver, the CPU's oneDNN
    # and int8 products, launchers' ranks, sweeps' folders
    {"config", "errors", "files", "run_lock", "device", "torch_builds", "onednn", "int8"}
    | {"shapes", "launch", "sweeps"},
    # how a device runs the model: precision, attention kernels, compile, CPU products
    {"execution"},
    {"data"},  # sources, toy corpus, cleaning, SentencePiece, store, batching
    {"model"},  # pure tensors: encode / decode with a KV cache
    {"checkpoint", "run_dir"},  # the checkpoint format; the run folder's layout
    {"decode"},  # search, sampling, Translator and its backends, loading a run or an export
    {"export"},  # our model as a CTranslate2 or transformers folder (tmt-export)
    {"metrics"},  # sacreBLEU, chrF, tokenized BLEU
    {"train"},  # the loop, loss, schedule, ranks, signals, validation
    {"serve"},  # the HTTP API and page around a Translator
    {"commands"},  # one plain function per tmt-* command
    {"cli"},  # Hydra's edge
]
LEAVES = {"metrics"}  # import nothing of ours at all
PACKAGE = Path(transformer_mt.__file__).parent


def layer_of(module: str) -> str:
    """'transformer_mt.decode.search' -> 'decode'; the package itself -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imported_modules(
    path: Path, package: str, modules: Collection[str] | None = None
) -> list[tuple[int, str]]:
    """(line, module) for every import of the package in the file, at any depth (a function's
    late import counts like one at the top). `from P import name` imports the module P.name
    when that is one of `modules` (without them: when P is the package itself), else P."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                # `from transformer_mt import checkpoint` imports transformer_mt.checkpoint
                name = f"{node.module}.{alias.name}"
                is_module = node.module == package if modules is None else name in modules
                found.append((node.lineno, name if is_module else node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    ours = [(line, module) for line, module in found if module.split(".")[0] == package]
    return list(dict.fromkeys(ours))  # `from P import a, b` is one import of P


def layering_problems(package_dir: Path) -> list[str]:
    """Every import that reaches up a layer, every leaf that imports us, every module that is in
    no layer."""
    package = package_dir.name
    rank = {name: index for index, layer in enumerate(LAYERS) for name in layer}
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        relative = path.relative_to(package_dir.parent).with_suffix("")
        importer = layer_of(".".join(relative.parts))
        if importer in ("", "__init__"):
            continue
        if importer not in rank:
            problems.append(f"{relative}.py: in no layer of tests/test_layers.py")
            continue
        for line, module in imported_modules(path, package):
            imported = layer_of(module)
            where = f"{relative}.py:{line} imports {module}"
            if importer in LEAVES and imported != importer:
                problems.append(f"{where}, but {importer} is a leaf")
            elif imported in rank and rank[imported] > rank[importer]:
                problems.append(f"{where}, a higher layer ({imported} above {importer})")
    return problems


def test_no_module_imports_from_a_higher_layer():
    assert layering_problems(PACKAGE) == []


def test_a_planted_upward_import_is_reported(tmp_path):
    package = tmp_path / "transformer_mt"
    (package / "train").mkdir(parents=True)
    (package / "model.py").write_text("from transformer_mt.train.loss import label_smoothed_loss\n")
    (package / "metrics.py").write_text("import transformer_mt.config\n")
    (package / "train" / "loss.py").write_text("from transformer_mt import model\n")  # downward
    (package / "newcomer.py").write_text("")
    assert layering_problems(package) == [
        "transformer_mt/metrics.py:1 imports transformer_mt.config, but metrics is a leaf",
        "transformer_mt/model.py:1 imports transformer_mt.train.loss, a higher layer "
        "(train above model)",
        "transformer_mt/newcomer.py: in no layer of tests/test_layers.py",
    ]


def module_name(path: Path, package_dir: Path) -> str:
    """'.../transformer_mt/decode/search.py' -> 'transformer_mt.decode.search'; a package's
    __init__.py -> the package."""
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports (late ones too)."""
    files = {module_name(path, package_dir): path for path in sorted(package_dir.rglob("*.py"))}
    graph = {}
    for module, path in files.items():
        imported = set()
        for _, name in imported_modules(path, package_dir.name, files.keys()):
            while name not in files and "." in name:  # `from P.m import f` imports the module P.m
                name = name.rpartition(".")[0]
            imported.add(name)
        graph[module] = imported
    return graph


def shortest_cycle(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """The shortest chain of imports from `start` back to it ([start, ..., start]), or None
    (breadth first; ties go to the first module by name)."""
    reached_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for imported in sorted(graph.get(module, ())):
            if imported == start:
                chain = [module]
                while chain[-1] != start:
                    chain.append(reached_from[chain[-1]])
                return [*reversed(chain), start]
            if imported not in reached_from:
                reached_from[imported] = module
                queue.append(imported)
    return None


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """'import cycle: a -> b -> a' for the shortest cycle through each module that is on one,
    each cycle once, written from its first module by name."""
    cycles = set()
    for start in graph:
        cycle = shortest_cycle(graph, start)
        if cycle is not None:
            ring = cycle[:-1]
            first = ring.index(min(ring))
            ring = ring[first:] + ring[:first]
            cycles.add(" -> ".join([*ring, ring[0]]))
    return [f"import cycle: {cycle}" for cycle in sorted(cycles)]


def test_no_import_cycle_between_modules():
    cycles = import_cycles(import_graph(PACKAGE))
    assert not cycles, "\n".join(cycles)


def test_a_planted_import_cycle_is_reported(tmp_path):
    package = tmp_path / "transformer_mt"
    (package / "decode").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "decode" / "__init__.py").write_text("")
    (package / "model.py").write_text("import torch\n")
    (package / "decode" / "translator.py").write_text(
        "from transformer_mt.model import Transformer\n\n\n"
        "def from_export():\n"  # a late import makes the cycle as well
        "    from transformer_mt.decode.ctranslate2_backend import translator_from_export\n"
    )
    (package / "decode" / "ctranslate2_backend.py").write_text(
        "from transformer_mt.decode import search, translator\n"  # modules, through the package
    )
    (package / "decode" / "search.py").write_text("import transformer_mt.model\n")
    assert import_graph(package) == {
        "transformer_mt": set(),
        "transformer_mt.decode": set(),
        "transformer_mt.decode.ctranslate2_backend": {
            "transformer_mt.decode.search",
            "transformer_mt.decode.translator",
        },
        "transformer_mt.decode.search": {"transformer_mt.model"},
        "transformer_mt.decode.translator": {
            "transformer_mt.decode.ctranslate2_backend",
            "transformer_mt.model",
        },
        "transformer_mt.model": set(),
    }
    assert import_cycles(import_graph(package)) == [
        "import cycle: transformer_mt.decode.ctranslate2_backend -> "
        "transformer_mt.decode.translator -> transformer_mt.decode.ctranslate2_backend"
    ]


def test_a_cycle_is_named_in_import_order_and_once():
    graph = {"c": {"a"}, "a": {"b", "d"}, "b": {"c"}, "d": set(), "e": {"a"}, "f": {"f"}}
    assert import_cycles(graph) == ["import cycle: a -> b -> c -> a", "import cycle: f -> f"]


def test_every_module_a_from_import_names_is_checked(tmp_path):
    package = tmp_path / "transformer_mt"
    package.mkdir()
    (package / "model.py").write_text("from transformer_mt import config, train\n")
    assert layering_problems(package) == [
        "transformer_mt/model.py:1 imports transformer_mt.train, a higher layer (train above model)"
    ]
