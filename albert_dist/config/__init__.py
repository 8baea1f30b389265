"""The pretraining job's config: `TrainConfig`, its strict loader and the resume rules (callers import from here)."""
from albert_dist.config.load import (PRESET_DIR, apply_overrides, check_derived, find_config_file, for_world_size,
                                     load_config, load_model_config, model_config_of, preset_names, resolve_paths)
from albert_dist.config.resume import config_hash, resume_rules, resume_table_markdown
from albert_dist.config.schema import TrainConfig, to_container, to_yaml

__all__ = ["PRESET_DIR", "TrainConfig", "apply_overrides", "check_derived", "config_hash", "find_config_file",
           "for_world_size", "load_config", "load_model_config", "model_config_of", "preset_names", "resolve_paths",
           "resume_rules", "resume_table_markdown", "to_container", "to_yaml"]
