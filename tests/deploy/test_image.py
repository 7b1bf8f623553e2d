"""The built container image (deploy/Dockerfile), run: `make test-image` builds it and runs these against it
(DIALECT_PROXY_TEST_IMAGE names the image, DIALECT_PROXY_TEST_BUILD the build it must report: python or mypyc).
Excluded from `make test` (marker `image`): they need a Docker daemon and a base image.

Both containers share the host's network and listen on loopback only: the image's own mock upstream
(`dialect-proxy mock`, the same image with another entrypoint) and the proxy in front of it, configured the way
deploy/Dockerfile's header says, with DIALECT_PROXY_* variables. The official SDKs then talk to the container."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from deploy_helpers import promtool

from proxy import __version__
from tests.conftest import answers, free_port, wait_for

pytestmark = pytest.mark.image

IMAGE = os.environ.get("DIALECT_PROXY_TEST_IMAGE", "")
BUILD = os.environ.get("DIALECT_PROXY_TEST_BUILD", "python")


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module", autouse=True)
def _image() -> None:
    if not IMAGE:
        pytest.fail("DIALECT_PROXY_TEST_IMAGE is not set: run `make test-image`")
    if shutil.which("docker") is None or docker("info", check=False).returncode != 0:
        pytest.fail("no Docker daemon to run the image with")


@contextlib.contextmanager
def container(name: str, *args: str) -> Iterator[str]:
    docker("rm", "-f", name, check=False)
    docker("run", "-d", "--name", name, "--network", "host", *args)
    try:
        yield name
    finally:
        docker("rm", "-f", name, check=False)


@contextlib.contextmanager
def proxy_before_mock(tag: str, full_text: bool) -> Iterator[tuple[str, str]]:
    """The image's mock (MindIE) and the image's proxy in front of it: (the proxy's URL, its container's name)."""
    mock_port, port = free_port(), free_port()
    suffix = f"{tag}-{os.getpid()}"
    mode = ["--full-text"] if full_text else []
    with container("dp-test-mock-" + suffix, "--entrypoint", "dialect-proxy", IMAGE, "mock", "--dialect", "mindie",
                   *mode, "--port", str(mock_port)), \
         container("dp-test-proxy-" + suffix,
                   "-e", "DIALECT_PROXY_HOST=127.0.0.1", "-e", f"DIALECT_PROXY_PORT={port}",
                   "-e", f"DIALECT_PROXY_UPSTREAM_URL=http://127.0.0.1:{mock_port}",
                   "-e", "DIALECT_PROXY_UPSTREAM_DIALECT=mindie",
                   "-e", f"DIALECT_PROXY_FULL_TEXT={str(full_text).lower()}",
                   IMAGE) as name:
        url = f"http://127.0.0.1:{port}"
        assert wait_for(answers(url + "/healthz"), timeout=60, interval=0.2), \
            docker("logs", name, check=False).stderr[-2000:]
        yield url, name


@pytest.fixture(scope="module")
def proxy() -> Iterator[tuple[str, str]]:
    with proxy_before_mock("full-text", full_text=True) as started:
        yield started


def test_version_names_the_build() -> None:
    # The entrypoint is `dialect-proxy serve`: its --version answers like the top-level one.
    out = docker("run", "--rm", IMAGE, "--version").stdout.strip()
    assert out == f"dialect-proxy {__version__} ({BUILD})"


def test_no_compiler_in_the_image() -> None:
    """The compiled build compiles in the build stage; the runtime image has its modules and no toolchain."""
    found = docker("run", "--rm", "--entrypoint", "sh", IMAGE, "-c", "command -v cc gcc mypyc || true").stdout
    assert found.strip() == ""


def test_healthz_metrics_and_user(proxy: tuple[str, str]) -> None:
    proxy_url, name = proxy
    assert httpx.get(proxy_url + "/healthz", timeout=5).json() == {"status": "ok", "version": __version__,
                                                                   "build": BUILD}
    assert docker("exec", name, "id", "-u").stdout.strip() == "10001"  # Kubernetes' runAsNonRoot needs non-zero
    text = httpx.get(proxy_url + "/metrics", timeout=5).text
    assert f'dialect_proxy_build_info{{build="{BUILD}"' in text
    check = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_openai_chat_and_responses_through_the_container(proxy: tuple[str, str]) -> None:
    client = openai.OpenAI(base_url=proxy[0] + "/v1", api_key="unused", max_retries=0)
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "Explain caching briefly [mock:think]"}]
    answer = client.chat.completions.create(model="m", messages=messages)
    text = answer.choices[0].message.content or ""
    streamed = "".join(chunk.choices[0].delta.content or ""
                       for chunk in client.chat.completions.create(model="m", messages=messages, stream=True)
                       if chunk.choices)
    # Full-text MindIE streams the whole text so far: the container's proxy sends true deltas, no repeats.
    assert streamed == text and text.startswith("Hello from the mock mindie upstream") and "\ufffd" not in text
    response = client.responses.create(model="m", input="Say hi", temperature=0.3)
    assert response.status == "completed" and response.temperature == 0.3
    events = list(client.responses.create(model="m", input="Say hi", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == response.output_text


def test_anthropic_messages_through_the_container(proxy: tuple[str, str]) -> None:
    client = anthropic.Anthropic(base_url=proxy[0], api_key="unused", max_retries=0)
    message = client.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": "Say hi"}])
    with client.messages.stream(model="m", max_tokens=100, messages=[{"role": "user", "content": "Say hi"}]) as s:
        streamed = "".join(s.text_stream)
    assert message.stop_reason == "end_turn"
    assert message.content[0].type == "text" and message.content[0].text == streamed


def test_docker_stop_lets_a_stream_in_flight_finish() -> None:
    """SIGTERM (the image's STOPSIGNAL) drains: a stream that is under way when `docker stop` comes ends whole,
    and the process exits 0 well inside the grace."""
    with proxy_before_mock("drain", full_text=False) as (url, name):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        stream = client.chat.completions.create(
            model="m", stream=True, messages=[{"role": "user", "content": "Say hi [mock:chunks=30,delay_ms=100]"}])
        first = next(iter(stream))  # the stream is under way
        stopped: dict[str, float] = {}

        def stop() -> None:
            began = time.monotonic()
            docker("stop", "-t", "30", name, timeout=60)
            stopped["seconds"] = time.monotonic() - began

        stopper = threading.Thread(target=stop)
        stopper.start()
        chunks = [first, *stream]
        stopper.join(timeout=60)
        assert chunks[-1].choices and chunks[-1].choices[0].finish_reason == "stop"
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 25
        assert stopped["seconds"] < 30  # ended by the drain, not by Docker's SIGKILL at the grace
        assert docker("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0"
