"""The command line is a table (scaletrain/command.py): each command's module declares its own COMMANDS, and
cli.py builds the parser and dispatches from them, naming no command itself."""

from __future__ import annotations

import sys
import types

from scaletrain import cli
from scaletrain.command import Command


def test_every_command_comes_from_its_own_module_and_cli_names_none():
    table = cli.commands()
    assert list(table)[:3] == ["train", "study", "report"] and len(table) == 17
    assert {c.run.__module__ for c in table.values()} == set(cli.COMMAND_MODULES)
    source = open(cli.__file__).read()
    assert not any(f'"{name}"' in source for name in table)  # no `if args.command == ...` chain


def test_a_command_added_in_one_module_is_parsed_and_run(monkeypatch, capsys):
    module = types.ModuleType("scaletrain_test_hello")

    def add(p):
        p.add_argument("--who", default="world")

    def run(args):
        print(f"hello {args.who}")
        return 0

    module.COMMANDS = (Command("hello", "say hello", add, run),)
    monkeypatch.setitem(sys.modules, "scaletrain_test_hello", module)
    monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "scaletrain_test_hello"))
    assert cli.main(["hello", "--who", "table"]) == 0
    assert capsys.readouterr().out == "hello table\n"
