"""A checkout runs without an install: `PYTHONPATH=<checkout> python -m proxy ...` finds its dialect mappings.

The YAML files live in the tree's top-level mappings/ folder, which only an install turns into the package
`proxy.mappings` (pyproject's package-dir). The copy below has no install and no editable finder, so the
loader's source-tree fallback is what finds them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_checkout_without_an_install_loads_every_dialect_mapping(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "proxy", tmp_path / "proxy", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copytree(ROOT / "mappings", tmp_path / "mappings")
    names = sorted(p.stem for p in (ROOT / "mappings").glob("*.yaml"))
    script = (
        "import proxy, importlib.util\n"
        "from proxy.dialects.mapping import load_mapping\n"
        "print(proxy.__file__)\n"
        "print(importlib.util.find_spec('proxy.mappings'))\n"
        f"for name in {names!r}:\n"
        "    print(name, sorted(load_mapping(name).paths))\n"
    )
    # -S: no site module, so no .pth file, so no editable install's finder; the dependencies come from
    # site-packages on PYTHONPATH (which processes no .pth file either).
    env = {"PYTHONPATH": f"{tmp_path}:{sysconfig.get_paths()['purelib']}:{sysconfig.get_paths()['platlib']}",
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-S", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == str(tmp_path / "proxy" / "__init__.py")  # the copy, not the tree the tests run from
    assert lines[1] == "None"  # no install: `proxy.mappings` is not a package here
    loaded = dict(line.split(" ", 1) for line in lines[2:])
    assert sorted(loaded) == names and len(names) >= 6
    assert "'chat'" in loaded["mindie"]
