"""Render figure5 from analyze result JSON (see rank_tables.py): `python paper_tables/figure5.py [--profile tiny|paper]`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rank_tables import main

if __name__ == "__main__":
    raise SystemExit(main("figure5"))
