"""Moved to `trainers.data` (the programs' side): this import path works for one release, with a
DeprecationWarning (`sa_conv.aliases.MODULES`)."""

from sa_conv import aliases

aliases.moved_module(__name__)
