"""The parameter server's sharding and its statistics (pure functions)."""

from hypothesis import given, strategies as st

from scaletrain.comm.ps.shard import bounds, plan
from scaletrain.comm.ps.stats import summarize


@given(st.lists(st.integers(1, 500), min_size=1, max_size=12), st.integers(1, 6))
def test_shards_cover_every_value_once_and_are_even(sizes, servers):
    decays = [n % 2 == 0 for n in sizes]
    shards = plan(sizes, decays, servers)
    covered = {i: [] for i in range(len(sizes))}
    for shard in shards:
        for piece in shard:
            assert piece.decay == decays[piece.param]  # each piece stays in its parameter's group
            covered[piece.param].append((piece.start, piece.stop))
    for i, n in enumerate(sizes):
        ranges = sorted(covered[i])
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, no overlap
    lengths = [sum(p.numel for p in shard) for shard in shards]
    assert sum(lengths) == sum(sizes) and max(lengths) - min(lengths) <= 1


def test_a_parameter_cut_between_two_servers():
    first, second = plan([10, 4], [True, False], 2)
    assert bounds(14, 2) == [0, 7, 14]
    assert [(p.param, p.start, p.stop) for p in first] == [(0, 0, 7)]
    assert [(p.param, p.start, p.stop) for p in second] == [(0, 7, 10), (1, 0, 4)]


def _server(s, hist, workers, updates=10):
    return {"server": s, "numel": 5, "mode": "ps-async", "updates": updates, "dropped_stale": 1,
            "staleness_hist": hist, "workers": workers, "bytes_sent": 100, "bytes_received": 200}


def test_summary_merges_staleness_and_names_dead_workers_once():
    done = {"pushes": 5, "applied": 5, "fetches": 5, "state": "done", "error": None, "updates_at_end": 10}
    died = {"pushes": 2, "applied": 2, "fetches": 2, "state": "died", "error": "Connection reset by peer",
            "updates_at_end": 4}
    out = summarize([_server(0, {"0": 6, "1": 3}, {"0": done, "1": died}),
                     _server(1, {"1": 1}, {"0": done, "1": died})])
    assert out["staleness"]["pushes"] == 10 and out["staleness"]["mean"] == 0.4
    assert out["staleness"]["p50"] == 0 and out["staleness"]["max"] == 1
    assert out["dead_workers"] == [{"rank": 1, "pushes": 2, "shard_updates_at_death": 4,
                                    "error": "Connection reset by peer"}]
    assert out["dropped_stale"] == 2 and out["server_bytes_received"] == [200, 200]
    assert out["asynchronous"] is True  # the summary line shows staleness for ps-async alone


def test_the_summary_line_names_dead_workers_and_staleness():
    from scaletrain.console.summary import ps_line

    ps = {"mode": "ps-async", "asynchronous": True, "servers": 1, "workers": 3, "dead_workers": [{"rank": 1}],
          "dropped_stale": 0,
          "staleness": {"pushes": 10, "mean": 1.1742, "p90": 2, "max": 11}}
    assert ps_line(ps) == ("ps-async: 1 server, 3 workers (1 died: rank 1); staleness mean 1.17, p90 2, max 11; "
                           "0 dropped")
    sync = {**ps, "mode": "ps-sync", "asynchronous": False, "servers": 2, "dead_workers": []}
    assert ps_line(sync) == "ps-sync: 2 servers, 3 workers"
