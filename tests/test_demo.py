"""`dialect-proxy demo` (what README's first command runs): the snippets it prints work as printed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from proxy.__main__ import DEMO_PORT, StartupError, demo_port


def test_demo_prints_snippets_that_work_as_printed(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIALECT_PROXY_")}
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "demo"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        printed = []
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            printed.append(line)
            if "Press Ctrl+C" in line:
                break
        text = "".join(printed)
        assert "Press Ctrl+C" in text, text
        python_snippet = re.search(r"^(\S*python\S*) - <<'EOF'\n(.*?)\nEOF\n", text, re.S | re.M)
        assert python_snippet, text
        time.sleep(0.5)  # the servers start right after the banner
        for _ in range(40):  # bounded wait until the proxy answers
            run = subprocess.run([python_snippet.group(1), "-c", python_snippet.group(2)], capture_output=True,
                                 text=True, timeout=60)  # the interpreter the demo printed
            if run.returncode == 0:
                break
            time.sleep(0.25)
        assert run.returncode == 0, run.stderr
        # reasoning and answer apart, each on a line of its own (the [mock:think] reasoning is reasoning_content)
        lines = run.stdout.splitlines()
        assert lines[0].startswith("reasoning: The user greets me") and lines[0].endswith("politely."), lines
        assert lines[1] == "answer: Hello from the mock mindie upstream! 你好, 世界 🌍.", lines
        assert lines[2].startswith("usage: ") and len(lines) == 3, lines

        # the port: the fixed default unless it was taken (then the banner says so)
        base = re.search(r"proxy, OpenAI API: (http://127\.0\.0\.1:(\d+)/v1)", text)
        assert base, text
        assert int(base.group(2)) == DEMO_PORT or f"port {DEMO_PORT} is taken" in text, text
        # the model the snippets use is the one /v1/models lists first
        models = httpx.get(base.group(1) + "/models", timeout=10).json()["data"]
        assert models[0]["id"] == "demo" and '"model": "demo"' in text and 'model="demo"' in text

        curl = re.search(r"^(curl .*?\}'\n)", text, re.S | re.M)
        assert curl, text
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed; the Python snippet worked")
        out = subprocess.run(["bash", "-c", curl.group(1)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert '"reasoning_content"' in out.stdout and out.stdout.rstrip().endswith("data: [DONE]")
        assert '"choices":[],"usage":{' in out.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rest, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, _ = proc.communicate(timeout=5)
    # The proxy's start-up check found the mock up (it starts first): no "could not be reached" on the first screen.
    log = text + (rest or "")
    assert '"event":"upstream_check"' in log and '"ready":true' in log, log
    assert "upstream_unreachable" not in log, log


def test_the_demo_port_is_fixed_unless_taken() -> None:
    """A snippet saved from one run works the next: the default port, while it is free; a taken default gives way
    to a free port (named in the banner's note), a taken port asked for is an error naming --port."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        port, note = demo_port(None, default=taken)
        assert port != taken and f"port {taken} is taken: this run uses {port}" in note and "--port" in note
        with pytest.raises(StartupError, match="--port"):
            demo_port(str(taken))
    assert demo_port(None, default=taken) == (taken, "")  # free again: the default itself
    assert demo_port(str(taken)) == (taken, "")

