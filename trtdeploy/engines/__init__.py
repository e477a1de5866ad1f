"""Engines: the ways the LLM contract can be served (docs/writing-plugins.md, "The LLM contract")."""

from .base import BuildStep, Engine

__all__ = ["BuildStep", "Engine"]
