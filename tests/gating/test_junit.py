"""Dispatch counts read from JUnit XML reports: the properties the plugin writes, parsed
safely (no entity, no DTD, UTF-8 only), and a report that contradicts itself refused."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.gating import junit, junit_xml
from pytest_arbiter.gating.histogram import HistogramKey
from tests.hostile import assert_clear_error, case_xml, run_cli, suite_xml


@pytest.fixture(params=["stdlib", "lxml"])
def xml_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with junitparser on each XML backend (lxml where installed)."""
    import junitparser.junitparser as backend

    if request.param == "lxml":
        monkeypatch.setattr(backend, "etree", pytest.importorskip("lxml.etree"))
    else:
        monkeypatch.setattr(backend, "etree", ET)
    return str(request.param)


@pytest.mark.parametrize("prolog_check", [True, False])
def test_a_report_with_a_local_dtd_entity_leaks_nothing(
        tmp_path: Path, xml_backend: str, prolog_check: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-TOKEN-42")
    # an external DTD beside the report (a runner uploads both) turns the file into an
    # internal entity, which an attribute may then use
    (tmp_path / "evil.dtd").write_text(
        f'<!ENTITY % file SYSTEM "file://{secret}">\n'
        "<!ENTITY % wrap \"<!ENTITY leak '%file;'>\">\n%wrap;\n")
    report = tmp_path / "report.xml"
    report.write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<!DOCTYPE testsuites [\n<!ENTITY % ext SYSTEM "evil.dtd">\n%ext;\n'
        f'<!ENTITY inner "::error::pwned">\n<!ENTITY direct SYSTEM "file://{secret}">\n]>\n'
        + suite_xml(case_xml("x &leak; &inner;",
                             **{"arbiter:cpu/matmul/k/degraded": 1}) + "<x>&direct;</x>",
                    {"cpu/matmul/k/degraded": 1}))
    if not prolog_check:  # the parser's own configuration must hold on its own
        monkeypatch.setattr(junit_xml, "_check_prolog", lambda text, source: None)
    code, out, err = run_cli("gate", "--baseline", tmp_path / "none.json", report)
    assert_clear_error((code, out, err), report)
    assert "TOP-SECRET" not in out + err and "pwned" not in out + err


def test_an_internal_entity_is_refused(tmp_path: Path, xml_backend: str) -> None:
    report = tmp_path / "report.xml"
    report.write_text('<!DOCTYPE testsuites [<!ENTITY e "::error::pwned">]>' + suite_xml(
        case_xml("x&e;", **{"arbiter:cpu/matmul/k/degraded": 1}),
        {"cpu/matmul/k/degraded": 1}))
    code, out, err = run_cli("gate", "--baseline", tmp_path / "none.json", report)
    assert_clear_error((code, out, err), report, "document type")
    assert "pwned" not in out


@pytest.mark.parametrize(("data", "needle"), [
    (b"\xef\xbb\xbf" + suite_xml("", {}).encode(), "byte order mark"),
    (suite_xml(case_xml("x\xe9"), {}).encode("latin-1"), "is not UTF-8"),
    (b'<?xml version="1.0" encoding="latin-1"?>' + suite_xml("", {}).encode(),
     "declares the encoding 'latin-1'"),
    (suite_xml("", {}).encode("utf-16"), "byte order mark"),
])
def test_a_report_in_another_encoding_is_refused(tmp_path: Path, xml_backend: str,
                                                 data: bytes, needle: str) -> None:
    report = tmp_path / "report.xml"
    report.write_bytes(data)
    assert_clear_error(run_cli("gate", "--baseline", tmp_path / "none.json", report), report,
                       needle)


def test_a_property_name_reads_back_as_its_key() -> None:
    key = HistogramKey("cpu", "matmul", "ns/k", "degraded")
    assert junit.property_name(key) == "arbiter:cpu/matmul/ns/k/degraded"
    assert junit.parse_property(junit.property_name(key)) == key
    assert junit.parse_property("other:cpu/matmul/k/won") is None
    with pytest.raises(ValueError, match="unknown outcome 'wonderful'"):
        junit.parse_property("arbiter:cpu/matmul/k/wonderful")
    with pytest.raises(ValueError, match="is not arbiter:TARGET/OP/SELECTED/OUTCOME"):
        junit.parse_property("arbiter:cpu//k/won")


@pytest.mark.parametrize("value", ["03", "+3", " 3", "3.0", "0", "-1", None])
def test_a_count_is_a_positive_integer_as_the_plugin_writes_it(value: str | None) -> None:
    assert junit.parse_count("p", "3") == 3
    with pytest.raises(ValueError, match="not a positive count"):
        junit.parse_count("p", value)


def test_a_report_gives_its_testcases_counts_and_their_ids(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(suite_xml(case_xml("t1", **{"arbiter:cpu/matmul/k/degraded": 2})
                                + case_xml("t2[gw0]", **{"arbiter:cpu/matmul/k/degraded": 1}),
                                {"cpu/matmul/k/degraded": 3}))
    fleet = junit.read_junit(report)
    key = HistogramKey("cpu", "matmul", "k", "degraded")
    assert fleet.counts == {key: 3}
    assert sorted(junit.ids_for(fleet, [key])[key]) == ["t::t1", "t::t2[gw0]"]


def test_totals_that_disagree_with_the_testcases_are_refused(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(suite_xml(case_xml("t1", **{"arbiter:cpu/matmul/k/degraded": 2}),
                                {"cpu/matmul/k/degraded": 1}))
    with pytest.raises(ArtifactError, match=r"report\.xml: .* the testcases record 2 "
                                            r"dispatches .* but the suite total is 1"):
        junit.read_junit(report)
