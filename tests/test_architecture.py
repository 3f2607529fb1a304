"""The layout's rules, checked on the source (docs/architecture.md): no import cycles, nothing below the
command line imports it, the loop names no strategy, rank and environment are read in distributed/ alone,
perf/ stays below the rest; and one way to do each thing: one owner of the run files' paths, one atomic
write, one formatter of times and sizes, one reader of a configuration's TOML."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
import_graph = importlib.util.module_from_spec(spec)
sys.modules["import_graph"] = import_graph
spec.loader.exec_module(import_graph)

PACKAGE = ROOT / "src" / "scaletrain"
GRAPH = import_graph.graph(PACKAGE)


def test_the_graph_covers_every_module():
    assert "scaletrain.train.loop" in GRAPH and "scaletrain.comm.strategy" in GRAPH
    assert "scaletrain.comm.registry" in GRAPH["scaletrain.train.worker"]


def test_no_import_cycles():
    assert import_graph.cycles(GRAPH) == []


def test_a_cycle_would_be_found():
    assert import_graph.cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


def test_nothing_below_the_command_line_imports_it():
    importers = {m for m, deps in GRAPH.items() if "scaletrain.cli" in deps}
    assert importers == {"scaletrain.__main__"}


def test_the_training_loop_names_no_strategy():
    from scaletrain.comm.registry import STRATEGIES

    for path in (PACKAGE / "train").glob("*.py"):
        text = path.read_text()
        assert not re.search(r"\bps\b|strategy ==|parameter.server", text), path
        for name in STRATEGIES:
            assert f'"{name}"' not in text, (path, name)


def test_no_strategy_is_named_outside_comm():
    """What differs between strategies is asked of the strategy (its class facts, recorded in summary.json:
    lockstep, gradient_buckets, exchange_settings) or of the registry, never decided by its name elsewhere.
    commbench and perf/alphabeta.py time collective patterns (allreduce, ring, ps), which are not strategies."""
    from scaletrain.comm.registry import OPTION_SECTIONS, STRATEGIES

    collective_kinds = {"allreduce", "ring", "ps"}
    sections = set(OPTION_SECTIONS.values())  # "pipeline", "spatial": also the names of config sections
    compared = re.compile(r"strateg[a-z_]*(\.name|\(\))?\)? *(==|!=|in) *[(\"'{]|strateg[a-z_]*\.startswith"
                          r"|\.get\(\"strategy\"\) *(==|!=)")
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "comm":
            continue
        text = path.read_text()
        named = [n for n in STRATEGIES if n not in collective_kinds | sections and f'"{n}"' in text]
        if named or (rel.parts[0] != "commbench" and rel != Path("perf/alphabeta.py") and compared.search(text)):
            offenders.append((str(rel), named))
    assert offenders == []


def test_rank_and_environment_are_read_in_distributed_alone():
    pattern = re.compile(r"os\.environ|os\.getenv|get_rank\(|get_world_size\(")
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if p.relative_to(PACKAGE).parts[0] != "distributed" and pattern.search(p.read_text())]
    assert offenders == []


RUNTIME = ("train", "distributed", "comm")


@pytest.mark.parametrize("lower, higher", [("perf", (*RUNTIME, "profiler", "cli", "study", "report")),
                                           ("analysis", (*RUNTIME, "profiler", "cli", "torch")),
                                           ("models", (*RUNTIME, "cli")),
                                           ("data", (*RUNTIME, "cli"))])
def test_lower_layers_do_not_import_higher_ones(lower, higher):
    for module, deps in GRAPH.items():
        if module.startswith(f"scaletrain.{lower}"):
            bad = [d for d in deps if d.removeprefix("scaletrain.").split(".")[0] in higher]
            assert bad == [], (module, bad)
    if "torch" in higher:  # analysis is pure: it runs on recorded files without torch
        for path in (PACKAGE / lower).glob("*.py"):
            tree = ast.parse(path.read_text())
            names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            assert "torch" not in names, path


def test_the_performance_model_is_pure():
    """predict/model.py and the laws it prices with import neither torch nor torch.distributed's users."""
    pure = ("scaletrain.predict.model", "scaletrain.predict.regress", "scaletrain.predict.calibration",
            "scaletrain.predict.kinds")
    for module in pure:
        path = PACKAGE / (module.removeprefix("scaletrain.").replace(".", "/") + ".py")
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "torch" not in names, module
        deps = [d for d in GRAPH[module] if d.removeprefix("scaletrain.").split(".")[0] in RUNTIME]
        allowed = module == "scaletrain.predict.calibration" and deps == ["scaletrain.distributed.env"]
        assert deps == [] or allowed, module


def test_a_strategy_is_one_module_and_one_registry_line():
    from scaletrain.comm.registry import STRATEGIES, strategy_class
    from scaletrain.comm.spec import STRATEGIES as FLAG_VALUES
    from scaletrain.comm.strategy import Strategy

    assert FLAG_VALUES == tuple(STRATEGIES)
    for name in STRATEGIES:
        cls = strategy_class(name)
        assert issubclass(cls, Strategy) and callable(getattr(cls, "create", None)), name


def _sources() -> dict[str, str]:
    return {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in PACKAGE.rglob("*.py")}


def test_only_rundir_spells_the_path_of_a_run_or_result_file():
    """rundir.py names every file of a run, a study and each command's result (RunDir, StudyDir, PREDICTION,
    ...): a path built from the literal name anywhere else is a second owner of that file."""
    pattern = re.compile(r"""/ ['"](summary|config|epochs|study|prediction|validation|split|graph|commbench)"""
                         r"""\.(json|toml|jsonl)['"]""")
    assert [path for path, text in _sources().items() if path != "rundir.py" and pattern.search(text)] == []


def test_one_atomic_write():
    """Every file replaced in place goes through rundir.replace_atomic (temp file, fsync, rename)."""
    renames = {path for path, text in _sources().items() if re.search(r"os\.(replace|rename)\(", text)}
    # make-imagefolder renames a whole directory tree into place, which no file write can do
    assert renames == {"rundir.py", "data/make_imagefolder.py"}


def test_times_and_sizes_are_formatted_in_fmt_alone():
    pattern = re.compile(r"^\s*def (_ms|_time|_seconds|hms|human|_size|_mib|_gib)\(", re.MULTILINE)
    assert [path for path, text in _sources().items() if path != "fmt.py" and pattern.search(text)] == []


def test_toml_is_parsed_by_the_configs_reader_and_the_data_files_own():
    """A configuration (config.toml, a --config file, study.toml) is read by config/io.py alone; the others
    parse TOML of their own kind (a hardware profile, the published numbers) or, watch, the text of a
    config.toml whose change it follows (through config/io.py's train_table)."""
    readers = {path for path, text in _sources().items() if "tomllib.load" in text}
    assert readers == {"config/io.py", "perf/hardware.py", "predict/devset.py", "watch/reader.py"}


def test_tables_are_grids():
    """A table is a Grid rendered by grid.rich_table (the report's HTML renders the same Grid): every command's
    console, the run's closing summary, a study's results, the graph's summary and watch's live frame."""
    builders = {path for path, text in _sources().items() if re.search(r"\bTable\(", text)}
    assert builders == {"grid.py"}


def test_figures_reach_files_through_the_plot_layer():
    """plot.py writes every figure (atomically, without a date stamp) and holds the phases' colours."""
    writers = {path for path, text in _sources().items() if ".savefig(" in text}
    assert writers == {"plot.py"}
    colours = {path for path, text in _sources().items() if re.search(r'"forward": "#', text)}
    assert colours == {"plot.py"}
