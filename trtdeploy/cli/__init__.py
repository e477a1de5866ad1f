"""The ``trtdeploy`` command line: one module per command, assembled in :mod:`trtdeploy.cli.main`."""
