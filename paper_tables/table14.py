"""Render Table 14 from result JSON (see shared_conv_tables.py): `python paper_tables/table14.py [--profile tiny|paper]`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_conv_tables import main

if __name__ == "__main__":
    raise SystemExit(main("table14"))
