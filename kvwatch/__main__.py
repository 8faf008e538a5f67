"""`python -m kvwatch` runs the command line."""

from kvwatch.cli import main

raise SystemExit(main())
