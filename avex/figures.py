"""Writing a matplotlib figure: every PNG the toolkit draws (the sweep, motivation, a run's
exchange diagnostics) is saved the same way."""
from __future__ import annotations

from pathlib import Path

__all__ = ["save_figure"]


def save_figure(fig, path: Path) -> Path:
    """Write a matplotlib figure as a PNG (creating its folder) and close it."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
