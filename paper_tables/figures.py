"""Figure saving shared by every renderer: PNG and PDF beside each other, the figure closed afterwards."""

from __future__ import annotations

from pathlib import Path


def save_figure(fig, stem: Path, dpi: int = 120, paths=None) -> list[Path]:
    """Write `stem`.png and `stem`.pdf (or exactly `paths`), creating the folder; close the figure."""
    import matplotlib.pyplot as plt

    paths = [Path(p) for p in paths] if paths is not None else [Path(stem).with_suffix(".png"),
                                                                   Path(stem).with_suffix(".pdf")]
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for p in paths:
        fig.savefig(p, dpi=dpi)
    plt.close(fig)
    return paths
