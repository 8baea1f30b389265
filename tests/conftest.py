"""Shared pytest setup: one torch thread per process (CI has 2 cores and tests spawn ranks)."""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
