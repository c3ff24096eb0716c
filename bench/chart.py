"""Draws bench/results/chart.png from results.md: one panel per comparison,
server CPU per operation (lower is better) for each side."""

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def panels(markdown):
    """(title, [(name, cpu)]) for every table with a server CPU column."""
    found = []
    for section in re.split(r"^### ", markdown, flags=re.M)[1:]:
        title, *rows = section.strip().splitlines()
        table = [r for r in rows if r.startswith("|")]
        if len(table) < 3:
            continue
        header = [c.strip() for c in table[0].strip("|").split("|")]
        column = next((i for i, h in enumerate(header) if "CPU us" in h), None)
        if column is None:
            continue
        bars = []
        for row in table[2:]:
            cells = [c.strip() for c in row.strip("|").split("|")]
            bars.append((cells[0], float(cells[column])))
        found.append((title, bars))
    return found


def draw(results_md, out_png):
    found = panels(Path(results_md).read_text())
    figure, axes = plt.subplots(len(found), 1, figsize=(9, 2.2 * len(found)))
    for ax, (title, bars) in zip(axes, found):
        names = [name for name, _ in bars]
        values = [value for _, value in bars]
        colors = ["#c0392b" if "IDEM" in name else "#7f8c8d" for name in names]
        ax.barh(names, values, color=colors)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9, loc="left")
        ax.tick_params(labelsize=8)
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:.2f}", va="center", fontsize=7)
    axes[-1].set_xlabel("server CPU per operation, microseconds (lower is better); redis-idem in red")
    figure.tight_layout()
    figure.savefig(out_png, dpi=110)


if __name__ == "__main__":
    here = Path(__file__).resolve().parent / "results"
    draw(here / "results.md", here / "chart.png")
