"""The ALBERT model: config, grouped cross-layer sharing, pretraining heads (pure nn.Module code)."""
from albert_dist.model.albert import AlbertForPreTraining, PreTrainingOutput
from albert_dist.model.config import AlbertConfig
from albert_dist.model.sharing import group_index

__all__ = ["AlbertConfig", "AlbertForPreTraining", "PreTrainingOutput", "group_index"]
