"""``python -m trtdeploy``."""

from .cli.main import main

main()
