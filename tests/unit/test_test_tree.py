"""The test tree itself: every test module's file name is unique across the tiers. The tiers have no __init__.py,
so pytest imports a test file as a top-level module named by its basename; a second file of that name in another
tier fails the collection of a whole run ("import file mismatch": CI failed on tests/unit/test_stragglers.py beside
tests/distributed/test_stragglers.py, while each tier alone passed)."""
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def duplicate_basenames(root: Path = TESTS) -> list[str]:
    """Test-module basenames that stand in more than one folder under `root`, sorted."""
    counts = Counter(p.name for p in root.rglob("test_*.py"))
    return sorted(name for name, n in counts.items() if n > 1)


def test_every_test_module_name_is_unique_across_the_tiers():
    assert duplicate_basenames() == []


def test_the_check_sees_a_planted_duplicate(tmp_path):  # the checker itself can fail
    for tier in ("unit", "distributed"):
        (tmp_path / tier).mkdir()
        (tmp_path / tier / "test_x.py").write_text("")
    (tmp_path / "unit" / "test_y.py").write_text("")
    assert duplicate_basenames(tmp_path) == ["test_x.py"]
