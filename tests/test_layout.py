"""The package's shape: few top-level wings, no import cycle, nothing imported from a higher layer.

Every ``import`` in every module counts, including those inside functions (a lazy import is still a
dependency; it only hides a cycle from the interpreter).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lantern"

# Layers from the bottom up. A module may import its own wing, the ground helpers and any wing of a
# lower layer; wings of one layer (metrics, results) do not import each other.
LAYERS = {
    "errors": 0,
    "checks": 0,
    "rng": 0,
    "files": 0,  # ground helpers
    "models": 1,
    "rules": 2,
    "decoding": 3,
    "metrics": 4,
    "results": 4,
    "training": 5,
    "run": 6,
    "cli": 7,
}
MAX_TOP_LEVEL = 12


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> list[tuple[str, int]]:
    """The lantern modules ``path`` imports, with the line of each import."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name.split(".")[0] == "lantern"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lantern":
            for alias in node.names:  # `from lantern.x import y`: y may be a module of package x
                candidate = f"{node.module}.{alias.name}"
                found.append((candidate if candidate in known else node.module, node.lineno))
    return [(name, line) for name, line in found if name in known]


def wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def graph() -> dict[str, list[tuple[str, int]]]:
    found = modules()
    return {name: imports(path, set(found)) for name, path in found.items()}


def test_lantern_has_at_most_twelve_top_level_modules_and_packages():
    top = sorted({wing(name) for name in modules() if wing(name)})
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} top-level modules and packages: {top}"
    assert set(top) <= set(LAYERS), (
        f"not in any layer (add it to LAYERS with its place): {sorted(set(top) - set(LAYERS))}"
    )


def against_layers(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """``module:line -> target`` for every import of a higher layer or of another wing of the same layer."""
    upward = []
    for name, found in edges.items():
        mine = wing(name)
        for target, line in found:
            theirs = wing(target)
            if mine is None or theirs is None or theirs == mine:
                continue
            ground = LAYERS[mine] == LAYERS[theirs] == 0
            if not ground and LAYERS[theirs] >= LAYERS[mine]:
                upward.append(f"{name}:{line} -> {target}")
    return upward


def test_no_module_imports_from_a_higher_layer_or_a_sibling_wing():
    upward = against_layers(graph())
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_the_layer_check_catches_upward_and_sideways_imports():
    edges = {
        "lantern.models.bundle": [("lantern.rules.neighbours", 3), ("lantern.files", 4)],
        "lantern.metrics.clip": [("lantern.results.record", 7)],
        "lantern.run.job": [("lantern.metrics.fid", 9), ("lantern", 1)],
        "lantern.files": [("lantern.errors", 2)],
    }
    assert against_layers(edges) == [
        "lantern.models.bundle:3 -> lantern.rules.neighbours",
        "lantern.metrics.clip:7 -> lantern.results.record",
    ]


def cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, []):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, []):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_there_is_no_import_cycle():
    edges = {name: sorted({target for target, _ in found}) for name, found in graph().items()}
    assert cycles(edges) == []


@pytest.mark.parametrize(
    "edges, expected",
    [({"a": ["b"], "b": ["a"]}, [["a", "b"]]), ({"a": ["b"], "b": ["c"], "c": []}, []), ({"a": ["a"]}, [["a"]])],
)
def test_the_cycle_finder_finds_cycles(edges, expected):
    assert cycles(edges) == expected


def test_the_walk_sees_lazy_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from lantern.rules import exact\n    import lantern.files\n")
    assert imports(source, {"lantern.rules.exact", "lantern.files"}) == [
        ("lantern.rules.exact", 2),
        ("lantern.files", 3),
    ]


FAMILIES = ("lantern.models.llamagen", "lantern.models.chameleon", "lantern.models.janus", "lantern.models.emu3")
FAMILY_FREE = ("decoding", "rules", "metrics", "results", "run", "cli")
# The run wing's LlamaGen-only tools that still name the family's loaders and reference code directly (they
# reached it through models/bundle.py and models/reference.py before; benchmarks composed from conf/ drop them).
# Any other import of a family from these wings fails.
RUN_TOOLS_ON_LLAMAGEN = {
    # the authors' LANTERN code is LlamaGen's: the comparison with it is a LlamaGen tool by definition
    ("lantern.run.bench.against_reference", "lantern.models.llamagen.reference_code"),
    ("lantern.run.bench.against_reference", "lantern.models.llamagen.reference_layout"),
    ("lantern.run.bench.against_reference", "lantern.models.llamagen.reference_drafter"),  # their drafter's probe
    ("lantern.run.bench.reference_checks", "lantern.models.llamagen.reference_layout"),  # the same tool's checks
    ("lantern.run.bench.reference_checks", "lantern.models.llamagen.reference_drafter"),
    ("lantern.run.evaluate", "lantern.models.llamagen.bundle"),
    ("lantern.run.bench.gpu_check", "lantern.models.llamagen.bundle"),  # its random GPT-XL at real sizes
    ("lantern.run.bench.ar", "lantern.models.llamagen.bundle"),  # AR against LlamaGen's own generate()
}
# Folders under models/ that are families or family-like (world/: the embedded LlamaGen world, its data and
# loaders). text/ is not one: its encoders are a shared service (condition.py reads captions through them).
FAMILY_FOLDERS = (*FAMILIES, "lantern.models.world")


def test_decoders_rules_metrics_and_tables_never_import_a_model_family():
    """A family is a folder: the wings that drive models reach them through lantern.models.target only."""
    found = [
        f"{name}:{line} -> {target}"
        for name, edges in graph().items()
        if wing(name) in FAMILY_FREE
        for target, line in edges
        if target.startswith(FAMILIES) and (name, target) not in RUN_TOOLS_ON_LLAMAGEN
    ]
    assert not found, "\n".join(found)


def generic_model_modules(names) -> list[str]:
    """The modules directly in lantern/models/ (``lantern.models.x``), not in a subfolder."""
    return [name for name in names if name.startswith("lantern.models.") and name.count(".") == 2]


def family_imports_of_generic_modules(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """``module:line -> target`` for every import (lazy ones too) of a family folder by a generic models module."""
    return [
        f"{name}:{line} -> {target}"
        for name in generic_model_modules(edges)
        for target, line in edges[name]
        if any(target == folder or target.startswith(folder + ".") for folder in FAMILY_FOLDERS)
    ]


def test_generic_model_modules_import_no_family_folder():
    """bundle.py, drafter.py, checkpoint.py, llama_parts.py, ... speak of no family: a family's loaders, archs
    and layouts live in its folder, and reach the generic modules, never the reverse."""
    graph_now = graph()
    assert "lantern.models.drafter" in generic_model_modules(graph_now)
    found = family_imports_of_generic_modules(graph_now)
    assert not found, "generic models modules importing a family folder:\n" + "\n".join(found)


def test_the_family_check_catches_direct_and_lazy_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from lantern.models import kv_cache\ndef f():\n    from lantern.models.janus import hf\n")
    known = {"lantern.models.kv_cache", "lantern.models.janus.hf", "lantern.models.world.load"}
    edges = {
        "lantern.models.bundle": imports(source, known),
        "lantern.models.drafter": [("lantern.models.world.load", 7), ("lantern.models.target", 8)],
        "lantern.models.llamagen.bundle": [("lantern.models.bundle", 1)],
        "lantern.models.chameleon.model": [("lantern.models.janus.hf", 2)],
    }
    assert family_imports_of_generic_modules(edges) == [
        "lantern.models.bundle:3 -> lantern.models.janus.hf",
        "lantern.models.drafter:7 -> lantern.models.world.load",
    ]


# The one import allowed between family folders: world/ is the embedded LlamaGen world (a shipped LlamaGen
# checkpoint and its manifest), so its loader builds the bundle with LlamaGen's own loader.
CROSS_FAMILY_ALLOWED = {("lantern.models.world", "lantern.models.llamagen")}


def family_folder(module: str) -> str | None:
    """The family folder ``module`` is in or is, or None."""
    return next((f for f in FAMILY_FOLDERS if module == f or module.startswith(f + ".")), None)


def cross_family_imports(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """``module:line -> target`` for every import (lazy ones too) by a family folder's module of another family
    folder, but the pairs of CROSS_FAMILY_ALLOWED."""
    found = []
    for name, targets in edges.items():
        mine = family_folder(name)
        for target, line in targets:
            theirs = family_folder(target)
            if mine and theirs and theirs != mine and (mine, theirs) not in CROSS_FAMILY_ALLOWED:
                found.append(f"{name}:{line} -> {target}")
    return found


def test_no_family_folder_imports_another():
    """A family is a folder of its own: what two families share lives in a generic models module (row_ends.py,
    llama_parts.py, kv_cache.py, ...), which both import."""
    graph_now = graph()
    assert any(family_folder(name) == "lantern.models.emu3" for name in graph_now)
    found = cross_family_imports(graph_now)
    assert not found, "family folders importing another family folder:\n" + "\n".join(found)


def test_the_cross_family_check_catches_direct_and_lazy_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from lantern.models import row_ends\ndef f():\n    from lantern.models.chameleon import lumina\n"
    )
    known = {"lantern.models.row_ends", "lantern.models.chameleon.lumina", "lantern.models.llamagen.bundle"}
    edges = {
        "lantern.models.emu3.model": imports(source, known),
        "lantern.models.chameleon.bundle": [("lantern.models.chameleon.hf", 1), ("lantern.models.llama_parts", 2)],
        "lantern.models.janus": [("lantern.models.llamagen.gpt", 4)],
        "lantern.models.world.load": [("lantern.models.llamagen.bundle", 5)],
        "lantern.models.llamagen.bundle": [("lantern.models.world.load", 6)],
        "lantern.models.bundle": [("lantern.models.janus.hf", 7)],
    }
    assert cross_family_imports(edges) == [
        "lantern.models.emu3.model:3 -> lantern.models.chameleon.lumina",
        "lantern.models.janus:4 -> lantern.models.llamagen.gpt",
        "lantern.models.llamagen.bundle:6 -> lantern.models.world.load",
    ]


def test_the_llamagen_target_satisfies_the_family_protocol():
    from lantern.models.llamagen.gpt import Transformer, gpt_config
    from lantern.models.target import Target

    assert isinstance(Transformer(gpt_config("GPT-nano", "c2i", 32, vocab_size=64)), Target)


TESTS = Path(__file__).resolve().parent


def imported_test_modules(path: Path, test_modules: set[str]) -> list[str]:
    """``file:line -> module`` for every import (lazy ones too) of a test module (``test_x`` or ``tests.test_x``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in test_modules or (parts[0] == "tests" and len(parts) > 1 and parts[1] in test_modules):
                found.append(
                    f"{path.name}:{node.lineno} -> {'.'.join(parts[:2] if parts[0] == 'tests' else parts[:1])}"
                )
                break
    return found


def test_no_test_file_imports_another_test_file():
    """What tests share lives in helper modules (helpers.py, helpers_<family>.py, family_helpers.py, ...): a test
    file imported by another would have its tests collected twice and its fixtures leak across files."""
    files = sorted(TESTS.glob("test_*.py"))
    assert len(files) > 50
    stems = {path.stem for path in files}
    found = [hit for path in files for hit in imported_test_modules(path, stems)]
    assert not found, "test files importing another test file:\n" + "\n".join(found)


def test_the_test_import_check_catches_direct_lazy_and_package_imports(tmp_path):
    source = tmp_path / "test_a.py"
    source.write_text(
        "import helpers\nfrom helpers_tables import AR\nimport test_b\n"
        "def f():\n    from test_b import x\n    from tests import test_b\n    import tests.test_b as b\n"
    )
    assert imported_test_modules(source, {"test_a", "test_b"}) == [
        "test_a.py:3 -> test_b",
        "test_a.py:5 -> test_b",
        "test_a.py:6 -> tests.test_b",
        "test_a.py:7 -> tests.test_b",
    ]
