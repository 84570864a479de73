"""The trainer's absl flags, defined in one place from the fields of `TrainConfig`."""

import dataclasses
import typing

from absl import flags

from trainers.config import TrainConfig, make_config, read_config_file

FLAGS = flags.FLAGS


def _kind(field):
    hint = field.type if not isinstance(field.type, str) else eval(field.type, vars(typing))  # noqa: S307
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def define_flags(config_cls=TrainConfig) -> None:
    """Defines one flag per field of ``config_cls`` (same name, default and help) plus
    ``--config_file``; fields already defined (by another config class) are skipped."""
    if "config_file" not in FLAGS:
        flags.DEFINE_string("config_file", None, "JSON or YAML file of these settings; flags given "
                            "on the command line override it.")
    for field in dataclasses.fields(config_cls):
        if field.name in FLAGS:
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
        else:
            flags.DEFINE_string(field.name, field.default, help_text)


def config_from_flags() -> TrainConfig:
    """Defaults < ``--config_file`` < flags present on the command line."""
    file_values = read_config_file(FLAGS.config_file) if FLAGS.config_file else {}
    return make_config(file_values, present_flags(TrainConfig))


def present_flags(config_cls) -> dict:
    """The fields of ``config_cls`` given on the command line."""
    return {f.name: FLAGS[f.name].value for f in dataclasses.fields(config_cls) if FLAGS[f.name].present}
