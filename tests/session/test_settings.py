"""The plugin's settings, resolved once: the command line over the ini file over the
defaults, paths relative to where each was given, the mode they make."""

from __future__ import annotations

from pathlib import Path

from pytest_arbiter.session.settings import OPTIONS, ArbiterSettings, resolve


def test_settings_precedence_command_line_over_ini(tmp_path: Path) -> None:
    cli = {"arbiter_tune": None, "arbiter_cache": "cli.json", "arbiter_strict": True}
    ini = {"arbiter_tune": True, "arbiter_cache": "ini.json", "arbiter_histogram": "h.json"}
    settings = resolve(lambda d: cli.get(d), lambda k: ini.get(k, ""), tmp_path / "ini",
                       tmp_path / "cwd")
    assert settings.tune and settings.mode == "tune"
    assert settings.cache == tmp_path / "cwd" / "cli.json"
    assert settings.histogram == tmp_path / "ini" / "h.json"
    assert settings.baseline is None
    assert ArbiterSettings(strict=True).mode == "strict"
    assert ArbiterSettings().mode == "static"
    assert {o.ini for o in OPTIONS} >= {"arbiter_tune", "arbiter_cache", "arbiter_no_skip"}
