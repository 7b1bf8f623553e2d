"""The `dialect-proxy` command line (also `python -m proxy`): serve | mock | demo.

Every flag `--some-flag` can also be given as the environment variable `DIALECT_PROXY_SOME_FLAG`
(precedence: flag > environment > config file > default). Booleans accept 1/0/true/false/yes/no.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any, Final

from proxy import __version__
from proxy.build import BUILD
from proxy.server.logs import configure_logging, uvicorn_log_config
from proxy.settings import (
    ENV_PREFIX,
    ConfigError,
    Settings,
    build_settings,
    command_line,
    declared,
    dialect_name,
    dialect_names,
    env_var_name,
    load_config_file,
)

_ARGS_ENV = "DIALECT_PROXY_INTERNAL_WORKER_ARGS"

def _env_name(flag: str) -> str:
    return ENV_PREFIX + flag.upper().replace("-", "_")


def _mock_env(flag: str) -> str:
    """The mock's own variables (DIALECT_PROXY_MOCK_*): it never reads the proxy's, so that a mock started where the
    proxy's DIALECT_PROXY_PORT (or HOST ...) is set does not take the proxy's port."""
    return _env_name("mock-" + flag)


def _add_setting_flags(p: argparse.ArgumentParser) -> None:
    """A flag for each declared setting (proxy/settings.py): its help, default and environment variable from there.
    Values stay strings here: the settings read and check them, so a bad one is named the same way from a flag,
    an environment variable or the file."""
    groups = {"server": p.add_argument_group("server settings (server: in the config file)"),
              "client": p.add_argument_group("client settings (client: in the config file)"),
              "upstream": p.add_argument_group("the single upstream (with --upstream-url; upstreams[] in the config "
                                               "file)")}
    for d in declared():
        group = groups[d.section]
        metavar = d.flag.rpartition("-")[2].upper()
        if d.name == "url":  # several replicas: repeat the flag
            group.add_argument(f"--{d.flag}", action="append", default=None, metavar=metavar, help=d.help())
        elif isinstance(d.default, bool):
            group.add_argument(f"--{d.flag}", nargs="?", const="true", default=None, metavar="BOOL", help=d.help())
        else:
            group.add_argument(f"--{d.flag}", default=None, metavar=metavar, help=d.help())


def parser() -> argparse.ArgumentParser:
    from proxy.mock import DEFAULT_DIALECT

    p = argparse.ArgumentParser(
        prog="dialect-proxy",
        description="A proxy that serves OpenAI Chat Completions, Completions, Responses and Anthropic Messages "
                    "from MindIE, Siliconstorm, DeepSeek, engine-API, OpenAI and vLLM upstreams; embeddings and rerank "
                    "from TEI (text-embeddings-inference), vLLM and OpenAI.",
        epilog="Every flag --some-flag can also be set as the environment variable DIALECT_PROXY_SOME_FLAG.",
    )
    p.add_argument("--version", action="version", version=f"dialect-proxy {__version__} ({BUILD})")
    sub = p.add_subparsers(dest="command", metavar="{serve,mock,demo,keys,probe}")

    serve = sub.add_parser("serve", help="run the proxy", description=(
        "Run the proxy. Either one upstream from flags (--upstream-url and --upstream-dialect), or many from a "
        "YAML config file (--config). Flags override the file's server/client settings."),
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(
        "examples:\n"
        "  dialect-proxy serve --upstream-url http://127.0.0.1:1025 --upstream-dialect mindie --full-text\n"
        "  dialect-proxy serve --config proxy.yaml --port 9000\n"
        "  DIALECT_PROXY_UPSTREAM_URL=https://api.deepseek.com DIALECT_PROXY_UPSTREAM_DIALECT=deepseek \\\n"
        "    DIALECT_PROXY_UPSTREAM_API_KEY_ENV=DEEPSEEK_API_KEY dialect-proxy serve\n"
        "Every flag --some-flag can also be set as the environment variable DIALECT_PROXY_SOME_FLAG."))
    # The container's entrypoint is `dialect-proxy serve` (deploy/Dockerfile): `docker run IMAGE --version` lands here.
    serve.add_argument("--version", action="version", version=f"dialect-proxy {__version__} ({BUILD})")
    serve.add_argument("--config", default=None, help=f"YAML config file [env {_env_name('config')}]")
    _add_setting_flags(serve)

    mock = sub.add_parser("mock", help="run the built-in fake upstream for one dialect", description=(
        "Run the built-in fake upstream server. Pick behaviours per request with [mock:...] directives in the last "
        "user message (see proxy/mock/README.md). It reads only its own DIALECT_PROXY_MOCK_* variables, never the "
        "proxy's."), formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(
        "examples:\n"
        "  dialect-proxy mock --dialect mindie --full-text --port 1025\n"
        "  dialect-proxy mock --dialect deepseek --port 1030 --api-key sk-test"))
    mock.add_argument("--host", default=None, help=f"(default 127.0.0.1) [env {_mock_env('host')}]")
    mock.add_argument("--port", default=None, help=f"(default 1025) [env {_mock_env('port')}]")
    mock.add_argument("--dialect", default=None,
                      help=f"dialect to speak: {', '.join(dialect_names())} (default {DEFAULT_DIALECT}) "
                      f"[env {_mock_env('dialect')}]")
    mock.add_argument("--full-text", nargs="?", const="true", default=None, metavar="BOOL",
                      help=f"MindIE fullTextEnabled mode (cumulative text) [env {_mock_env('full-text')}]")
    mock.add_argument("--api-key", default=None,
                      help=f"require this bearer key [env {_mock_env('api-key')}]")
    mock.add_argument("--served-model", default=None,
                      help=f"only accept this model name [env {_mock_env('served-model')}]")
    mock.add_argument("--flavour", default=None,
                      help="a variant of the dialect's server: deepseek `legacy` (the seed document's API: "
                           f"deepseek-chat, deepseek-reasoner as R1) [env {_mock_env('flavour')}]")
    mock.add_argument("--metrics-port", default=None,
                      help="also serve the engine's /metrics on this port, as MindIE's metricsPort does (MindIE "
                           f"only) [env {_mock_env('metrics-port')}]")
    mock.add_argument("--directives", default=None,
                      help="server-wide directives for every inference request, e.g. call_tool (an agent turn "
                           "wherever the request offers tools) or error=503 (proxy/mock/README.md) "
                           f"[env {_mock_env('directives')}]")

    demo = sub.add_parser("demo", help="run a mock MindIE upstream (full-text mode) and the proxy in front of it",
                          description=(
        "Start a mock upstream and the proxy in front of it, and print a curl command and a Python snippet that "
        "talk to it. Stops with Ctrl+C."), formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(
        "examples:\n"
        "  dialect-proxy demo\n"
        "  dialect-proxy demo --dialect deepseek --port 8000"))
    demo.add_argument("--port", default=None,
                      help=f"proxy port (default {DEMO_PORT}, or a free port while that one is taken) "
                           f"[env {_env_name('port')}]")
    demo.add_argument("--mock-port", default=None,
                      help=f"mock upstream port (default: a free port) [env {_env_name('mock-port')}]")
    demo.add_argument("--dialect", default=None,
                      help=f"mock dialect: {', '.join(dialect_names())} (default {DEFAULT_DIALECT}) "
                      f"[env {_mock_env('dialect')}]")
    from proxy.server import keys_command

    keys_command.add_parser(sub, _env_name("state-store"))
    probe = sub.add_parser("probe", help="find out what an upstream speaks and print the config block for it",
                           description=(
        "Talk to an upstream the way the proxy would (a few tiny requests, each bounded in time) and report: "
        "reachable, TLS / client certificate needed, the dialect it speaks (paths that answer, error shapes), its "
        "models, cumulative text (MindIE fullTextEnabled), where reasoning and usage come, streamed tool calls; "
        "then print the config block to use."),
        epilog="example: dialect-proxy probe https://10.0.0.5:1025 --tls-ca-file ca.pem --tls-cert-file client.pem "
               "--tls-key-file client.key")
    probe.add_argument("url", help="the upstream's base URL (with or without /v1)")
    probe.add_argument("--dialect", default=None,
                       help="the dialect you expect the upstream to speak, checked against its answers (another "
                       "dialect: a warning and exit 1) "
                       f"({', '.join(dialect_names())})")
    probe.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    probe.add_argument("--api-key-env", default=None,
                       help="name of the environment variable holding the upstream's API key")
    probe.add_argument("--tls-ca-file", default=None, help="CA bundle to verify an https upstream")
    probe.add_argument("--tls-cert-file", default=None, help="client certificate for mutual TLS")
    probe.add_argument("--tls-key-file", default=None, help="private key of that client certificate")
    probe.add_argument("--tls-verify", nargs="?", const="true", default=None, metavar="BOOL",
                       help="verify the server's certificate (default true)")
    probe.add_argument("--model", default=None, help="model name for the test requests (default: the first listed)")
    probe.add_argument("--prompt", default=None, help="the user message of the test request")
    probe.add_argument("--timeout", default=None, help="seconds each request may take (default 10)")
    return p


def probe_command(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> int:
    from proxy.probe.runner import ProbeOptions, probe
    from proxy.settings import coerce_value

    opts = ProbeOptions(url=args.url)
    if args.dialect:
        opts.dialect = dialect_name("--dialect", args.dialect)
    if args.api_key_env:
        opts.api_key_env = env_var_name("--api-key-env", args.api_key_env)
        opts.api_key = environ.get(opts.api_key_env) or None
        if opts.api_key is None:
            raise ConfigError(f"--api-key-env: environment variable {opts.api_key_env} is not set")
    for flag in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        path = getattr(args, flag)
        if path:
            if not os.path.isfile(path):
                raise ConfigError(f"--{flag.replace('_', '-')}: no such file: {path}")
            setattr(opts, flag, path)
    if bool(opts.tls_cert_file) != bool(opts.tls_key_file):
        raise ConfigError("--tls-cert-file and --tls-key-file go together")
    if args.tls_verify is not None:
        opts.tls_verify = coerce_value("--tls-verify", args.tls_verify, bool)
    if args.timeout is not None:
        opts.timeout = coerce_value("--timeout", args.timeout, float)
    opts.model = args.model
    if args.prompt:
        opts.prompt = args.prompt
    report = asyncio.run(probe(opts))
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False, indent=2))
    else:
        print(report.render())
    return 0 if report.worked() else 1


class StartupError(Exception):
    """A server cannot start (its port is taken): one line, exit status 2."""


def check_port(host: str, port: int, flag: str) -> None:
    """Fail with one line when host:port cannot be listened on (uvicorn would log a bind error and a traceback-free
    but multi-line exit); SO_REUSEADDR as uvicorn sets it, so a port in TIME_WAIT is not mistaken for a taken one."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise StartupError(f"cannot listen on {host}:{port}: {e.strerror} (check --host)") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as e:
            what = "the port is already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
            raise StartupError(f"cannot listen on {host}:{port}: {what} (choose another {flag})") from None


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    given = command_line(vars(args), environ)
    config_path = args.config or environ.get(_env_name("config")) or None
    upstream = given["upstream"]
    if config_path and "url" in upstream:
        raise ConfigError("--config and --upstream-url cannot be used together: give one upstream by flags, or "
                          "many in the file")
    if "url" in upstream and "dialect" not in upstream:
        raise ConfigError(f"--upstream-dialect: required with --upstream-url (one of {', '.join(dialect_names())})")
    if not config_path and "url" not in upstream:
        raise ConfigError("no upstream: give --upstream-url URL --upstream-dialect D, or --config FILE.yaml "
                          "(or try `dialect-proxy demo`)")
    if config_path and upstream:
        stray = next(iter(upstream.items()))
        raise ConfigError(f"{stray[1].where} goes with --upstream-url; in a config file it is "
                          f"upstreams[].{stray[0]}")
    config = load_config_file(config_path) if config_path else None
    return build_settings(config=config, server_overrides=given["server"], client_overrides=given["client"],
                          single_upstream=upstream or None, environ=environ)


def _uvicorn_config(app: Any, host: str, port: int, level: str, **kw: Any) -> Any:
    import uvicorn

    kw.setdefault("http", "httptools")
    return uvicorn.Config(app, host=host, port=port, loop="uvloop", access_log=False, log_level=level,
                          lifespan="on", proxy_headers=False, log_config=uvicorn_log_config(), **kw)


def serve(settings: Settings) -> None:
    import uvicorn

    from proxy.server.app import create_app
    from proxy.server.frontend import frontend_options
    from proxy.state import check_scale_out

    s = settings.server
    check_scale_out(settings)
    check_port(s.host, s.port, "--port")
    configure_logging(s.log_level)
    from proxy.metrics.tracing import check as check_telemetry

    check_telemetry(settings)  # OTEL_* set without the `otel` extra: one line now, not a failure in each worker
    if s.workers > 1:
        from proxy.metrics.definitions import prepare_multiprocess_dir

        prepare_multiprocess_dir()
        uvicorn.run("proxy.__main__:worker_app", factory=True, host=s.host, port=s.port, workers=s.workers,
                    loop="uvloop", access_log=False, log_level=s.log_level, proxy_headers=False,
                    log_config=uvicorn_log_config(),
                    timeout_graceful_shutdown=s.shutdown_grace, **frontend_options(s))  # type: ignore[arg-type]
        return
    from proxy.server.process import ProxyServer

    app = create_app(settings, tune_gc=True)
    config = _uvicorn_config(app, s.host, s.port, s.log_level, timeout_graceful_shutdown=s.shutdown_grace,
                             **frontend_options(s))
    ProxyServer(config, app.state.proxy).run()


def worker_app() -> Any:
    """uvicorn --workers factory: each worker rebuilds the settings from the same argv and environment."""
    from proxy.server.app import create_app

    argv = json.loads(os.environ[_ARGS_ENV])
    args = parser().parse_args(argv)
    settings = settings_from_args(args, os.environ)
    configure_logging(settings.server.log_level)
    return create_app(settings, tune_gc=True)


# The demo's proxy port: fixed, so that a snippet saved from one run works the next (docs/decisions.md "The demo's
# ports"); the port of `serve` and of the README's examples.
DEMO_PORT: Final = 8000
DEMO_MODEL: Final = "demo"  # the model of the demo's snippets


def demo_port(chosen: str | None, default: int = DEMO_PORT) -> tuple[int, str]:
    """(the demo proxy's port, a note for the banner). A port asked for must be free; the default, when taken, gives
    way to a free port (a first command should not fail on it), and the note says so."""
    from proxy.settings import coerce_value

    if chosen:
        port = coerce_value("--port", chosen, int)
        check_port("127.0.0.1", port, "--port")
        return port, ""
    try:
        check_port("127.0.0.1", default, "--port")
    except StartupError:
        port = _free_port()
        return port, f"  (port {default} is taken: this run uses {port}; `dialect-proxy demo --port N` picks one)\n"
    return default, ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def demo(args: argparse.Namespace) -> None:
    import uvicorn

    from proxy.dialects import DIALECTS
    from proxy.mock import DEFAULT_DIALECT
    from proxy.mock import create_app as create_mock
    from proxy.server.app import create_app
    from proxy.server.frontend import frontend_options
    from proxy.settings import coerce_value

    environ = os.environ
    mock_port_value = args.mock_port or environ.get(_env_name("mock-port"))
    # The mock's port is nobody's to keep (only the proxy talks to it): a free one unless asked for.
    mock_port = coerce_value("--mock-port", mock_port_value, int) if mock_port_value else _free_port()
    args.dialect = dialect_name("--dialect", args.dialect or environ.get(_mock_env("dialect")) or DEFAULT_DIALECT)
    check_port("127.0.0.1", mock_port, "--mock-port")
    proxy_port, port_note = demo_port(args.port or environ.get(_env_name("port")))
    full_text = DIALECTS[args.dialect].full_text_mode  # the mode worth seeing where the dialect has one
    # `demo` (the snippets' model) is listed by /v1/models first; "*" routes every other name to the mock as well.
    settings = build_settings(single_upstream={
        "url": f"http://127.0.0.1:{mock_port}", "dialect": args.dialect, "full_text": full_text,
        "name": f"mock-{args.dialect}", "models": [DEMO_MODEL, "*"],
    }, server_overrides={"port": proxy_port})
    configure_logging("info")
    mock_server = uvicorn.Server(_uvicorn_config(create_mock(args.dialect, full_text=full_text), "127.0.0.1",
                                                 mock_port, "warning"))
    proxy_server = uvicorn.Server(_uvicorn_config(create_app(settings, tune_gc=True), "127.0.0.1", proxy_port,
                                                  "warning", **frontend_options(settings.server)))
    base = f"http://127.0.0.1:{proxy_port}/v1"
    try:  # print the snippet for an interpreter that has the openai SDK, so that it works as printed
        import openai  # noqa: F401

        python = sys.executable
        sdk_note = ""
    except ImportError:
        python = "python3"
        sdk_note = "(needs the openai SDK: pip install openai)\n"
    mode = " (fullTextEnabled: cumulative stream text)" if full_text else ""
    print(f"""
dialect-proxy {__version__} demo
  mock {args.dialect} upstream{mode}: http://127.0.0.1:{mock_port}
  proxy, OpenAI API: {base}   (models: {base}/models)
  metrics:           http://127.0.0.1:{proxy_port}/metrics
{port_note}
Try it (the mock speaks {args.dialect}; you speak OpenAI):

curl -sN {base}/chat/completions -H 'Content-Type: application/json' \\
  -d '{{"model": "{DEMO_MODEL}", "stream": true, "stream_options": {{"include_usage": true}},
       "messages": [{{"role": "user", "content": "Hello! [mock:think]"}}]}}'

{sdk_note}{python} - <<'EOF'
from openai import OpenAI
client = OpenAI(base_url="{base}", api_key="unused")
stream = client.chat.completions.create(
    model="{DEMO_MODEL}", stream=True, stream_options={{"include_usage": True}},
    messages=[{{"role": "user", "content": "Hello! [mock:think]"}}])
part = None  # "reasoning" or "answer": each starts on a line of its own
for chunk in stream:
    for choice in chunk.choices:
        reasoning = getattr(choice.delta, "reasoning_content", None)
        for name, text in (("reasoning", reasoning), ("answer", choice.delta.content)):
            if text:
                if name != part:
                    print(("\\n" if part else "") + name + ": ", end="")
                    part = name
                print(text, end="", flush=True)
    if chunk.usage:
        print("\\nusage:", chunk.usage)
EOF

Directives like [mock:think], [mock:tool_calls], [mock:error=503], [mock:raw_timeout] pick upstream behaviours
(see proxy/mock/README.md). Press Ctrl+C to stop.
""", flush=True)

    async def main() -> None:
        # The mock first: the proxy checks its upstream as it starts, and a newcomer's first screen should not say the
        # upstream could not be reached.
        mock_task = asyncio.create_task(mock_server.serve())
        for _ in range(500):  # at most ~5 s
            if mock_server.started or mock_task.done():
                break
            await asyncio.sleep(0.01)
        await asyncio.gather(mock_task, proxy_server.serve())

    asyncio.run(main())


def _mock_metrics_port(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str], host: str,
                       dialect: str) -> int | None:
    """`--metrics-port`: where the mock also serves its engine's /metrics (MindIE's metricsPort), if asked."""
    from proxy.mock.server import has_metrics_port
    from proxy.settings import coerce_value

    given = args.metrics_port or environ.get(_mock_env("metrics-port"))
    if given is None:
        return None
    port: int = coerce_value("--metrics-port", given, int)
    if not has_metrics_port(dialect):
        raise ConfigError(f"--metrics-port: the {dialect} mock has no metrics port (MindIE's has)")
    check_port(host, port, "--metrics-port")
    return port


def mock(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> None:
    from proxy.mock import DEFAULT_DIALECT, run
    from proxy.mock.server import flavours
    from proxy.settings import coerce_value

    host = args.host or environ.get(_mock_env("host")) or "127.0.0.1"
    port = coerce_value("--port", args.port or environ.get(_mock_env("port")) or 1025, int)
    dialect = dialect_name("--dialect", args.dialect or environ.get(_mock_env("dialect")) or DEFAULT_DIALECT)
    full_text = coerce_value("--full-text", args.full_text or environ.get(_mock_env("full-text")) or "false", bool)
    api_key = args.api_key or environ.get(_mock_env("api-key")) or None
    served = args.served_model or environ.get(_mock_env("served-model")) or None
    flavour = args.flavour or environ.get(_mock_env("flavour")) or ""
    directives = args.directives or environ.get(_mock_env("directives")) or None
    if flavour and flavour not in flavours(dialect):
        raise ConfigError(f"--flavour: the {dialect} mock has no flavour {flavour!r} "
                          f"(flavours: {', '.join(flavours(dialect)) or 'none'})")
    check_port(host, port, "--port")
    metrics_port = _mock_metrics_port(args, environ, host, dialect)
    print(f"mock {dialect} upstream{' (full text)' if full_text else ''}{f' ({flavour})' if flavour else ''} on "
          f"http://{host}:{port}" + (f", metrics on http://{host}:{metrics_port}/metrics" if metrics_port else ""),
          flush=True)
    run(host, port, dialect, full_text=full_text, api_key=api_key, served_model=served, flavour=flavour,
        directives=directives, metrics_port=metrics_port)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    args = p.parse_args(argv)
    if not args.command:  # bare `dialect-proxy`: help, not servers
        p.print_help()
        return 0
    try:
        if args.command == "serve":
            settings = settings_from_args(args, os.environ)
            os.environ[_ARGS_ENV] = json.dumps(argv)
            serve(settings)
        elif args.command == "mock":
            mock(args, os.environ)
        elif args.command == "probe":
            return probe_command(args, os.environ)
        elif args.command == "keys":
            from proxy.server import keys_command

            return keys_command.run(args, os.environ, _env_name("state-store"))
        else:
            demo(args)
    except ConfigError as e:
        print(f"dialect-proxy: config error: {e}", file=sys.stderr)
        return 2
    except StartupError as e:
        print(f"dialect-proxy: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
