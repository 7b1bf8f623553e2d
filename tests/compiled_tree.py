"""A compiled copy of the working tree: its files (tracked, and untracked ones git does not ignore) copied to DEST,
then setup.py's extensions built in place there (DIALECT_PROXY_COMPILE=mypyc; needs mypy and a C compiler).

    python tests/compiled_tree.py DEST        (`make test-compiled` runs the whole suite in DEST)

Run from a copy, never in the working tree itself: a compiled module is imported in place of its .py, so one left
beside its source would hide every later edit of it. tests/bench/bench.py and tests/bench/instructions.py take
`--compiled` to measure such a copy next to the pure-Python tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(dest: str, src: str = ROOT, python: str = sys.executable) -> str:
    """Copy `src`'s files into `dest` (emptied first) and compile them there; returns `dest`'s absolute path."""
    dest = os.path.abspath(dest)
    shutil.rmtree(dest, ignore_errors=True)
    if os.path.isdir(os.path.join(src, ".git")) or os.path.isfile(os.path.join(src, ".git")):
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=src,
                                capture_output=True, check=True).stdout.decode().split("\0")
    else:  # an exported commit (tests/bench/bench.py export_ref): every file is the commit's
        listed = [os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs]
    for name in listed:
        path = os.path.join(src, name)
        if name and os.path.isfile(path):  # (a deleted file git still lists is skipped)
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copy2(path, os.path.join(dest, name))
    env = {**os.environ, "DIALECT_PROXY_COMPILE": "mypyc"}
    done = subprocess.run([python, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest, env=env,
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"compiling in {dest} failed:\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(build(sys.argv[1]))
