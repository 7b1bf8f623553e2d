"""README's "Running it" commands, run as printed (ports swapped for free ones): the mock, the proxy in front of it
with `/readyz` ready (its health check points where the mock answers), and the Python snippet after them, whose
DeepSeek-R1 answer has real content, not only reasoning."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import answers, free_port, wait_for

README = Path(__file__).resolve().parent.parent / "README.md"


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end]


def commands(block: str) -> list[str]:
    """Shell commands of a ```sh block, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip().startswith(".venv/bin/dialect-proxy ")]


def test_running_it_as_printed() -> None:
    text = section("Running it")
    sh = re.search(r"```sh\n(.*?)```", text, re.S)
    assert sh is not None
    cmds = commands(sh.group(1))
    # as printed from a clone, in a shell without an activated virtualenv: the program is .venv's, never a bare name
    bare = [line for line in sh.group(1).splitlines() if line.startswith("dialect-proxy ")]
    assert len(cmds) == 5 and not bare, (cmds, bare)
    mock_cmd = next(c for c in cmds if c.startswith(".venv/bin/dialect-proxy mock"))
    serve_cmd = next(c for c in cmds if c.startswith(".venv/bin/dialect-proxy serve") and "127.0.0.1:1025" in c)
    mock_port, proxy_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIALECT_PROXY_")}
    procs = []
    try:
        for cmd in (mock_cmd, serve_cmd):
            argv = shlex.split(cmd.replace("1025", str(mock_port)).replace("8000", str(proxy_port)))
            procs.append(subprocess.Popen([sys.executable, "-m", "proxy", *argv[1:]], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          stdin=subprocess.DEVNULL))
        base = f"http://127.0.0.1:{proxy_port}"
        assert wait_for(answers(base + "/readyz"), timeout=30), httpx.get(base + "/readyz", timeout=5).text
        snippet = re.search(r"```python\n(.*?)```", text, re.S)
        assert snippet is not None
        code = snippet.group(1).replace("8000", str(proxy_port))
        code = code.replace("print(client.chat.completions.create(", "answer = (client.chat.completions.create(")
        code += "\nprint(repr(answer.choices[0].message.content))\n"
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == repr("Hello from the mock mindie upstream! 你好, 世界 🌍.")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
