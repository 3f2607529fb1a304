"""The strategy registry (comm/registry.py): names to classes imported on use, what each class states before
any process starts, and `create` building the configured one. (That every entry is a comm/strategy.Strategy
and that the --strategy values are the registry's: test_architecture.py.)"""

import subprocess
import sys

import pytest

from scaletrain.comm import registry
from scaletrain.comm.strategy import Strategy
from scaletrain.config import build_config
from scaletrain.distributed.rank import RankInfo


def test_checking_a_strategy_flag_imports_neither_torch_nor_a_strategy():
    code = ("import sys; from scaletrain.comm import spec; spec.check('ps-async', 'topk:0.1'); "
            "print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    assert "scaletrain.comm.registry" in loaded and "torch" not in loaded
    assert not loaded & {path.partition(":")[0] for path in registry.STRATEGIES.values()}


def test_every_entry_names_a_module_and_a_class_in_it():
    for name, path in registry.STRATEGIES.items():
        module, _, cls = path.partition(":")
        assert module.startswith("scaletrain.comm.") and cls, name
        assert registry.strategy_class(name).__module__ == module and registry.strategy_class(name).__name__ == cls


@pytest.mark.parametrize("name, servers, tolerant", [("allreduce", 0, False), ("ring", 0, False),
                                                     ("ps-sync", 2, False), ("ps-async", 2, True),
                                                     ("pipeline", 0, False), ("fsdp", 0, False)])
def test_what_each_strategy_states_before_any_process_starts(name, servers, tolerant):
    cfg = build_config({}, {"strategy": name, "nproc": 5, **({"ps_servers": 2} if name.startswith("ps-") else {})})
    cls = registry.strategy_class(name)
    assert cfg.layout.servers == servers
    assert cls.tolerates_dead_workers is tolerant and cls.agent_per_rank is tolerant
    # the base's create joins one process group on the chosen device; a strategy with roles has its own
    assert ("create" in vars(cls) or any("create" in vars(b) for b in cls.__mro__[1:-1] if b is not Strategy)) \
        == bool(servers)
    if servers:  # a strategy with servers must say how they serve
        assert cls.serve is not Strategy.serve


def test_an_unknown_name_is_not_a_strategy():
    with pytest.raises(KeyError):
        registry.strategy_class("tree")


@pytest.mark.parametrize("name", list(registry.STRATEGIES))
def test_create_builds_the_configured_strategy(name, monkeypatch):
    cls = registry.strategy_class(name)
    monkeypatch.setattr(cls, "create", classmethod(lambda c, cfg, rank: (c, cfg.strategy.name, rank)))
    rank = RankInfo(1, 1, 3, 3)
    assert registry.create(build_config({}, {"strategy": name, "nproc": 3}), rank) == (cls, name, rank)
