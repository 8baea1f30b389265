"""The console (albert_dist.job.console): the log line's content and length, number formats, the noise
filters (exact messages only), the progress bar only on a terminal, the per-rank logging prefix."""
from __future__ import annotations

import io
import logging
import re
import warnings

import pytest

from albert_dist.job import console


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    filters = {name: logging.getLogger(name).filters[:] for name in ("DeepSpeed",)}
    yield
    root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    for name, kept in filters.items():
        logging.getLogger(name).filters[:] = kept


def test_number_formats():
    assert [console.si(v) for v in (950.0, 2950.4, 12_345_678.0, 1.234e9)] == ["950", "2.95k", "12.3M", "1.23G"]
    assert [console.duration(s) for s in (42.4, 65, 3599, 7620, None, -1)] == ["42s", "1m05s", "59m59s", "2h07m",
                                                                              "?", "?"]
    assert console.eta_s(elapsed_s=30.0, steps_done=10, steps_left=90) == pytest.approx(270.0)
    assert console.eta_s(elapsed_s=0.0, steps_done=0, steps_left=90) is None


def test_train_line_names_the_watched_numbers_in_one_short_line():
    line = console.train_line(40, 300, loss=9.14231, mlm_accuracy=0.0312, lr=2e-3, tokens_per_s=2950.4, mfu=0.1234,
                              eta_s=65)
    assert line == "step  40/300 | loss 9.142 | mlm acc  3.1% | lr 2.00e-03 | tok/s 2.95k | mfu 12.3% | eta 1m05s"
    # the longest realistic line (the paper recipe's 125k steps, days of ETA) with the logging prefix
    longest = console.train_line(125_000, 125_000, 10.123, 0.999, 1.76e-3, 123_456_789.0, 0.999, 99 * 3600)
    assert len("[rank0 11:52:07] " + longest) <= 120
    assert "| mfu n/a |" in console.train_line(1, 2, 1.0, 0.5, 1e-3, 10.0, None, None)  # no peak: shown_mfu


def test_val_line():
    assert (console.val_line(300, 300, 7.0412, 0.0731, 1.4402)
            == "step 300/300 | val loss 7.041 | val mlm acc  7.3% (1.44x unigram)")
    assert console.val_line(3, 300, 7.0, 0.5) == "step   3/300 | val loss 7.000 | val mlm acc 50.0%"


def test_noise_filters_drop_exact_messages_only(restore_logging):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    ds = logging.getLogger("DeepSpeed")
    ds.addHandler(handler)
    try:
        console.install_noise_filters()
        console.install_noise_filters()  # idempotent: one filter
        assert sum(isinstance(f, console._DropExact) for f in ds.filters) == 1
        noisy = console.NOISY_LOG_RECORDS[0][1]
        ds.warning(noisy)
        ds.warning(noisy + " (and something new)")
    finally:
        ds.removeHandler(handler)
    assert stream.getvalue().splitlines() == [noisy + " (and something new)"]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        console.install_noise_filters()
        for category, message in console.NOISY_WARNINGS:
            warnings.warn(message, category)
            warnings.warn(message + " Also this.", category)
    assert [str(w.message) for w in caught] == [m + " Also this." for _, m in console.NOISY_WARNINGS]



def test_botocores_credentials_line_is_dropped_as_botocore_writes_it(restore_logging, monkeypatch, caplog):
    """The data commands and every rank reading s3:// printed botocore's "Found credentials in environment
    variables." (INFO, once per process). Real botocore's provider, so the exact text is checked against the
    installed version: seen before the filters, gone after."""
    from botocore.credentials import EnvProvider

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setattr(logging.getLogger("botocore.credentials"), "filters", [])
    caplog.set_level(logging.INFO, logger="botocore.credentials")
    EnvProvider().load()
    assert "Found credentials in environment variables." in caplog.messages
    caplog.clear()
    console.install_noise_filters()
    EnvProvider().load()
    assert caplog.messages == []

class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal_of_rank_0():
    assert console.progress_bar_enabled(True, 0, _Tty())
    assert not console.progress_bar_enabled(True, 0, io.StringIO())  # a log file
    assert not console.progress_bar_enabled(True, 1, _Tty())
    assert not console.progress_bar_enabled(False, 0, _Tty())


@pytest.mark.parametrize("rank", [0, 1])
def test_logging_prefix_and_levels(rank, restore_logging):
    stream = io.StringIO()
    console.configure_logging(rank, stream)
    log = logging.getLogger("albert_dist.apps.pretrain.trainer")
    log.info("an info line")
    log.warning("a warning")
    lines = stream.getvalue().splitlines()
    expected = ([] if rank else [r"\[rank0 \d\d:\d\d:\d\d\] an info line"])
    expected.append(rf"\[rank{rank} \d\d:\d\d:\d\d\] WARNING test_console: a warning")
    assert len(lines) == len(expected) and all(re.fullmatch(p, x) for p, x in zip(expected, lines)), lines
