"""The `courtly` command's entry point (`python -m courtly`, and the installed script).

Ctrl-C while courtly's modules load (a few tenths of a second) exits quietly with status 130, as
Ctrl-C in a command does (cli.Command), instead of a KeyboardInterrupt traceback.
"""

import sys


def main() -> None:
    """Load the command and run it."""
    try:
        from courtly.cli import main as command
    except KeyboardInterrupt:
        sys.exit(130)
    command()


if __name__ == "__main__":
    main()
