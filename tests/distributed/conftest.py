"""The 2-rank gradient-matrix run that test_grad_matrix.py and test_compile.py share (`two_rank_matrix`)."""
from __future__ import annotations

import pytest

#: Seconds for the whole shared run (the gradient matrix and the compiled cells, 2 CPU cores under load).
TIMEOUT_S = 3600


def _selected(request, filename: str) -> bool:
    return any(item.path.name == filename and item.path.parent.name == "distributed" for item in request.session.items)


@pytest.fixture(scope="session")
def two_rank_matrix(request) -> dict[str, dict]:
    """``{cell.id: merged result}`` of every 2-rank cell the selected tests need, run in ONE spawned process group
    (`grad_matrix_worker.run_matrix`) instead of one per file, which saves a start-up (two ranks importing torch
    and DeepSpeed, the process group). test_compile.py's cells first, as in a process group of their own: the
    parent warms inductor's caches before the ranks start (`grad_matrix_worker.warm_compile_caches`), the setup in
    which the ranks are known to find them (tried: after the eager matrix, warmed by a process beside the ranks,
    the first compiled cell compiled anew, 83 s against 11 s; which of the two lost the cache was not isolated);
    then test_grad_matrix.py's cells (eager: compiled engines of earlier cells leave nothing they use); the control
    cell last. Each cell still builds its own engine and is compared with its own references."""
    import grad_matrix_worker as gm

    cells: list = []
    if _selected(request, "test_compile.py"):
        from test_compile import CELLS, COMPILED

        gm.warm_compile_caches(COMPILED)
        cells += CELLS
    if _selected(request, "test_grad_matrix.py"):
        from test_grad_matrix import CONTROL_CELLS, MATRIX_CELLS

        cells += MATRIX_CELLS + CONTROL_CELLS
    return gm.run_matrix(cells, timeout_s=TIMEOUT_S)
