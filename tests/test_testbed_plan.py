"""The testbed as data: names, addresses, commands, validation (no root needed)."""

import pytest

from scaletrain.errors import UserError
from scaletrain.testbed.plan import SWITCH, down_commands, make_testbed, ours, rate_bytes, up_commands
from scaletrain.testbed.run import host_command, host_env


def test_hosts_get_namespaces_and_addresses():
    tb = make_testbed(3, "1gbit", "0.2ms")
    assert tb.namespaces() == [SWITCH, "st-h0", "st-h1", "st-h2"]
    assert [tb.address(i) for i in range(3)] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]


def test_every_link_is_shaped_both_ways():
    cmds = up_commands(make_testbed(2, "100mbit", "1ms"))
    shaped = [c for c in cmds if c[0] == "tc"]
    assert len(shaped) == 4  # each host's eth0 and its switch port
    assert all(c[-6:] == ["delay", "1ms", "rate", "100mbit", "limit", "10000"] for c in shaped)
    assert cmds[0] == ["ip", "netns", "add", SWITCH]  # everything else lives inside the namespaces


def test_without_delay_links_use_a_token_bucket_of_a_quarter_millisecond():
    shaped = [c for c in up_commands(make_testbed(2, "1gbit", "0ms")) if c[0] == "tc"]
    assert shaped[0][-7:] == ["tbf", "rate", "1gbit", "burst", "31250", "latency", "50ms"]
    slow = [c for c in up_commands(make_testbed(2, "20mbit", "0ms")) if c[0] == "tc"]
    assert slow[0][-7:] == ["tbf", "rate", "20mbit", "burst", "4096", "latency", "50ms"]  # at least 4 KB
    assert rate_bytes("100mbit") == 12.5e6 and rate_bytes("80mbit") == 10e6


@pytest.mark.parametrize("hosts, rate, delay, msg", [(1, "1gbit", "1ms", "--hosts"), (2, "fast", "1ms", "--rate"),
                                                     (2, "1gbit", "soon", "--delay")])
def test_bad_settings_are_one_line(hosts, rate, delay, msg):
    with pytest.raises(UserError, match=msg):
        make_testbed(hosts, rate, delay)


def test_only_our_namespaces_are_ever_removed():
    assert ours(["st-sw", "st-h0", "st-h12", "other", "st-hx", "blue"]) == ["st-sw", "st-h0", "st-h12"]
    assert down_commands(["st-h0"]) == [["ip", "netns", "delete", "st-h0"]]


def test_scaletrain_train_gets_node_flags_and_the_link_interface():
    tb = make_testbed(2, "1gbit", "0.2ms")
    argv = host_command(tb, 1, ["scaletrain", "train", "--nproc", "1"], 29500)
    assert argv[:4] == ["ip", "netns", "exec", "st-h1"]
    assert argv[-10:] == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.77.0.1", "--master-port",
                          "29500", "--local-addr", "10.77.0.2"]
    assert host_command(tb, 0, ["ping", "-c1", "10.77.0.2"], 1) == ["ip", "netns", "exec", "st-h0", "ping",
                                                                     "-c1", "10.77.0.2"]
    env = host_env(tb, 0)
    assert env["GLOO_SOCKET_IFNAME"] == "eth0" and "RANK" not in env
