"""``python -m albert_dist.cli ...`` (what the deepspeed launcher, torchrun and the launch scripts run)."""
import sys

from albert_dist.cli import main

sys.exit(main())
