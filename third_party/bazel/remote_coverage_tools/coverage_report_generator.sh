#!/bin/sh
echo "coverage is not available in the offline Bazel set-up" >&2
exit 1
