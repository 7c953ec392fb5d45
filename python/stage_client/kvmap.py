"""Layouts from torch tensors and the reference mapper: the names of
:mod:`stage_client.layout.tensors`, kept importable here as they were before the
package :mod:`stage_client.layout` gathered them. Nothing in stage_client imports
this module.
"""

from .layout.tensors import dtype_of, from_tensor, gather, gather_tensor, region_bytes, scatter

__all__ = ["from_tensor", "dtype_of", "region_bytes", "gather", "gather_tensor", "scatter"]
