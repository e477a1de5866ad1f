"""The random checkpoint of each generation, shared by the plugin's tests and its deployments: written once per
session (the speech tokenizer alone is several hundred MB). Tests that change a checkpoint build their own folder
around it."""

import pytest


@pytest.fixture(scope="session")
def cosyvoice_checkpoint(trtdeploy_checkpoint):
    """``cosyvoice_checkpoint(generation)``: the random checkpoint of that generation (do not modify it)."""
    return trtdeploy_checkpoint
