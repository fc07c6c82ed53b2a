"""Plots of benchmark rows (matplotlib, imported lazily: optional dependency).

One PNG, two panels:
- left: per-layer time (gate_up + down, the ``sum`` rows) of each case, one bar per provider,
  log scale, with the roofline floor of the byte / FLOP model drawn as a black tick;
- right: fraction of the roofline reached by every (case, projection), one bar per provider:
  ``floor_us / median_us``, where the floor is the larger of bytes / bandwidth ceiling and
  FLOPs / BF16 ceiling; 1.0 (the line) is speed of light whether the point is memory- or
  compute-bound, so the headroom of decode and prefill points reads on one axis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_results"]

_COLORS = {"lowbit": "#1b9e77", "humming": "#d95f02", "torch": "#7570b3"}


def plot_results(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> Path | None:
    """Draw `rows` (as written to results.json) to `path` (PNG). Returns the path, or None when
    matplotlib is not installed or no row was timed."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return None
    timed = [r for r in rows if r.get("status") == "ok" and r.get("median_us")]
    if not timed:
        return None
    providers = list(dict.fromkeys(r["provider"] for r in timed))
    cases = list(dict.fromkeys(r["case"] for r in timed))
    # a case's total: gate_up + down ("sum"), a decode layer ("layer") or one seed-004 op ("op")
    sums = {(r["case"], r["provider"]): r for r in timed if r["projection"] in ("sum", "layer", "op")}
    parts = [(c, p) for c in cases for p in ("gate_up", "down")
             if any(r["case"] == c and r["projection"] == p for r in timed)]
    by_part = {(r["case"], r["projection"], r["provider"]): r for r in timed if r["projection"] != "sum"}

    height = max(4.0, 0.16 * max(len(cases), len(parts)) * max(1, len(providers)) + 1.5)
    fig, (ax_t, ax_bw) = plt.subplots(1, 2, figsize=(15, height))
    bar_h = 0.8 / max(1, len(providers))

    for j, prov in enumerate(providers):
        ys, xs = [], []
        for i, case in enumerate(cases):
            r = sums.get((case, prov))
            if r:
                ys.append(i + (j - (len(providers) - 1) / 2) * bar_h)
                xs.append(r["median_us"])
        ax_t.barh(ys, xs, height=bar_h, color=_COLORS.get(prov), label=prov)
        for y, x in zip(ys, xs):
            ax_t.text(x, y, f" {x:.0f}", va="center", fontsize=7)
    for i, case in enumerate(cases):
        floor = next((sums[(case, p)]["floor_us"] for p in providers if (case, p) in sums), None)
        if floor:
            ax_t.plot([floor, floor], [i - 0.45, i + 0.45], color="black", lw=2)
    ax_t.set_yticks(range(len(cases)))
    ax_t.set_yticklabels(cases, fontsize=8)
    ax_t.invert_yaxis()
    if sums:  # a log axis with no positive value raises
        ax_t.set_xscale("log")
    ax_t.set_xlabel("gate_up + down, median us (black tick: roofline floor)")
    ax_t.grid(axis="x", alpha=0.3)

    for j, prov in enumerate(providers):
        ys, xs = [], []
        for i, (case, proj) in enumerate(parts):
            r = by_part.get((case, proj, prov))
            if r and r.get("floor_us"):
                ys.append(i + (j - (len(providers) - 1) / 2) * bar_h)
                xs.append(r["floor_us"] / r["median_us"])
        ax_bw.barh(ys, xs, height=bar_h, color=_COLORS.get(prov), label=prov)
    ax_bw.axvline(1.0, color="black", lw=1)
    ax_bw.set_yticks(range(len(parts)))
    ax_bw.set_yticklabels([f"{c} {p}" for c, p in parts], fontsize=7)
    ax_bw.invert_yaxis()
    ax_bw.set_xlabel("fraction of the roofline: floor us / median us (1 = speed of light)")
    ax_bw.grid(axis="x", alpha=0.3)

    gpu = next((r.get("gpu") for r in timed if r.get("gpu")), "")
    fig.suptitle(title or f"lowbit W4A16 MoE benchmark {gpu}".strip())
    handles, labels = ax_t.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=len(providers), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
