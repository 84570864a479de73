"""Runs pytest on the test files named on the command line (the py_test entry point of BUILD)."""

import sys

import pytest

if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
