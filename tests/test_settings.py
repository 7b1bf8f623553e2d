"""Settings and the command line: every problem is one clear line naming the key; precedence flag > env > file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from proxy.__main__ import parser, settings_from_args
from proxy.gateway.routing import Router
from proxy.settings import ConfigError, build_settings

GOOD = {
    "upstreams": [{
        "name": "r1", "dialect": "mindie", "url": "http://127.0.0.1:1025", "models": ["DeepSeek-R1"],
        "aliases": {"gpt-4o": "DeepSeek-R1"}, "full_text": True, "api_key_env": "MINDIE_KEY",
    }],
    "client": {"reasoning": "reasoning_content"},
}


def test_issue_example_config_loads():
    s = build_settings(config=GOOD, environ={"MINDIE_KEY": "sk-secret-123"})
    u = s.upstreams[0]
    assert (u.name, u.dialect, u.full_text, u.api_key) == ("r1", "mindie", True, "sk-secret-123")
    assert "sk-secret-123" not in repr(s)  # the key never shows in a repr (logs, tracebacks)
    assert s.client.reasoning == "reasoning_content"
    router = Router(s.upstreams)
    assert router.resolve("gpt-4o").upstream_model == "DeepSeek-R1"
    assert router.resolve("DeepSeek-R1").upstream.name == "r1"


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda c: c["upstreams"][0].update(dialct="mindie"), "upstreams[0].dialct: unknown key"),
    (lambda c: c["upstreams"][0].update(dialect="mindy"), "upstreams[0].dialect: 'mindy' is not one of"),
    (lambda c: c["upstreams"][0].update(full_text="sometimes"), "upstreams[0].full_text: expected a boolean"),
    (lambda c: c["upstreams"][0].update(models="x") or c["upstreams"][0].update(models=5),
     "upstreams[0].models: expected a list"),
    (lambda c: c["upstreams"][0].update(url="localhost:1025"), "upstreams[0].url: expected an http"),
    (lambda c: c["upstreams"][0].pop("url"), "upstreams[0].url: missing"),
    (lambda c: c.update(clients={}), "clients: unknown key"),
    (lambda c: c["client"].update(reasoning="think"), "client.reasoning: 'think' is not one of"),
    (lambda c: c.update(server={"idle_timeout": "soon"}), "server.idle_timeout: expected a number"),
    (lambda c: c.update(server={"idle_timeout": 0}), "server.idle_timeout: must be greater than 0"),
])
def test_bad_config_names_the_key(mutate, needle):
    import copy

    config = copy.deepcopy(GOOD)
    mutate(config)
    with pytest.raises(ConfigError) as e:
        build_settings(config=config, environ={"MINDIE_KEY": "k"})
    assert needle in str(e.value)


def test_missing_env_var_names_it():
    with pytest.raises(ConfigError, match=r"upstreams\[0\].api_key_env: environment variable MINDIE_KEY is not set"):
        build_settings(config=GOOD, environ={})


def test_url_accepts_trailing_v1():
    s = build_settings(single_upstream={"url": "http://127.0.0.1:9/v1/", "dialect": "openai"}, environ={})
    assert s.upstreams[0].url == "http://127.0.0.1:9"
    assert Router(s.upstreams).resolve("anything").upstream_model == "anything"


def test_default_route_remembers_names_within_a_bound():
    """The default route's Routes are made once per model name, and the names remembered stay bounded however
    many a client invents (proxy/gateway/routing.py)."""
    from proxy.gateway import routing

    s = build_settings(single_upstream={"url": "http://127.0.0.1:9", "dialect": "openai"}, environ={})
    router = Router(s.upstreams)
    assert router.resolve("m") is router.resolve("m")
    for n in range(routing._WILD_CACHE * 2 + 5):
        route = router.resolve(f"model-{n}")
        assert route.upstream_model == f"model-{n}" and route.upstream is s.upstreams[0]
        assert len(router._wild) <= routing._WILD_CACHE
    assert router.resolve("m").upstream_model == "m"


def test_precedence_flag_over_env_over_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(textwrap.dedent("""
        upstreams: [{dialect: openai, url: "http://127.0.0.1:9"}]
        server: {port: 7001, idle_timeout: 11}
        client: {reasoning: none}
    """))
    args = parser().parse_args(["serve", "--config", str(cfg), "--port", "7003"])
    s = settings_from_args(args, {"DIALECT_PROXY_PORT": "7002", "DIALECT_PROXY_IDLE_TIMEOUT": "12",
                                  "DIALECT_PROXY_CLIENT_REASONING": "reasoning"})
    assert s.server.port == 7003 and s.server.idle_timeout == 12 and s.client.reasoning == "reasoning"
    s = settings_from_args(parser().parse_args(["serve", "--config", str(cfg)]), {})
    assert s.server.port == 7001 and s.client.reasoning == "none"


def test_client_responses_spec_from_file_env_and_flag(tmp_path):
    """client.responses_spec: openai_api by default; open_responses from the file, the environment or the flag; any
    other value stops start-up naming the key and the choices."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text('upstreams: [{dialect: openai, url: "http://127.0.0.1:9"}]\n'
                   'client: {responses_spec: open_responses}\n')
    assert build_settings(config={"upstreams": GOOD["upstreams"]}, environ={"MINDIE_KEY": "k"}
                          ).client.responses_spec == "openai_api"
    assert settings_from_args(parser().parse_args(["serve", "--config", str(cfg)]), {}
                              ).client.responses_spec == "open_responses"
    flagged = parser().parse_args(["serve", "--upstream-url", "http://127.0.0.1:9", "--upstream-dialect", "openai",
                                   "--client-responses-spec", "open_responses"])
    assert settings_from_args(flagged, {}).client.responses_spec == "open_responses"
    env = {"DIALECT_PROXY_UPSTREAM_URL": "http://127.0.0.1:9", "DIALECT_PROXY_UPSTREAM_DIALECT": "openai",
           "DIALECT_PROXY_CLIENT_RESPONSES_SPEC": "open_responses"}
    assert settings_from_args(parser().parse_args(["serve"]), env).client.responses_spec == "open_responses"
    with pytest.raises(ConfigError, match="responses_spec.*'vllm' is not one of"):
        build_settings(config={**GOOD, "client": {"responses_spec": "vllm"}}, environ={"MINDIE_KEY": "k"})


def test_single_upstream_from_environment_only():
    args = parser().parse_args(["serve"])
    s = settings_from_args(args, {"DIALECT_PROXY_UPSTREAM_URL": "http://127.0.0.1:1025",
                                  "DIALECT_PROXY_UPSTREAM_DIALECT": "mindie", "DIALECT_PROXY_FULL_TEXT": "yes",
                                  "DIALECT_PROXY_UPSTREAM_HEALTH_URL": "http://127.0.0.1:1026/health",
                                  "DIALECT_PROXY_UPSTREAM_THINKING_MODELS": "qwq, my-r"})
    u = s.upstreams[0]
    assert u.full_text is True and u.dialect == "mindie" and u.health_url.endswith(":1026/health")
    assert u.thinking_models == ("qwq", "my-r")


def test_config_and_url_together_is_an_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("upstreams: []\n")
    args = parser().parse_args(["serve", "--config", str(cfg), "--upstream-url", "http://127.0.0.1:1"])
    with pytest.raises(ConfigError, match="cannot be used together"):
        settings_from_args(args, {})


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DIALECT_PROXY_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "proxy", *argv], capture_output=True, text=True, timeout=60,
                          env=full_env)


def test_cli_refuses_bad_config_with_one_line_and_no_traceback(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("upstreams:\n  - dialect: mindie\n    url: http://127.0.0.1:1025\n    colour: blue\n")
    r = _cli("serve", "--config", str(cfg))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "dialect-proxy: config error: upstreams[0].colour: unknown key (known keys: name, dialect, url, models, "
        "aliases, full_text, api_key_env, health_url, metrics_url, reasoning_source, thinking_models, "
        "reasoning_replay, keep_upstream_id, response_model, response_format, structured_attempts, max_connections, "
        "passthrough, kinds, tls_ca_file, tls_cert_file, tls_key_file, tls_verify, retries, balance, max_in_flight, "
        "queue_size, "
        "queue_timeout, outlier_failures, outlier_backoff, outlier_backoff_max, health_interval, affinity_load, "
        "affinity_turns)"]
    r = _cli("serve", "--config", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "missing.yaml" in r.stderr
    r = _cli("serve", "--upstream-url", "http://127.0.0.1:1", env={"DIALECT_PROXY_UPSTREAM_API_KEY_ENV": "NOPE",
                                                                  "DIALECT_PROXY_UPSTREAM_DIALECT": "openai"})
    assert r.returncode == 2 and "environment variable NOPE is not set" in r.stderr


def test_cli_help_lists_env_vars():
    r = _cli("serve", "--help")
    assert r.returncode == 0
    for needle in ("--upstream-url", "DIALECT_PROXY_UPSTREAM_URL", "--full-text", "--client-reasoning",
                   "DIALECT_PROXY_SHUTDOWN_GRACE"):
        assert needle in r.stdout


def test_client_api_keys_env_must_be_set():
    with pytest.raises(ConfigError, match="server.api_keys_env: environment variable KEYS is not set"):
        build_settings(config={**GOOD, "server": {"api_keys_env": "KEYS"}}, environ={"MINDIE_KEY": "k"})
    s = build_settings(config={**GOOD, "server": {"api_keys_env": "KEYS"}},
                       environ={"MINDIE_KEY": "k", "KEYS": "sk-one, sk-two,,"})
    assert s.server.api_keys == ("sk-one", "sk-two") and "sk-one" not in repr(s)


def test_gateway_keys_and_replica_urls(tmp_path):
    up = {"dialect": "mindie"}
    s = build_settings(config={"upstreams": [{**up, "url": "http://a:1/v1, http://b:2"}]})
    assert [r.url for r in s.upstreams[0].replicas] == ["http://a:1", "http://b:2"]
    assert [r.name for r in s.upstreams[0].replicas] == ["0", "1"] and s.upstreams[0].url == "http://a:1"
    u = build_settings(config={"upstreams": [{**up, "url": [{"url": "http://a:1", "name": "npu-a",
                                                                "health_url": "http://a:2/health"}],
                                              "balance": "prefix_affinity", "max_in_flight": 8, "queue_size": 4}]}
                       ).upstreams[0]
    assert u.health_url == "http://a:2/health" and u.replicas[0].name == "npu-a" and u.balance == "prefix_affinity"
    assert (u.retries, u.max_in_flight, u.queue_size, u.queue_timeout) == (2, 8, 4, 30.0)
    for bad, message in (
        ({"url": []}, "upstreams\\[0\\].url: expected a URL or a list"),
        ({"url": ["http://a:1", "http://b:1"], "health_url": "http://a:2/h"}, "give each its own health_url"),
        ({"url": [{"url": "http://a:1", "name": "x"}, {"url": "http://b:1", "name": "x"}]}, "used twice"),
        ({"url": [{"url": "http://a:1", "name": "has space"}]}, "metrics label"),
        ({"url": [{"url": "http://a:1", "port": 1}]}, "url\\[0\\].port: unknown key"),
        ({"url": "http://a:1", "balance": "random"}, "balance: 'random' is not one of"),
        ({"url": "http://a:1", "queue_size": 3}, "queue_size: a queue needs max_in_flight"),
        ({"url": "http://a:1", "retries": -1}, "retries: must be at least 0"),
        ({"url": "http://a:1", "affinity_load": 0.5}, "affinity_load: must be at least 1"),
    ):
        with pytest.raises(ConfigError, match=message):
            build_settings(config={"upstreams": [{**up, **bad}]})


def test_api_keys_file_names_keys(tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text("team-a: sk-a\nteam-b: sk-b\n")
    good = {"upstreams": [{"dialect": "mindie", "url": "http://a:1"}]}
    s = build_settings(config={**good, "server": {"api_keys_file": str(keys), "api_keys_env": "K"}},
                       environ={"K": "sk-x,sk-y"})
    assert s.server.api_key_names == ("env-1", "env-2", "team-a", "team-b")
    assert s.server.api_keys == ("sk-x", "sk-y", "sk-a", "sk-b") and "sk-a" not in repr(s)
    keys.write_text("team a: sk-a\n")
    with pytest.raises(ConfigError, match="key name 'team a'"):
        build_settings(config={**good, "server": {"api_keys_file": str(keys)}})
    keys.write_text("- sk-a\n")
    with pytest.raises(ConfigError, match="mapping of key name to key"):
        build_settings(config={**good, "server": {"api_keys_file": str(keys)}})
    with pytest.raises(ConfigError, match="api_keys_file: .*nope.yaml"):
        build_settings(config={**good, "server": {"api_keys_file": str(tmp_path / "nope.yaml")}})


def test_upstream_url_flag_repeated_or_comma_separated():
    args = parser().parse_args(["serve", "--upstream-url", "http://a:1", "--upstream-url", "http://b:2,http://c:3",
                                "--upstream-dialect", "mindie", "--upstream-max-in-flight", "4",
                                "--upstream-queue-size", "8", "--upstream-balance", "prefix_affinity"])
    u = settings_from_args(args, {}).upstreams[0]
    assert [r.url for r in u.replicas] == ["http://a:1", "http://b:2", "http://c:3"]
    assert (u.max_in_flight, u.queue_size, u.balance) == (4, 8, "prefix_affinity")
    env = {"DIALECT_PROXY_UPSTREAM_URL": "http://a:1,http://b:2", "DIALECT_PROXY_UPSTREAM_DIALECT": "openai"}
    assert len(settings_from_args(parser().parse_args(["serve"]), env).upstreams[0].replicas) == 2


_ONE_UPSTREAM = ("--upstream-url", "http://127.0.0.1:9", "--upstream-dialect", "openai")


@pytest.mark.parametrize(("argv", "env", "line"), [
    ((), {"DIALECT_PROXY_PORT": "abc"}, "DIALECT_PROXY_PORT: expected an integer, got 'abc'"),
    (("--idle-timeout", "soon"), {}, "--idle-timeout: expected a number, got 'soon'"),
    ((), {"DIALECT_PROXY_WORKERS": "0"}, "DIALECT_PROXY_WORKERS: must be greater than 0, got 0"),
    (("--upstream-max-in-flight", "-1"), {}, "--upstream-max-in-flight: must be at least 0, got -1"),
    ((), {"DIALECT_PROXY_FULL_TEXT": "sometimes"},
     "DIALECT_PROXY_FULL_TEXT: expected a boolean (true/false, 1/0, yes/no), got 'sometimes'"),
    (("--log-level", "warn"), {},
     "--log-level: 'warn' is not one of debug, info, warning, error, critical (did you mean 'warning'?)"),
    ((), {"DIALECT_PROXY_ALIASES": "gpt-4o"},
     "DIALECT_PROXY_ALIASES: 'gpt-4o' is not client=upstream (e.g. gpt-4o=DeepSeek-R1)"),
])
def test_a_bad_flag_or_variable_is_named_as_given(argv, env, line):
    """`dialect-proxy serve` names the flag or the environment variable a bad value came from, not a key the user
    never typed; the same value from the flag wins over the variable (so the flag's name is the one shown)."""
    r = _cli("serve", *_ONE_UPSTREAM, *argv, env={"DIALECT_PROXY_PORT": "0", **env})  # port 0: should it start
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"dialect-proxy: config error: {line}"]


def test_a_bad_value_in_the_file_is_named_by_its_key_path(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("upstreams:\n  - {dialect: mindie, url: 'http://127.0.0.1:1025'}\n"
                   "  - {dialect: openai, url: 'http://127.0.0.1:9', name: b, retries: many}\nserver: {port: abc}\n")
    r = _cli("serve", "--config", str(cfg))
    assert r.stderr.strip().splitlines() == ["dialect-proxy: config error: server.port: expected an integer, got 'abc'"]
    cfg.write_text(cfg.read_text().replace("port: abc", "port: 0"))
    r = _cli("serve", "--config", str(cfg))
    assert r.stderr.strip().splitlines() == [
        "dialect-proxy: config error: upstreams[1].retries: expected an integer, got 'many'"]
    assert r.returncode == 2


def test_an_unknown_key_gets_a_did_you_mean(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("upstreams:\n  - dialect: mindie\n    url: http://127.0.0.1:1025\n    ful_text: true\n"
                   "server:\n  idle_timout: 5\n")
    r = _cli("serve", "--config", str(cfg))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "dialect-proxy: config error: server.idle_timout: unknown key (did you mean 'idle_timeout'?)"]
    cfg.write_text("upstreams:\n  - dialect: mindie\n    url: http://127.0.0.1:1025\n    ful_text: true\n")
    r = _cli("serve", "--config", str(cfg))
    assert r.stderr.strip().splitlines() == [
        "dialect-proxy: config error: upstreams[0].ful_text: unknown key (did you mean 'full_text'?)"]


def test_invalid_yaml_gives_line_column_and_reason(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("upstreams:\n  - dialect: mindie\n    url: http://127.0.0.1:1025\n   models: [a]\n")
    r = _cli("serve", "--config", str(cfg))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"dialect-proxy: config error: config file {cfg}: not valid YAML at line 4, column 4: expected <block end>, "
        "but found '<block mapping start>' (while parsing a block collection at line 2, column 3)"]
    cfg.write_text('server:\n  host: "127.0.0.1\n')
    r = _cli("serve", "--config", str(cfg))
    assert r.stderr.strip().endswith("not valid YAML at line 3, column 1: found unexpected end of stream "
                                     "(while scanning a quoted scalar at line 2, column 9)")


def test_an_upstream_flag_with_a_config_file_is_refused(tmp_path):
    """With --config, the upstreams are the file's: an upstream flag or variable would be silently ignored."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text('upstreams: [{dialect: openai, url: "http://127.0.0.1:9"}]\n')
    with pytest.raises(ConfigError, match=r"^DIALECT_PROXY_FULL_TEXT goes with --upstream-url; in a config file it "
                                          r"is upstreams\[\]\.full_text$"):
        settings_from_args(parser().parse_args(["serve", "--config", str(cfg)]), {"DIALECT_PROXY_FULL_TEXT": "1"})


def test_every_upstream_setting_has_a_flag():
    """Declared once: the file-only keys of before (reasoning_replay, the outlier and affinity keys ...) have their
    flag and variable too."""
    args = parser().parse_args(["serve", *_ONE_UPSTREAM, "--upstream-reasoning-replay", "strip",
                                "--keep-upstream-id", "--upstream-outlier-backoff", "2.5"])
    u = settings_from_args(args, {"DIALECT_PROXY_UPSTREAM_AFFINITY_TURNS": "3"}).upstreams[0]
    assert (u.reasoning_replay, u.keep_upstream_id, u.outlier_backoff, u.affinity_turns) == ("strip", True, 2.5, 3)
