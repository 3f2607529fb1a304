"""The flags of `scaletrain train` (and of `study`, which takes the same ones), made from the config's
sections: one flag per field, its --help the docstring written under the field, grouped by section."""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import textwrap

from scaletrain.comm import registry
from scaletrain.comm.pipeline.options import stages_x_replicas
from scaletrain.config.fields import setting_key, settings
from scaletrain.config.schema import SECTIONS

_TYPES = {"int": int, "float": float, "str": str}
LISTED = {"strategy": registry.STRATEGIES}  # the registry itself: its keys, as they are when a flag is built
"""Settings whose values a registry holds: their --help lists the values from it (comm/registry.py)."""


def _number_or_word(text: str) -> float | str:
    """A field that takes a number or a word (`--bucket-cap-mb 0.5` or `auto`)."""
    try:
        return float(text)
    except ValueError:
        return text


def _nproc(text: str) -> int | str:
    """`--nproc N`, or `--nproc KxR`: R replicas of a K-stage pipeline (comm/pipeline/options.py expands it)."""
    kxr = stages_x_replicas(text)
    if kxr is not None:
        return f"{kxr[0]}x{kxr[1]}"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of processes, or KxR (stages x replicas)") from None


@functools.cache  # read from the sources once per process: 0.1 s, and every command's parser asks 5 times
def field_help() -> dict[str, str]:
    """The docstring written under each setting of every section, used as its --help text."""
    helps = {}
    for section in SECTIONS.values():
        keys = {f.name: setting_key(f) for f in settings(section)}
        body = ast.parse(textwrap.dedent(inspect.getsource(section))).body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and node.target.id in keys and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant)):
                helps[keys[node.target.id]] = nxt.value.value.replace("%", "%%")
    return helps


def listed(name: str) -> str:
    """` One of: a, b, c.` for a setting in LISTED, else nothing."""
    return f" One of: {', '.join(LISTED[name])}." if name in LISTED else ""


def add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML file of settings (keys as below, - or _); flags override it")
    add_config_flags(p)


def add_config_flags(p: argparse.ArgumentParser, lists: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> None:
    """One flag per TrainConfig field (help from its docstring); fields in `lists` take a comma list."""
    helps = field_help()
    for name, section in SECTIONS.items():
        group = p.add_argument_group(f"{name} settings", section.__doc__)
        for f in settings(section):
            if setting_key(f) not in skip:
                _add_flag(group, f, helps, setting_key(f) in lists)


def _add_flag(p, f, helps: dict[str, str], is_list: bool) -> None:
    name = setting_key(f)
    flag = "--" + name.replace("_", "-")
    text = helps.get(name, "") + listed(name)
    kind = str(f.type).split("|")[0].strip()
    # SUPPRESS: only flags actually given override the config file
    if is_list:
        p.add_argument(flag, default=argparse.SUPPRESS, metavar="V[,V...]",
                       help=f"axis: comma list of values. {text} (default: {f.default})")
    elif kind == "bool":
        p.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                       help=text)
    else:
        kind_type = _nproc if name == "nproc" else _number_or_word if "str" in str(f.type) else _TYPES[kind]
        p.add_argument(flag, type=kind_type, default=argparse.SUPPRESS,
                       metavar=name.upper(),
                       help=f"{text} (default: {f.default})")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line naming the problem and where the help is, exit 2
    (argparse's own prints the whole usage first: 30 lines for `train`)."""

    def error(self, message: str):
        self.exit(2, f"error: {message}: see `{self.prog} --help`\n")




def as_flags(settings, skip=()) -> list[str]:
    """`--key value` for each of `settings` (`--flag`/`--no-flag` for a switch, floats exactly as repr
    writes them), in their order; None values and the keys in `skip` are left out. What a study and a
    SLURM job spell a configuration as, for the `scaletrain train` they start."""
    out: list[str] = []
    for key, value in settings.items():
        if key in skip or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            out += [flag, repr(value) if isinstance(value, float) else str(value)]
    return out
