"""``python -m lowbit``: see `lowbit.cli`."""

from .cli import main

raise SystemExit(main())
