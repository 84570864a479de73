"""Programs over the `sa_conv` library. Before TensorFlow loads, hide its C++ INFO and WARNING
logs unless the command line asks for absl's ``--verbosity`` (``-v``) of 1 or more."""

import os
import re
import sys

_verbosity = re.findall(r"(?:--verbosity|-v)[= ](-?\d+)", " ".join(sys.argv[1:]))
if not _verbosity or int(_verbosity[-1]) < 1:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
