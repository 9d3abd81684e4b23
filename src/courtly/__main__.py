"""`python -m courtly`."""

from courtly.cli import main

main()
