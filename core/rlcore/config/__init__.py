"""Config: YAML + dotted overrides (omegaconf), structured into attrs classes (cattrs)."""

from rlcore.config.loader import ConfigError, defaults, load_config, to_dict, to_yaml
from rlcore.config.schema import RLConfig

__all__ = ["ConfigError", "RLConfig", "defaults", "load_config", "to_dict", "to_yaml"]
