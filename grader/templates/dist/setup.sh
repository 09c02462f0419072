#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu): Python 3.11
# or newer with its headers and a C++ compiler (Inductor builds C++ in labs 4 and 6), then an
# environment in $AUTOGRADER_ROOT/venv with the CPU build of the pinned torch and this course
# (written by `grader dist gradescope`).
set -euo pipefail
root="${AUTOGRADER_ROOT:-/autograder}"
source_dir="$(cd "$(dirname "$0")" && pwd)"
apt-get update -qq
if python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    apt-get install -y -qq python3-venv python3-dev g++ >/dev/null
    python=python3
else
    apt-get install -y -qq python3.11 python3.11-venv python3.11-dev g++ >/dev/null
    python=python3.11
fi
"$python" -m venv "$root/venv"
"$root/venv/bin/python" -m pip install --quiet --upgrade pip
"$root/venv/bin/python" -m pip install --quiet "{{ torch }}" \
    --index-url https://download.pytorch.org/whl/cpu
"$root/venv/bin/python" -m pip install --quiet -e "$source_dir"
