"""A run's newest checkpoint as the launch scripts read it, after their ranks are gone.

    python -m albert_dist.runs.newest RUN_DIR          # path, reason, step, max_steps, stop_cause: one a line
    python -m albert_dist.runs.newest RUN_DIR --any    # the newest step_<N> directory's name, complete or not

The first form prints nothing when the run has no complete checkpoint (no `latest`); a field the checkpoint's
albert_dist.json lacks is an empty line. `launch/pretrain_local.sh` and `slurm/common.sh` decide from it what
ended an attempt (a stop checkpoint's ``stop_cause``: signal, store or input; the final one at max_steps) and
which command continues the run. Light on purpose: json, yaml and the checkpoint layout, no torch.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from albert_dist.engine.checkpoint.layout import LATEST, META_FILE, step_dirs
from albert_dist.runs.source import RUN_CONFIG, checkpoint_dir


def _checkpoints(run_dir: Path) -> Path:
    """The run's checkpoint directory: its resolved config's ``checkpoint.dir``, else ``<run>/checkpoints``."""
    try:
        import yaml

        config = yaml.safe_load((run_dir / RUN_CONFIG).read_text())
    except Exception:  # noqa: BLE001 - no or unreadable config.yaml: the default place
        config = None
    return checkpoint_dir(run_dir, config if isinstance(config, dict) else {})


def newest(run_dir: str | Path) -> Optional[list[str]]:
    """[path, reason, step, max_steps, stop_cause] of the checkpoint `latest` names (str; "" for a field its
    albert_dist.json lacks), or None when there is none or it cannot be read."""
    ckpt = _checkpoints(Path(run_dir))
    try:
        tag = (ckpt / LATEST).read_text().strip()
        meta = json.loads((ckpt / tag / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    fields = (meta.get("reason", ""), meta.get("step", ""), (meta.get("config") or {}).get("max_steps", ""),
              meta.get("stop_cause", ""))
    return [str(ckpt / tag), *("" if f is None else str(f) for f in fields)]


def newest_step_dir(run_dir: str | Path) -> str:
    """The name of the run's newest step_<N> directory, complete or not (a save cut short leaves one); ""."""
    found = step_dirs(_checkpoints(Path(run_dir)))
    return found[0][1] if found else ""


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) > 2 or (len(args) == 2 and args[1] != "--any"):
        print("usage: python -m albert_dist.runs.newest RUN_DIR [--any]", file=sys.stderr)
        return 2
    if len(args) == 2:
        print(newest_step_dir(args[0]))
    else:
        lines = newest(args[0])
        if lines is not None:
            print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
