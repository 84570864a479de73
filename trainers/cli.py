"""Command-line plumbing shared by every program (``sa-conv-train``, ``-tune``, ``-export``,
``-visualize``, the demo): absl flags defined from one dataclass config type each, a
``--config_file`` (JSON or YAML) that may set any of them, and `run`, which turns the project's
errors (`sa_conv.errors.SaConvError`) into exit code 2 with the message and no traceback.

Precedence: a field's default < the config file < flags given on the command line.

Consoles show progress, results and real warnings; absl's ``--verbosity=1`` (or more) adds the
INFO logs of absl, TensorFlow and Keras (the program packages hide TensorFlow's C++ INFO and
WARNING logs before it loads unless that flag is given).
"""

from __future__ import annotations

import dataclasses
import json
import logging as pylogging
import os
import sys
import typing

from sa_conv.errors import ConfigError, SaConvError


def _hint(field):
    return field.type if not isinstance(field.type, str) else eval(field.type, vars(typing))  # noqa: S307


def _kind(field):
    hint = _hint(field)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _optional(field) -> bool:
    return type(None) in typing.get_args(_hint(field))


def config_field(default, help, choices=None):
    """A dataclass field with the help text (and choices) of its flag."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def define_flags(*config_types) -> None:
    """Defines ``--config_file`` and one absl flag per field of each config type (same name,
    default and help); a field already defined by an earlier type is skipped."""
    from absl import flags

    if "config_file" not in flags.FLAGS:
        flags.DEFINE_string("config_file", None, "JSON or YAML file of these settings; flags given "
                            "on the command line override it.")
    for config_cls in config_types:
        for field in dataclasses.fields(config_cls):
            if field.name in flags.FLAGS:
                continue
            help_text = field.metadata.get("help", field.name)
            choices = field.metadata.get("choices")
            kind = _kind(field)
            if choices:
                flags.DEFINE_enum(field.name, field.default, list(choices), help_text)
            elif kind is bool:
                flags.DEFINE_bool(field.name, field.default, help_text)
            elif kind is int:
                flags.DEFINE_integer(field.name, field.default, help_text)
            elif kind is float:
                flags.DEFINE_float(field.name, field.default, help_text)
            elif kind in (list, tuple):
                flags.DEFINE_list(field.name, None if field.default is None else list(field.default), help_text)
            else:
                flags.DEFINE_string(field.name, field.default, help_text)


def field_names(*config_types) -> list[str]:
    return [f.name for c in config_types for f in dataclasses.fields(c)]


def read_config_file(path: str, *config_types) -> dict:
    """The mapping of setting names to values in a JSON or YAML file; every key must be a field
    of one of ``config_types``."""
    if not os.path.isfile(path):
        raise ConfigError(f"--config_file {path!r} does not exist.")
    with open(path) as f:
        text = f.read()
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            values = yaml.safe_load(text) or {}
        else:
            values = json.loads(text)
    except Exception as exc:
        raise ConfigError(f"--config_file {path!r} is not valid JSON/YAML: {exc}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"--config_file {path!r} must hold a mapping of setting names to values.")
    known = field_names(*config_types)
    unknown = sorted(map(str, set(values) - set(known)))
    if unknown:
        raise ConfigError(f"--config_file {path!r} has unknown keys {unknown}; known: {known}.")
    return values


def present_flags(config_cls) -> dict:
    """The fields of ``config_cls`` given on the command line."""
    from absl import flags

    return {f.name: flags.FLAGS[f.name].value for f in dataclasses.fields(config_cls) if flags.FLAGS[f.name].present}


def settings(config_cls, *all_types) -> dict:
    """The values of ``config_cls``'s fields set by ``--config_file`` (which may also hold the
    fields of ``all_types``) or on the command line, the command line winning."""
    from absl import flags

    path = flags.FLAGS.config_file
    from_file = read_config_file(path, *(all_types or (config_cls,))) if path else {}
    names = set(field_names(config_cls))
    return {**{k: v for k, v in from_file.items() if k in names}, **present_flags(config_cls)}


def make(config_cls, values: dict):
    """``config_cls(**values)`` with a `ConfigError` for wrong names and types, validated when
    the class has ``validate()``."""
    unknown = sorted(set(values) - set(field_names(config_cls)))
    if unknown:
        raise ConfigError(f"Unknown setting(s) {unknown}; known: {field_names(config_cls)}.")
    for field in dataclasses.fields(config_cls):
        if field.name not in values:
            continue
        kind, value = _kind(field), values[field.name]
        if value is None:
            if field.default is not None and not _optional(field):
                raise ConfigError(f"--{field.name} needs a value (default {field.default!r}), got none.")
            continue
        ok = {bool: isinstance(value, bool), int: isinstance(value, int) and not isinstance(value, bool),
              float: isinstance(value, (int, float)) and not isinstance(value, bool),
              str: isinstance(value, str), tuple: isinstance(value, (list, tuple)),
              list: isinstance(value, (list, tuple))}.get(kind, True)
        if not ok:
            wanted = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(kind, "a list")
            raise ConfigError(f"--{field.name} must be {wanted}, got {value!r}.")
    config = config_cls(**values)
    if hasattr(config, "validate"):
        config.validate()
    return config


def run(prog: str, main, *config_types) -> None:
    """Defines the flags of ``config_types`` and runs ``main()`` under absl; a `SaConvError`
    ends the program with exit code 2 and ``prog: error: message`` on standard error."""
    from absl import app, flags

    define_flags(*config_types)
    # --helpshort lists the key flags of the main module: make these flags its key flags.
    for name in ["config_file", *field_names(*config_types)]:
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])

    def wrapped(argv):
        from absl import logging

        if flags.FLAGS["verbosity"].value < 1:
            # Progress, results and real warnings only; INFO logs with --verbosity=1 or more.
            logging.set_verbosity(logging.WARNING)
            pylogging.getLogger("tensorflow").setLevel(pylogging.WARNING)
        if len(argv) > 1:
            print(f"{prog}: error: unexpected arguments {argv[1:]}; settings are --flags.", file=sys.stderr)
            raise SystemExit(2)
        try:
            main()
        except SaConvError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None

    app.run(wrapped)
