"""The engines' named KV layouts: the names of :mod:`stage_client.layout.presets`,
kept importable here as they were before the package :mod:`stage_client.layout`
gathered them. Nothing in stage_client imports this module.
"""

from .layout.presets import DIMS, MLA_WIDTHS, PRESETS, TensorRoles, is_mla

__all__ = ["DIMS", "MLA_WIDTHS", "PRESETS", "TensorRoles", "is_mla"]
