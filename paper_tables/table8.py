"""Render Table 8 from result JSON (see lm_tables.py): `python paper_tables/table8.py [--profile tiny|paper]`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_tables import main

if __name__ == "__main__":
    raise SystemExit(main("table8"))
