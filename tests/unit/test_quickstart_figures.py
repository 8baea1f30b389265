"""bench/convergence/quickstart_figures.py: the README's "What you should see" block states the reference run's
throughput with its load (issue 46: the README's 28.0 min and the recipe's "~5 min" disagreed, with no word of
what moved them)."""
from __future__ import annotations

import json

from tests.helpers import REPO, load_bench

Q = load_bench("convergence/quickstart_figures")
REFERENCE = REPO / "docs" / "quickstart-reference" / "metrics.jsonl"


def test_the_block_states_the_samples_per_s_range_of_the_reference_run_and_how_to_scale_it():
    rates = [json.loads(line)["perf/samples_per_s"] for line in REFERENCE.read_text().splitlines()
             if "perf/samples_per_s" in line]
    fig = Q.figures(REFERENCE)
    assert fig["samples_per_s"] == [min(rates), max(rates)]
    block = Q.render(fig)
    assert (f" at {min(rates):.0f}-{max(rates):.0f} samples/s over its log intervals as the load moved (training time "
            f"elsewhere: 1000 x 32 / the samples/s of `perf/samples_per_s`)") in block
    assert "load average" in block  # the reference run's load, from its run.json
    assert block in (REPO / "README.md").read_text()  # the README shows what the script prints
