"""The training loaders with 2 DataLoader worker processes (the same checks run in one process, 0 workers, in
tests/unit/test_data_loader.py and test_data_sources.py; tests/fixtures/loader_checks.py holds them)."""
from fixtures.loader_checks import (check_exact_resume_across_shuffle_windows, check_exact_resume_twice_in_a_row,
                                    check_ranks_and_workers_split_uneven_shards)


def test_exact_resume_twice_in_a_row_with_two_workers():
    """With a step of 8 micro-batches in flight (the trainer's depth at gradient accumulation 8)."""
    check_exact_resume_twice_in_a_row(2, ga=8)


def test_exact_resume_across_shuffle_windows_with_two_workers():
    check_exact_resume_across_shuffle_windows(2)


def test_ranks_and_real_workers_split_uneven_shards_with_equal_batches(tmp_path, monkeypatch):
    check_ranks_and_workers_split_uneven_shards(tmp_path, monkeypatch, 2)
