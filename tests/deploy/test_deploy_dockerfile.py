"""deploy/Dockerfile: parsed with Docker's own parser (the `dockerfile` package), checked for the rules the image
promises, and its build stage emulated: the files the build context lets through must build the package.

Not covered here: running `docker build` (no daemon or registry on CI machines; `make test-image` builds and runs the
image, tests/deploy/test_image.py). What would make a build fail with the classic builder, on arm64, or without a
public registry is checked on the text instead."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from deploy_helpers import DEPLOY, REPO, missing

DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"


def instructions() -> list[Any]:
    try:
        import dockerfile
    except ImportError:
        missing("the dockerfile parser", "pip install dockerfile")
    return list(dockerfile.parse_file(str(DOCKERFILE)))


def final_stage(cmds: list[Any]) -> list[Any]:
    last_from = max(i for i, c in enumerate(cmds) if c.cmd == "FROM")
    return cmds[last_from:]


def arg_defaults(cmds: list[Any]) -> dict[str, str]:
    out = {}
    for c in cmds:
        if c.cmd == "ARG" and "=" in c.value[0]:
            k, v = c.value[0].split("=", 1)
            out[k] = v
    return out


def env_of(stage: list[Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for c in stage:
        if c.cmd == "ENV":
            env.update(zip(c.value[::2], c.value[1::2], strict=True))
    return env


def test_base_images_are_pinned_python_311_slim_at_runtime() -> None:
    """The runtime is the slim image; the build stage the same Python release with a compiler (the compiled modules
    are built for the runtime's Python, and the venv copied across expects its interpreter at the same path)."""
    cmds = instructions()
    args = arg_defaults(cmds)
    images = [re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], c.value[0]) for c in cmds if c.cmd == "FROM"]
    build, runtime = images[0], images[-1]
    pinned = r"python:(3\.11\.\d+)-{}(@sha256:[0-9a-f]{{64}})?"
    slim = re.fullmatch(pinned.format(r"slim-[a-z]+"), runtime)
    full = re.fullmatch(pinned.format(r"[a-z]+"), build)
    assert slim and full, images
    assert slim.group(1) == full.group(1), "the same Python release in both stages"
    assert runtime.split("-")[-1] == build.split("-")[-1], "the same Debian release in both stages"
    assert args["COMPILE"] == "mypyc", "the image is the compiled build unless asked otherwise"


def test_runtime_stage_rules() -> None:
    stage = final_stage(instructions())
    names = [c.cmd for c in stage]
    user = [c for c in stage if c.cmd == "USER"]
    assert user, "the image must not run as root"
    uid = user[-1].value[0].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric non-root USER (runAsNonRoot can only verify numbers)"
    assert names.index("USER") > max(i for i, n in enumerate(names) if n == "RUN"), "USER after the last RUN"
    entry = [c for c in stage if c.cmd == "ENTRYPOINT"][-1]
    assert entry.json and list(entry.value) == ["dialect-proxy", "serve"], "exec form, so SIGTERM reaches it"
    assert [c.value for c in stage if c.cmd == "EXPOSE"] == [("8000",)]
    env = env_of(stage)
    assert env["DIALECT_PROXY_HOST"] == "0.0.0.0"
    from proxy.settings import env_names

    known = set(env_names())
    assert {k for k in env if k.startswith("DIALECT_PROXY_")} <= known
    assert not any(c.cmd == "ADD" for c in instructions()), "COPY only (ADD fetches URLs and unpacks archives)"
    stop = [c for c in stage if c.cmd == "STOPSIGNAL"]
    assert not stop or stop[-1].value[0] == "SIGTERM"


def test_builds_with_the_classic_builder_on_any_architecture_without_a_public_registry() -> None:
    text = DOCKERFILE.read_text()
    cmds = instructions()
    # BuildKit-only syntax: a `# syntax=` directive (BuildKit fetches that frontend image from Docker Hub),
    # RUN --mount / --network / --security, heredocs, COPY --link / --chmod / --exclude.
    assert not re.search(r"(?im)^#\s*syntax\s*=", text), "the syntax directive pulls a frontend image from a registry"
    assert "<<" not in "".join(c.original for c in cmds if c.cmd in ("RUN", "COPY")), "heredocs are BuildKit-only"
    for c in cmds:
        flags = [f.split("=")[0] for f in c.flags]
        if c.cmd == "RUN":
            assert not flags, f"RUN {flags}: BuildKit-only"
        if c.cmd == "COPY":
            assert set(flags) <= {"--from", "--chown"}, f"COPY {flags}: BuildKit-only"
        if c.cmd == "FROM":
            assert not flags, "no --platform: the image builds for the builder's (or buildx's) architecture"
            assert c.value[0] in ("${PYTHON_IMAGE}", "${BUILD_IMAGE}"), "the base images are build arguments"
    code = "\n".join(c.original for c in cmds)
    assert not re.search(r"(?i)amd64|x86_64|x86-64|arm64|aarch64", code), "nothing architecture-specific"
    args = arg_defaults(cmds)
    assert "PYTHON_IMAGE" in args and "BUILD_IMAGE" in args and "PIP_INDEX_URL" in args
    installs = [c.original for c in cmds if c.cmd == "RUN" and "pip install" in c.original]
    assert installs and all('--index-url "$PIP_INDEX_URL"' in i for i in installs), "pip uses the index build arg"
    assert not any(c.cmd == "RUN" and re.search(r"\b(curl|wget|apt-get|git)\b", c.original) for c in cmds)


def test_classic_builder_ignore_file_equals_buildkits() -> None:
    """The classic builder reads only <context>/.dockerignore; BuildKit prefers deploy/Dockerfile.dockerignore."""
    def rules(path: Path) -> list[str]:
        return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]

    assert rules(REPO / ".dockerignore") == rules(DOCKERIGNORE)


def test_license_file_ships() -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0" in text
    assert 'license = "Apache-2.0"' in (REPO / "pyproject.toml").read_text()


# -- the build context -------------------------------------------------------------------------------------------

def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip("/"))
        rules.append((negate, _pattern_regex(pattern)))
    return rules


def in_context(rel: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories decides."""
    parts = rel.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for negate, regex in rules:
        if any(regex.fullmatch(c) for c in candidates):
            included = negate
    return included


def context_files() -> list[str]:
    rules = dockerignore_rules()
    files = []
    for top in sorted(os.listdir(REPO)):
        if top in (".git", ".venv"):
            continue  # excluded by "*" and never re-included; don't walk them
        path = REPO / top
        if path.is_file():
            if in_context(top, rules):
                files.append(top)
            continue
        for root, dirs, names in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for n in names:
                rel = str((Path(root) / n).relative_to(REPO))
                if in_context(rel, rules):
                    files.append(rel)
    return files


def test_dockerignore_semantics() -> None:
    rules = dockerignore_rules()
    assert in_context("pyproject.toml", rules) and in_context("proxy/metrics/definitions.py", rules)
    assert not in_context(".venv/bin/python", rules) and not in_context("tests/test_metrics.py", rules)
    assert not in_context("proxy/__pycache__/metrics.cpython-311.pyc", rules)


def test_copy_sources_are_in_the_context() -> None:
    rules = dockerignore_rules()
    for c in instructions():
        if c.cmd != "COPY" or any(f.startswith("--from") for f in c.flags):
            continue
        for src in c.value[:-1]:
            assert in_context(src, rules), f"COPY {src}: excluded by {DOCKERIGNORE.name}"
            if src == "README.md" and not (REPO / src).exists():
                continue  # checked below, where the build needs it
            assert (REPO / src).exists(), f"COPY {src}: not in the repository"


def test_build_stage_builds_the_package_from_the_context(tmp_path: Path) -> None:
    """What `RUN pip wheel .` does in the build stage, on exactly the files the context lets through."""
    if not (REPO / "README.md").exists():
        pytest.skip("README.md (pyproject's readme, copied by the Dockerfile) does not exist yet")
    # Offline build (no build isolation): this interpreter's setuptools must be able to build wheels itself.
    import importlib.util

    import setuptools

    major_minor = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
    if major_minor < (70, 1) and importlib.util.find_spec("wheel") is None:
        missing("a setuptools that builds wheels", 'pip install "setuptools>=70.1"')
    ctx = tmp_path / "src"
    for rel in context_files():
        dest = ctx / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((REPO / rel).read_bytes())
    out = tmp_path / "wheels"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "--wheel-dir", str(out), str(ctx)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = out.glob("dialect_proxy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "proxy/metrics/definitions.py" in names and "proxy/__main__.py" in names
    for mapping in (REPO / "mappings").glob("*.yaml"):
        assert f"proxy/mappings/{mapping.name}" in names, "mappings must ship inside the package"
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert re.search(r"^dialect-proxy\s*=\s*proxy\.__main__:main$", entry_points, re.MULTILINE)
