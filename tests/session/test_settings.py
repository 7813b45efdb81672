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


def test_a_larger_tune_budget_raises_the_round_limit_in_proportion() -> None:
    """A low-confidence pick says to re-tune with a larger --arbiter-tune-budget: for
    fast kernels the round limit, not the seconds, is what stops a comparison, so the
    budget raises both (and the run's arbiter gets the limit)."""
    from pytest_arbiter.gating.histogram import DispatchHistogram
    from pytest_arbiter.plugin import _build_arbiter
    from pytest_arbiter.session.settings import round_limit

    assert [round_limit(b) for b in (None, 0.0, 0.5, 2.0, 10.0)] == [200, 200, 200, 200,
                                                                      1000]
    arbiter = _build_arbiter(ArbiterSettings(tune=True, tune_budget=10.0), None,
                             DispatchHistogram())
    policy = arbiter.config.compare_policy()
    assert (policy.cap_s, policy.max_rounds) == (10.0, 1000)


def test_a_huge_tune_budget_caps_the_round_limit() -> None:
    from pytest_arbiter.session.settings import round_limit

    assert round_limit(1e307) == round_limit(20.0) == 1_000
