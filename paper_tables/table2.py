"""Render Table 2 from result JSON (see ablation_tables.py): `python paper_tables/table2.py [--profile tiny|paper]`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablation_tables import main

if __name__ == "__main__":
    raise SystemExit(main("table2"))
