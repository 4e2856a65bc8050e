"""The `state-reduction` command line."""

import sys


def main(argv=None) -> int:
    raise SystemExit("state-reduction: no subcommands yet")


if __name__ == "__main__":
    sys.exit(main())
