"""`dialect-proxy demo` (what README's first command runs): the snippets it prints work as printed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest


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
        assert "Hello from the mock mindie upstream" in run.stdout and "usage:" in run.stdout
        assert "The user greets me" in run.stdout  # the [mock:think] reasoning, delivered as reasoning_content

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
