"""docs/layout.md's "slowest tests" table and tier counts from a pytest run's JUnit XML.

    python -m pytest --junitxml=junit.xml ...           # any part of the suite; `make test` writes junit.xml
    python tools/slowest_tests.py junit.xml              # print the tables (markdown)
    python tools/slowest_tests.py junit.xml --write docs/layout.md   # replace them between the markers

The tier of a test is the folder under tests/ its module lives in (unit, integration, distributed, e2e), read from
the JUnit ``classname`` (``tests.unit.test_cli`` or ``tests.unit.test_cli.TestX``). A test's seconds are JUnit's
``time``: setup, call and teardown together (pytest's default ``junit_duration_report``), so a module's expensive
fixture shows on its first test. A test's CPU seconds are its ``cpu_s`` JUnit property (tests/conftest.py: the
pytest process and the processes it reaped, setup to teardown; "-" where a run did not record them): on CI's two
busy cores the suite's time is its CPU, so the files that cost the most CPU are listed too. `--write` replaces what
lies between ``<!-- slowest-tests:begin -->`` and ``<!-- slowest-tests:end -->`` in the file, with the command
and the run's date, so the table in the docs is this script's output and says where it came from.
"""
from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

TIERS = ("unit", "integration", "distributed", "e2e")
BEGIN, END = "<!-- slowest-tests:begin -->", "<!-- slowest-tests:end -->"


@dataclass(frozen=True)
class Case:
    """One test case of a JUnit file."""

    test_id: str
    """``tests/unit/test_cli.py::test_name[param]``: what pytest's -k/node ids name."""
    tier: str
    """unit, integration, distributed, e2e, or "other" outside tests/<tier>/."""
    seconds: float
    """Setup + call + teardown (JUnit ``time``)."""
    outcome: str
    """passed, failed (a failure or an error), or skipped."""
    cpu_seconds: float | None = None
    """The ``cpu_s`` property (tests/conftest.py), None where the run did not record it."""

    @property
    def file(self) -> str:
        return self.test_id.split("::")[0]


def read_cases(path: str | Path) -> tuple[list[Case], str]:
    """The test cases of the JUnit XML at `path` and the run's timestamp ("" when the file has none).

    Raises:
        ValueError: not a JUnit file pytest wrote (no testsuite element).
    """
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise ValueError(f"{path}: no <testsuite> element: not a pytest --junitxml file")
    cases = []
    for suite in suites:
        for tc in suite.iter("testcase"):
            classname = tc.get("classname", "")
            parts = classname.split(".")
            # classname: tests.<tier>.<module>[.<Class>]; the module is the first part that starts with test_
            module_end = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
            module = "/".join(parts[:module_end + 1]) + ".py"
            cls = parts[module_end + 1:]
            test_id = "::".join([module, *cls, tc.get("name", "?")])
            tier = parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else "other"
            if tc.find("failure") is not None or tc.find("error") is not None:
                outcome = "failed"
            elif tc.find("skipped") is not None:
                outcome = "skipped"
            else:
                outcome = "passed"
            cpu = next((float(prop.get("value")) for prop in tc.iter("property") if prop.get("name") == "cpu_s"), None)
            cases.append(Case(test_id, tier, float(tc.get("time", 0) or 0), outcome, cpu))
    return cases, suites[0].get("timestamp", "")


def slowest_table(cases: list[Case], n: int = 25) -> str:
    """Markdown: the `n` slowest tests, seconds and tier."""
    rows = sorted(cases, key=lambda c: -c.seconds)[:n]
    lines = [f"| # | test | tier | seconds | CPU s |", "|---|---|---|---|---|"]
    lines += [f"| {i} | `{c.test_id}` | {c.tier} | {c.seconds:.1f} | {_cpu(c.cpu_seconds, '.1f')} |"
              for i, c in enumerate(rows, 1)]
    return "\n".join(lines)


def _cpu(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _cpu_sum(cases: list[Case]) -> float | None:
    known = [c.cpu_seconds for c in cases if c.cpu_seconds is not None]
    return sum(known) if known else None


def cpu_files_table(cases: list[Case], n: int = 15) -> str:
    """Markdown: the `n` test files whose tests took the most CPU seconds (summed), with their summed seconds."""
    by_file: dict[str, list[Case]] = defaultdict(list)
    for c in cases:
        by_file[c.file].append(c)
    rows = sorted(by_file.items(), key=lambda kv: -(_cpu_sum(kv[1]) or 0))[:n]
    lines = ["| # | file | tests | CPU s | seconds |", "|---|---|---|---|---|"]
    lines += [f"| {i} | `{f}` | {len(cs)} | {_cpu(_cpu_sum(cs), '.0f')} | {sum(c.seconds for c in cs):.0f} |"
              for i, (f, cs) in enumerate(rows, 1)]
    return "\n".join(lines)


def tier_table(cases: list[Case]) -> str:
    """Markdown: per tier the tests passed / failed / skipped and their summed seconds, and the total."""
    by_tier: dict[str, list[Case]] = defaultdict(list)
    for c in cases:
        by_tier[c.tier].append(c)
    lines = ["| tier | tests | passed | failed | skipped | seconds (summed) | CPU s (summed) |",
             "|---|---|---|---|---|---|---|"]
    for tier, group in [(t, by_tier[t]) for t in (*TIERS, "other") if t in by_tier] + [("all", cases)]:
        k = Counter(c.outcome for c in group)
        lines.append(f"| {tier} | {len(group)} | {k['passed']} | {k['failed']} | {k['skipped']} | "
                     f"{sum(c.seconds for c in group):.0f} | {_cpu(_cpu_sum(group), '.0f')} |")
    return "\n".join(lines)


def report(path: str | Path, n: int = 25) -> str:
    """Both tables with a line saying where they came from."""
    cases, stamp = read_cases(path)
    when = stamp or datetime.fromtimestamp(Path(path).stat().st_mtime).isoformat(timespec="seconds")
    return "\n".join([f"From `python tools/slowest_tests.py {Path(path).name}` on the JUnit XML of a pytest run of "
                      f"{when} ({len(cases)} tests):", "", tier_table(cases), "", f"The {n} slowest:", "",
                      slowest_table(cases, n), "", "The test files that took the most CPU:", "",
                      cpu_files_table(cases)])


def write_between_markers(doc: str | Path, text: str) -> None:
    """Replace what lies between `BEGIN` and `END` in `doc` by `text`.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    doc = Path(doc)
    body = doc.read_text()
    start, end = body.find(BEGIN), body.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{doc}: no {BEGIN} ... {END} pair to write between")
    doc.write_text(body[:start + len(BEGIN)] + "\n" + text + "\n" + body[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", help="pytest --junitxml output")
    parser.add_argument("--top", type=int, default=25, help="how many of the slowest tests (default 25)")
    parser.add_argument("--write", metavar="DOC", help="replace the tables between the markers of DOC")
    args = parser.parse_args(argv)
    try:
        text = report(args.junit, args.top)
        if args.write:
            write_between_markers(args.write, text)
        else:
            print(text)
    except (OSError, ValueError, ET.ParseError) as err:
        print(f"slowest_tests: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
