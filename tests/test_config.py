"""tripwire.config: one loader, one naming scheme, precedence option > env > file > preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from tripwire.config import SETTINGS, config_from_file, env_name, load_config
from tripwire.core.budget import Limits
from tripwire.core.policy import SEED_POLICY, KeyMode, LoopPolicy
from tripwire.errors import ConfigError

KEY = "0123456789abcdef0123456789abcdef"


def _toml(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_defaults_without_any_setting() -> None:
    config = load_config(env={})
    assert config.policy == LoopPolicy()
    assert config.limits is None and config.digest_key is None
    assert (config.max_traces, config.idle_ttl_s) == (None, None)
    assert config.files == ()


def test_precedence_option_over_env_over_policy_file_over_config_file(tmp_path: Path) -> None:
    config_file = _toml(tmp_path, "tripwire.toml", """
version = 1
preset = "seed"
[policy]
window = 20
threshold = 6
min_repeats = 5
[limits]
max_tool_calls = 40
max_steps = 9
""")
    policy_file = _toml(tmp_path, "policy.toml", """
version = 1
[policy]
window = 15
threshold = 5
""")
    env = {
        "TRIPWIRE_CONFIG": config_file,
        "TRIPWIRE_POLICY": policy_file,
        "TRIPWIRE_THRESHOLD": "4",
        "TRIPWIRE_MAX_TOOL_CALLS": "30",
    }
    config = load_config({"threshold": 3}, env=env)
    p = config.policy
    assert p.name == "seed"                       # the config file's preset
    assert p.min_repeats == 5                     # the config file alone sets it
    assert p.window == 15                         # the policy file over the config file
    assert p.threshold == 3                       # the option over the variable
    assert config.limits is not None
    assert (config.limits.max_tool_calls, config.limits.max_steps) == (30, 9)
    assert config.files == (config_file, policy_file)
    assert load_config(env=env).policy.threshold == 4  # the variable over both files


def test_preset_from_env_and_option() -> None:
    assert load_config(env={"TRIPWIRE_PRESET": "seed"}).policy == SEED_POLICY
    assert load_config({"preset": "default"}, env={"TRIPWIRE_PRESET": "seed"}).policy == LoopPolicy()
    assert load_config({"policy": SEED_POLICY}, env={"TRIPWIRE_WINDOW": "12"}).policy is SEED_POLICY


def test_every_scalar_setting_has_its_variable() -> None:
    for setting in SETTINGS.values():
        assert setting.env == env_name(setting.name) == "TRIPWIRE_" + setting.name.upper()


@pytest.mark.parametrize(
    ("var", "value", "attr", "expected"),
    [
        ("TRIPWIRE_WINDOW", "12", "window", 12),
        ("TRIPWIRE_KEY", "tool", "key", KeyMode.TOOL),
        ("TRIPWIRE_MAX_PERIOD", "off", "max_period", None),
        ("TRIPWIRE_SAME_ERROR", "off", "same_error", None),
        ("TRIPWIRE_FAILURE_SHARE", "0.9", "failure_share", 0.9),
        ("TRIPWIRE_REQUIRE_EVIDENCE", "true", "require_evidence", True),
        ("TRIPWIRE_CONFIRM", "2", "confirm", 2),
    ],
)
def test_policy_variables(var: str, value: str, attr: str, expected: object) -> None:
    assert getattr(load_config(env={var: value}).policy, attr) == expected


def test_limits_variables_and_tool_caps() -> None:
    config = load_config(env={
        "TRIPWIRE_MAX_STEPS": "20", "TRIPWIRE_MAX_DURATION_S": "300",
        "TRIPWIRE_TOOL_CAPS": "send_email=1 search=8", "TRIPWIRE_MAX_COST_USD": "off",
    })  # fmt: skip
    assert config.limits is not None
    assert (config.limits.max_steps, config.limits.max_duration_s) == (20, 300.0)
    assert dict(config.limits.tool_caps) == {"send_email": 1, "search": 8}
    assert config.limits.max_cost_usd is None


def test_code_limits_win_field_by_field() -> None:
    config = load_config({"limits": Limits(max_tool_calls=7)},
                         env={"TRIPWIRE_MAX_TOOL_CALLS": "3", "TRIPWIRE_MAX_STEPS": "4"})
    assert config.limits is not None
    assert (config.limits.max_tool_calls, config.limits.max_steps) == (7, 4)


def test_the_full_configuration_file(tmp_path: Path) -> None:
    (tmp_path / "key").write_text(KEY + "\n")
    path = _toml(tmp_path, "tripwire.toml", """
version = 1
[policy]
polling_tools = ["job_status"]
[normalizer]
volatile_keys_add = ["cursor"]
[limits]
max_tool_calls = 40
[limits.tool_caps]
send_email = 1
[limits.levels]
advise = 0.7
[digest]
key_file = "key"
[engine]
max_traces = 500
idle_ttl_s = 60
[serve]
listen = "127.0.0.1:4318"
""")
    config = load_config({"config": path}, env={})
    assert config.policy.polling_tools == frozenset({"job_status"})
    assert "cursor" in config.normalizer.volatile_keys
    assert config.limits is not None and config.limits.tool_caps["send_email"] == 1
    assert config.limits.levels.advise == 0.7
    assert config.digest_key == KEY.encode()  # relative to the file, newline stripped
    assert (config.max_traces, config.idle_ttl_s) == (500, 60.0)
    assert config.serve["listen"] == "127.0.0.1:4318"


@pytest.mark.parametrize(
    ("text", "field", "accepted"),
    [
        ("version = 1\n[limts]\nmax_steps = 1\n", "limts", "limits"),
        ("version = 1\n[limits]\nmax_step = 1\n", "limits.max_step", "max_steps"),
        ("version = 1\n[digest]\nkey = 'x'\n", "digest.key", "key_file"),
        ("version = 1\n[engine]\nmax_trace = 1\n", "engine.max_trace", "max_traces"),
    ],
)
def test_unknown_sections_and_keys_are_named_with_the_accepted_ones(
    tmp_path: Path, text: str, field: str, accepted: str
) -> None:
    path = _toml(tmp_path, "tripwire.toml", text)
    with pytest.raises(ConfigError) as info:
        load_config({"config": path}, env={})
    assert info.value.field == field
    assert accepted in str(info.value) and path in str(info.value)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"version": 1, "policy": {"window": 10**22}}, "policy.window"),
        ({"version": 1, "limits": {"max_tool_calls": -1}}, "limits.max_tool_calls"),
        ({"version": 1, "limits": {"max_cost_usd": float("nan")}}, "limits.max_cost_usd"),
        ({"version": 1, "limits": {"tool_timeout_s": 1e10}}, "limits.tool_timeout_s"),
        ({"version": 1, "limits": {"tool_caps": {"send": -1}}}, "limits.tool_caps.send"),
        ({"version": 1, "limits": {"levels": {"advise": 2}}}, "limits.levels.advise"),
        ({"version": 1, "engine": {"max_traces": 0}}, "engine.max_traces"),
    ],
)
def test_file_values_are_checked_at_load(data: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_file(data, "tripwire.toml")
    assert info.value.field == field


def test_option_errors_use_the_option_name() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"window": 0}, env={}, option_name=lambda k: "--" + k)
    assert info.value.field == "--window"
    with pytest.raises(ConfigError) as info:
        load_config({"windw": 3}, env={})
    assert info.value.field == "windw="


def test_a_window_below_the_threshold_names_the_window() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"TRIPWIRE_WINDOW": "3"})
    assert info.value.field == "TRIPWIRE_WINDOW" and "threshold" in str(info.value)


def test_digest_key_from_the_environment(tmp_path: Path) -> None:
    assert load_config(env={"TRIPWIRE_DIGEST_KEY": KEY}).digest_key == KEY.encode()
    key_file = tmp_path / "k"
    key_file.write_bytes(KEY.encode() + b"\n")
    assert load_config(env={"TRIPWIRE_DIGEST_KEY_FILE": str(key_file)}).digest_key == KEY.encode()
    with pytest.raises(ConfigError) as info:
        load_config(env={"TRIPWIRE_DIGEST_KEY": KEY, "TRIPWIRE_DIGEST_KEY_FILE": str(key_file)})
    assert KEY not in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(env={"TRIPWIRE_DIGEST_KEY_FILE": str(tmp_path / "missing")})
    assert info.value.field == "TRIPWIRE_DIGEST_KEY_FILE"


def test_a_preset_name_in_tripwire_policy_points_at_tripwire_preset() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"TRIPWIRE_POLICY": "seed"})
    assert info.value.field == "TRIPWIRE_POLICY" and "TRIPWIRE_PRESET=seed" in str(info.value)


def test_volatile_keys_and_polling_tools_accumulate(tmp_path: Path) -> None:
    path = _toml(tmp_path, "p.toml", 'version = 1\n[policy]\npolling_tools = ["a"]\n'
                 '[normalizer]\nvolatile_keys_add = ["cursor"]\n')
    config = load_config(
        {"policy_file": path, "polling_tools": ["c"], "volatile_keys": ["-cursor", "page"]},
        env={"TRIPWIRE_POLLING_TOOLS": "b", "TRIPWIRE_VOLATILE_KEYS": "-now"},
    )
    assert config.policy.polling_tools == frozenset({"a", "b", "c"})
    keys = config.normalizer.volatile_keys
    assert "page" in keys and "cursor" not in keys and "now" not in keys


def test_docs_config_lists_every_variable_and_option() -> None:
    import typer.main

    from tripwire.cli import app
    from tripwire.otel.setup import ENV_VARS

    text = (Path(__file__).resolve().parent.parent / "docs" / "config.md").read_text()
    for var in ENV_VARS:
        assert f"`{var}`" in text, var
    group = typer.main.get_command(app)
    for name in ("replay", "calibrate", "serve", "report"):
        command = group.commands[name]  # type: ignore[attr-defined]
        for param in command.params:
            if param.envvar:
                assert f"`{param.envvar}`" in text, (name, param.envvar)
            for opt in getattr(param, "opts", ()):
                if opt.startswith("--") and opt not in ("--help", "--policy-preset"):
                    assert f"`{opt}" in text, (name, opt)


def test_serve_settings_option_over_variable_over_file_over_default(tmp_path: Path) -> None:
    from tripwire.config import SERVE_SETTINGS, load_serve_config

    path = _toml(tmp_path, "tripwire.toml", 'version = 1\n[limits]\nmax_steps = 9\n[serve]\nport = 5001\n'
                 'host = "0.0.0.0"\nreorder_ms = 50\ntoken_file = "secrets/tokens"\n'
                 'webhook_url = ["http://a", "http://b"]\n')
    config, serve = load_serve_config({"config": path, "port": 5003}, env={"TRIPWIRE_PORT": "5002", "TRIPWIRE_REORDER_MS": "70"})
    assert serve["port"] == 5003  # option
    assert serve["reorder_ms"] == 70  # variable over file
    assert serve["host"] == "0.0.0.0"  # file over default
    assert serve["max_body_mb"] == SERVE_SETTINGS["max_body_mb"].default == 16  # default
    assert serve["token_file"] == str(tmp_path / "secrets" / "tokens")  # relative to the file
    assert serve["webhook_url"] == ("http://a", "http://b")
    assert config.limits is not None and config.limits.max_steps == 9  # the same file's [limits]
    _, serve = load_serve_config({"config": path}, env={"TRIPWIRE_WEBHOOK_URL": "http://c http://d"})
    assert serve["port"] == 5001 and serve["webhook_url"] == ("http://c", "http://d")


def test_serve_errors_name_the_field(tmp_path: Path) -> None:
    from tripwire.config import load_serve_config

    path = _toml(tmp_path, "tripwire.toml", "version = 1\n[serve]\nport = 70000\n")
    with pytest.raises(ConfigError) as info:
        load_serve_config({"config": path}, env={})
    assert info.value.field == "serve.port" and path in str(info.value) and "65535" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_serve_config({"max_inflight": "many"}, env={})
    assert info.value.field == "--max-inflight"
    with pytest.raises(ConfigError) as info:
        load_serve_config({}, env={"TRIPWIRE_STATE": "disk"})
    assert info.value.field == "TRIPWIRE_STATE"
    # A secret-looking string is never quoted back.
    with pytest.raises(ConfigError) as info:
        load_serve_config({"pagerduty_routing_key": "  "}, env={})
    assert info.value.field == "--pagerduty-key"
    # instrument() and replay ignore [serve]: a bad serve value is tripwire serve's error only.
    assert load_config({"config": path}, env={}).serve["port"] == 70000


def test_the_limits_file_calibrate_writes_loads_back(tmp_path: Path) -> None:
    # tripwire calibrate --write-limits writes limits_file_text: the loader must read it.
    from tripwire.replay.calibrate import StepLineGroup, learn_step_line, limits_file_text

    line = learn_step_line(list(range(4, 24)), alpha=0.05)
    path = tmp_path / "tripwire.toml"
    path.write_text(limits_file_text(StepLineGroup(group="support", line=line)))
    limits = load_config({"config": path}, env={}).limits
    assert limits is not None and limits.max_tool_calls == line.max_tool_calls


def test_docs_config_gives_each_settings_range_as_the_loader_checks_it() -> None:
    # The table said "from 1 to 2**28" for window while the policy refused anything over 10,000.
    from tripwire.config import SERVE_SETTINGS, SETTINGS

    rows = {
        row.split("|")[2].strip(): row
        for row in (Path(__file__).resolve().parent.parent / "docs" / "config.md").read_text().splitlines()
        if row.startswith("| `TRIPWIRE_")
    }
    checked = 0
    for setting in [*SETTINGS.values(), *SERVE_SETTINGS.values()]:
        section = getattr(setting, "section", "serve")
        row = rows.get(f"`{section}.{setting.name}`")
        if row is None or setting.kind not in ("int", "float"):
            continue
        assert setting.expected() in row, (setting.name, setting.expected(), row)
        checked += 1
    assert checked >= 25


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"version": 1, "preset": "strcit"}, "tripwire.toml: preset must be a preset name (one of ['default', 'seed']), got 'strcit'"),
        ({"version": "1"}, "tripwire.toml: version must be a number, not a string: write version = 1 (without quotes)"),
        ({"version": 2}, "tripwire.toml: file version 2 is not supported by this tripwire"),
    ],
)
def test_a_files_preset_and_version_are_refused_naming_the_file(data: dict, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_file(data, "tripwire.toml")
    assert str(info.value).startswith(says), str(info.value)
