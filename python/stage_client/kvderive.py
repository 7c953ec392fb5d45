"""Layouts from presets and tensor shapes: the names of :mod:`stage_client.layout.derive`,
kept importable here as they were before the package :mod:`stage_client.layout`
gathered them. Nothing in stage_client imports this module.
"""

from .layout.derive import derive, part_widths, physical_shape, preset, roles_of, tensor_lens

__all__ = ["derive", "part_widths", "physical_shape", "preset", "roles_of", "tensor_lens"]
