"""Engines: the ways the LLM contract can be served (see DESIGN.md, "one LLM contract")."""

from .base import BuildStep, Engine

__all__ = ["BuildStep", "Engine"]
