"""The package's layers, lowest first: a module may import from its own layer and the layers
below it, never from one above (docs/architecture.md draws the same table)."""

import ast
from pathlib import Path

import transformer_mt

LAYERS = [
    {"config", "errors", "files", "run_lock", "device"},  # configs, errors, files, locks, devices
    {"data"},  # sources, toy corpus, cleaning, SentencePiece, store, batching
    {"model"},  # pure tensors: encode / decode with a KV cache
    {"checkpoint", "run_dir"},  # the checkpoint format; the run folder's layout
    {"decode"},  # search, sampling, Translator and its backends
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


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, module) for every import of the package in the file, at any depth (a function's
    late import counts like one at the top)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            # `from transformer_mt import checkpoint` imports the module transformer_mt.checkpoint
            module = names[1] if node.module == package and len(names) > 1 else node.module
            found.append((node.lineno, module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, module) for line, module in found if module.split(".")[0] == package]


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
