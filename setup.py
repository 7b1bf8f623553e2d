"""The optional compiled build. pyproject.toml holds the project; this file only adds C extensions when asked.

    pip install ".[redis]" "mypy>=1.20" "setuptools>=77"           # the build environment: dependencies and mypy
    DIALECT_PROXY_COMPILE=mypyc pip install --no-build-isolation --no-deps --force-reinstall .   # + a C compiler

compiles the request path's modules (COMPILED below, and every upstream spoke: SPOKES) with mypyc, from the same type-checked source: one shared
library per module next to its .py, which Python imports in its place. Without the variable (every default
install, and CI) nothing is compiled and the package is pure Python; both run the same tests (`make
test-compiled` runs the whole suite on a compiled copy of the tree). Measured: docs/speed.md; the before/after
of each change: docs/speed.md.

Not compiled: modules that run once or rarely (start-up, probes, state stores, the mock upstreams), the
error classes (proxy/errors.py: other modules subclass them, which a compiled class forbids) and proxy/server/app.py
(Starlette tells its endpoint functions from ASGI apps by their Python type, and its lifespan is an async generator,
which mypyc cannot compile: the per-request ASGI entry is proxy/server/asgi.py, compiled). proxy/settings.py is compiled
although it runs at start-up: every request reads its settings objects, and a field of a compiled class is a read
in C where one of a Python class is a lookup by name (docs/speed.md).
"""

from __future__ import annotations

import glob
import os

from setuptools import setup

COMPILED = [
    "proxy/gateway/admission.py",
    "proxy/gateway/keys.py",
    "proxy/gateway/limits.py",
    "proxy/server/asgi.py",
    "proxy/hub/canonical.py",
    "proxy/hub/continuity.py",
    "proxy/hub/events.py",
    "proxy/server/frontend.py",
    "proxy/endpoint/exchange.py",
    "proxy/endpoint/inference.py",
    "proxy/endpoint/passthrough.py",
    "proxy/endpoint/record.py",
    "proxy/endpoint/relay.py",
    "proxy/endpoint/request.py",
    "proxy/endpoint/sink.py",
    "proxy/endpoint/structured.py",
    "proxy/endpoint/translate.py",
    "proxy/metrics/local.py",
    "proxy/dialects/mapping.py",
    "proxy/metrics/definitions.py",
    "proxy/metrics/labels.py",
    "proxy/metrics/observer.py",
    "proxy/hub/normalize.py",
    "proxy/hub/params.py",
    "proxy/hub/pipeline.py",
    "proxy/hub/readings.py",
    "proxy/gateway/replicas.py",
    "proxy/gateway/routing.py",
    "proxy/settings.py",
    "proxy/state/base.py",
    "proxy/state/counters.py",
    "proxy/state/memory.py",
    "proxy/hub/sse.py",
    "proxy/gateway/upstream.py",
    "proxy/clients/validate.py",
    "proxy/stream/cumulative.py",
    "proxy/stream/text_lane.py",
    "proxy/stream/think.py",
    "proxy/stream/tool_calls.py",
    "proxy/stream/usage.py",
    "proxy/clients/base.py",
    "proxy/clients/chat.py",
    "proxy/clients/messages.py",
    "proxy/clients/ratelimit.py",
    "proxy/clients/messages_encoder.py",
    "proxy/clients/messages_errors.py",
    "proxy/clients/messages_native.py",
    "proxy/clients/native.py",
    "proxy/clients/responses.py",
    "proxy/clients/responses_compact.py",
    "proxy/clients/responses_events.py",
    "proxy/clients/responses_native.py",
    "proxy/clients/responses_request.py",
    "proxy/clients/signature.py",
    "proxy/clients/tool_ids.py",
    "proxy/dialects/base.py",
]
# Every upstream spoke, by file (proxy/dialects/__init__.py finds them the same way): a new one cannot stay
# interpreted unnoticed.
SPOKES = "proxy/dialects/[!_]*.py"


def compiled() -> list[str]:
    spokes = glob.glob(SPOKES, root_dir=os.path.dirname(os.path.abspath(__file__)))
    return [*COMPILED, *sorted(set(spokes) - set(COMPILED))]


def ext_modules() -> list[object]:
    mode = os.environ.get("DIALECT_PROXY_COMPILE", "")
    if not mode:
        return []
    if mode != "mypyc":
        raise SystemExit(f"DIALECT_PROXY_COMPILE={mode!r}: the only compiler is 'mypyc' (or leave it unset)")
    from mypyc.build import mypycify

    # mypy checks the modules first (pyproject.toml [tool.mypy], strict), with the dependencies' own types: they must
    # be installed in the build environment. Two strict warnings that only follow those types (a `type: ignore` one
    # version needs and the next does not; an Any one returns) must not fail an install. One C file per module (a
    # single one for all takes gcc minutes longer), and no -Werror: a warning of another compiler must not either.
    flags = ["--no-warn-unused-ignores", "--no-warn-return-any"]
    exts = mypycify([*flags, *compiled()], opt_level="3", multi_file=True, group_name="dialect_proxy")
    for ext in exts:
        ext.extra_compile_args = [arg for arg in ext.extra_compile_args if arg != "-Werror"]
    return list(exts)


setup(ext_modules=ext_modules())
