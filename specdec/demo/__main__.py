"""``python -m specdec.demo``: see :func:`specdec.demo.cli.main`."""
from .cli import main

raise SystemExit(main())
