"""Draws Hop's named topologies for 8 workers (docs/hop_topologies.png, shown in the README).

    python examples/plot_hop_topologies.py [--out docs/hop_topologies.png]

Workers sit on a circle; node colours are the machines of Fig 21 (4 + 2 + 2; the legend says which workers each
holds), which the node-allreduce-ring graphs are built for (node_size) and the first three ignore (the colours then
show which of their edges cross machines); each title gives the spectral gap under the paper's W (A / degree,
§7.3.6) and under eq. (1)'s (self-loops).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hetsync.algorithms import hop_topology as topo  # noqa: E402

MACHINES = [4, 2, 2]
GRAPHS = [("ring", {}), ("ring-based", {}), ("double-ring", {})] + [
    ("node-allreduce-ring", {"node_size": MACHINES, "node_links": links}) for links in ("gateway", "distinct", "all")]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="docs/hop_topologies.png")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    n = sum(MACHINES)
    angle = 2 * np.pi * np.arange(n) / n
    xy = np.stack([np.sin(angle), np.cos(angle)], axis=1)
    colour = [m for m, size in enumerate(MACHINES) for _ in range(size)]
    fig, axes = plt.subplots(1, len(GRAPHS), figsize=(3.1 * len(GRAPHS), 3.8))
    for ax, (name, kw) in zip(axes, GRAPHS):
        in_lists = topo.build(name, n, kw.get("node_size", 1), kw.get("node_links", 1))
        for i, ins in enumerate(in_lists):
            for j in ins:
                if j < i:
                    ax.plot(*xy[[i, j]].T, color="0.55", lw=1, zorder=1)
        ax.scatter(*xy.T, s=260, c=[f"C{c}" for c in colour], zorder=2)
        for i, (x, y) in enumerate(xy):
            ax.text(x, y, str(i), ha="center", va="center", color="white", fontsize=9, zorder=3)
        links = f"\nnode_links={kw['node_links']!r}" if "node_links" in kw else ""
        ax.set_title(f"{name}{links}\ngap {topo.spectral_gap(in_lists):.4f} (paper's W), "
                     f"{topo.spectral_gap(in_lists, 'eq1'):.3f} (eq. 1)", fontsize=8)
        ax.set_aspect("equal")
        ax.axis("off")
    dot = dict(marker="o", linestyle="", markersize=11)
    first = 0
    handles = []
    for m, size in enumerate(MACHINES):
        handles.append(Line2D([], [], color=f"C{m}", label=f"machine {m}: workers {first}-{first + size - 1}", **dot))
        first += size
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9, frameon=False,
               title=f"node colour = machine (node_size={MACHINES}, Fig 21)", title_fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 0.93))
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
