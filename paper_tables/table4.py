"""Render Table 4 from result JSON of experiments/long_context (see long_context_tables.py):
`python paper_tables/table4.py [--profile tiny|paper]`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from long_context_tables import main

if __name__ == "__main__":
    raise SystemExit(main("table4"))
