"""tools/slowest_tests.py: docs/layout.md's slowest-tests table and tier counts from pytest's JUnit XML, checked
on a JUnit file written here by hand (what pytest writes: classname, name, time; skipped/failure children; tests/conftest.py's cpu_s property)."""
from __future__ import annotations

import pytest
from helpers import load_tool

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests"><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="6"
 time="66.6" timestamp="2026-12-02T18:00:00.000000+00:00" hostname="h">
<testcase classname="tests.unit.test_cli" name="test_a" time="0.5" />
<testcase classname="tests.unit.test_cli.TestGroup" name="test_b[x-1]" time="2.25" />
<testcase classname="tests.integration.test_stop" name="test_c" time="12.0"><failure message="boom">x</failure></testcase>
<testcase classname="tests.distributed.test_grad_matrix" name="test_d" time="50.0"><properties><property name="cpu_s" value="81.5" /></properties></testcase>
<testcase classname="tests.distributed.test_grad_matrix" name="test_f" time="0.5"><properties><property name="cpu_s" value="0.25" /></properties></testcase>
<testcase classname="tests.e2e.test_slurm" name="test_e" time="1.85"><skipped message="no cluster" /></testcase>
</testsuite></testsuites>
"""


@pytest.fixture
def slowest():
    return load_tool("slowest_tests")


def test_cases_tiers_and_the_slowest_first(tmp_path, slowest):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    cases, stamp = slowest.read_cases(junit)
    assert stamp.startswith("2026-12-02T18:00")
    assert [(c.test_id, c.tier, c.outcome) for c in cases] == [
        ("tests/unit/test_cli.py::test_a", "unit", "passed"),
        ("tests/unit/test_cli.py::TestGroup::test_b[x-1]", "unit", "passed"),
        ("tests/integration/test_stop.py::test_c", "integration", "failed"),
        ("tests/distributed/test_grad_matrix.py::test_d", "distributed", "passed"),
        ("tests/distributed/test_grad_matrix.py::test_f", "distributed", "passed"),
        ("tests/e2e/test_slurm.py::test_e", "e2e", "skipped")]
    assert [c.cpu_seconds for c in cases] == [None, None, None, 81.5, 0.25, None]
    table = slowest.slowest_table(cases, n=2).splitlines()
    assert table[2:] == ["| 1 | `tests/distributed/test_grad_matrix.py::test_d` | distributed | 50.0 | 81.5 |",
                         "| 2 | `tests/integration/test_stop.py::test_c` | integration | 12.0 | - |"]
    tiers = slowest.tier_table(cases).splitlines()
    assert tiers[2] == "| unit | 2 | 2 | 0 | 0 | 3 | - |" and tiers[-1] == "| all | 6 | 4 | 1 | 1 | 67 | 82 |"
    assert "| distributed | 2 | 2 | 0 | 0 | 50 | 82 |" in tiers
    files = slowest.cpu_files_table(cases, n=2).splitlines()
    assert files[2:] == ["| 1 | `tests/distributed/test_grad_matrix.py` | 2 | 82 | 50 |",
                         "| 2 | `tests/unit/test_cli.py` | 2 | - | 3 |"]


def test_write_replaces_only_between_the_markers(tmp_path, slowest):
    junit, doc = tmp_path / "junit.xml", tmp_path / "layout.md"
    junit.write_text(JUNIT)
    doc.write_text(f"before\n{slowest.BEGIN}\nold table\n{slowest.END}\nafter\n")
    assert slowest.main([str(junit), "--write", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith(f"before\n{slowest.BEGIN}\nFrom `python tools/slowest_tests.py junit.xml`")
    assert text.endswith(f"{slowest.END}\nafter\n") and "old table" not in text and "test_grad_matrix" in text
    assert slowest.main([str(junit), "--write", str(tmp_path / "none.md")]) == 2
