"""Hop's communication graphs (Hop §3.1, §7 Fig 11 and Fig 21): in-neighbour lists, eq. (1) weights, spectral gap,
and the iteration-gap bounds of Theorem 2 / Table 1.  Pure Python + numpy, so it is tested without MPI.

A graph is a list ``in_lists`` where ``in_lists[i]`` holds N_in(i) without the self-loop (every worker always has
its own update, §3.1).  The named graphs are undirected (each edge both ways):

- ``"ring"``: i <-> i±1 (Fig 11 (1)).
- ``"ring-based"``: the ring plus each worker <-> its most distant worker i + n//2 (Fig 11 (2); for odd n also
  i - n//2, which keeps the graph undirected).
- ``"double-ring"``: two ring-based graphs on the halves 0..n/2-1 and n/2..n-1, joined node to node (Fig 11 (3));
  needs an even n >= 4.
- ``"node-allreduce-ring"``: all-to-all inside each machine, a ring between machines (Fig 21 (b)/(c)).  Machines
  come from ``node_size``: an int (blocks of that many ranks), a list of machine sizes (e.g. [4, 2, 2], Fig 21's
  8 workers on 3 machines) or, in a job, Horovod's placement (ranks grouped by host).  ``node_links`` says which
  workers carry the links between neighbouring machines:
  ``"gateway"``: one worker per machine carries both of its machine's links (Fig 21 (b), spectral gap 0.2682);
  ``"distinct"`` (and ``1``, its older name): each inter-machine link uses different workers, a machine's last
  worker to the next machine's first (Fig 21 (c), 0.2688); ``"all"``: worker l of a machine to worker l of the
  next, for every l both have (ours, not in the paper).  The Fig 21 gaps are reproduced by ``spectral_gap`` under
  the paper's W (tests/test_hop_options.py).
- a user adjacency: a list of n in-neighbour lists (directed edges allowed); it must be strongly connected.
"""
import collections

import numpy as np

NAMED = ("ring", "ring-based", "double-ring", "node-allreduce-ring")


def _undirected(n, edges):
    sets = [set() for _ in range(n)]
    for a, b in edges:
        if a != b:
            sets[a].add(b)
            sets[b].add(a)
    return [sorted(s) for s in sets]


def _ring_edges(ranks):
    m = len(ranks)
    return [(ranks[i], ranks[(i + 1) % m]) for i in range(m)] if m > 1 else []


def _ring_based_edges(ranks):
    m = len(ranks)
    edges = _ring_edges(ranks)
    if m >= 4:
        edges += [(ranks[i], ranks[(i + m // 2) % m]) for i in range(m)]
    return edges


def machines(size, node_size):
    """Ranks per machine: node_size an int (blocks of that size), a list of machine sizes (consecutive blocks), or
    a list of rank lists (a real placement, ranks grouped by host, not necessarily consecutive)."""
    if isinstance(node_size, (list, tuple)) and node_size and all(isinstance(m, (list, tuple)) for m in node_size):
        ranks = sorted(r for m in node_size for r in m)
        if ranks != list(range(size)) or any(not m for m in node_size):
            raise ValueError(f"machines {node_size} must hold every rank 0..{size - 1} exactly once")
        return [sorted(m) for m in node_size]
    if isinstance(node_size, (list, tuple)):
        sizes = [int(s) for s in node_size]
        if any(s < 1 for s in sizes) or sum(sizes) != size:
            raise ValueError(f"node_size {list(node_size)} must list positive machine sizes summing to the world "
                             f"size {size}")
    else:
        if not isinstance(node_size, int) or isinstance(node_size, bool) or node_size < 1:
            raise ValueError(f"node_size must be a positive int or a list of machine sizes, got {node_size!r}")
        sizes = [min(node_size, size - s) for s in range(0, size, node_size)]
    out, start = [], 0
    for s in sizes:
        out.append(list(range(start, start + s)))
        start += s
    return out


def machines_from_hosts(hosts):
    """A real placement: ``hosts[r]`` is rank r's host name; machines in order of their first rank."""
    groups = {}
    for rank, host in enumerate(hosts):
        groups.setdefault(host, []).append(rank)
    return list(groups.values())


LINKS = ("gateway", "distinct", 1, "all")


def _machine_links(a, b, node_links):
    """The edges joining machine ``a`` (index m) to the next machine ``b`` on the machine ring."""
    if node_links == "all":
        return [(a[l], b[l]) for l in range(min(len(a), len(b)))]
    if node_links == "gateway":  # Fig 21 (b): each machine's first worker carries both of its links
        return [(a[0], b[0])]
    return [(a[-1], b[0])]     # Fig 21 (c): a machine's links leave from its last worker and arrive at its first


def _node_allreduce_ring(size, node_size, node_links):
    blocks = machines(size, node_size)
    edges = [(a, b) for block in blocks for a in block for b in block if a < b]
    if len(blocks) > 1:
        pairs = [(m, (m + 1) % len(blocks)) for m in range(len(blocks) if len(blocks) > 2 else 1)]
        for m, nxt in pairs:
            edges += _machine_links(blocks[m], blocks[nxt], node_links)
    return _undirected(size, edges)


def build(topology, size, node_size=1, node_links=1):
    """in_lists for a named topology or a user adjacency; ValueError names what is wrong."""
    if node_links not in LINKS:
        raise ValueError(f"node_links must be one of {LINKS}, got {node_links!r}")
    if isinstance(topology, str):
        if topology == "ring":
            return _undirected(size, _ring_edges(list(range(size))))
        if topology == "ring-based":
            edges = _ring_based_edges(list(range(size)))
            if size >= 4 and size % 2:
                edges += [(i, (i - size // 2) % size) for i in range(size)]
            return _undirected(size, edges)
        if topology == "double-ring":
            if size < 4 or size % 2:
                raise ValueError(f"topology 'double-ring' needs an even number of workers >= 4, got {size}")
            half = size // 2
            a, b = list(range(half)), list(range(half, size))
            edges = _ring_based_edges(a) + _ring_based_edges(b) + list(zip(a, b))
            return _undirected(size, edges)
        if topology == "node-allreduce-ring":
            return _node_allreduce_ring(size, node_size, node_links)
        raise ValueError(f"unknown topology {topology!r}; valid: {', '.join(NAMED)}, or a list of in-neighbour lists")
    return validate_adjacency(topology, size)


def validate_adjacency(adjacency, size):
    """A user graph: n lists of in-neighbours (self-loops dropped), strongly connected."""
    if not isinstance(adjacency, (list, tuple)) or len(adjacency) != size:
        raise ValueError(f"topology must be a name ({', '.join(NAMED)}) or a list of {size} in-neighbour lists "
                         f"(one per rank), got {adjacency!r}")
    in_lists = []
    for i, row in enumerate(adjacency):
        try:
            ranks = sorted({int(r) for r in row} - {i})
        except (TypeError, ValueError):
            raise ValueError(f"topology[{i}] must be a list of ranks, got {row!r}") from None
        bad = [r for r in ranks if not 0 <= r < size]
        if bad:
            raise ValueError(f"topology[{i}] has ranks {bad} outside [0, {size})")
        in_lists.append(ranks)
    unreachable = _unreachable(in_lists)
    if size > 1 and unreachable:
        raise ValueError(f"topology is not strongly connected: from rank {unreachable[0][0]} no path reaches ranks "
                         f"{unreachable[0][1]} (Hop §3.1 needs a connected graph)")
    return in_lists


def out_lists(in_lists):
    outs = [[] for _ in in_lists]
    for i, ins in enumerate(in_lists):
        for j in ins:
            outs[j].append(i)
    return [sorted(o) for o in outs]


def distances(in_lists):
    """D[j][i] = length of the shortest path j -> i (edge j -> i when j is in N_in(i)); inf if none."""
    n = len(in_lists)
    outs = out_lists(in_lists)
    dist = np.full((n, n), np.inf)
    for src in range(n):
        dist[src, src] = 0
        queue = collections.deque([src])
        while queue:
            u = queue.popleft()
            for v in outs[u]:
                if dist[src, v] == np.inf:
                    dist[src, v] = dist[src, u] + 1
                    queue.append(v)
    return dist


def _unreachable(in_lists):
    dist = distances(in_lists)
    return [(j, [i for i in range(len(in_lists)) if dist[j, i] == np.inf])
            for j in range(len(in_lists)) if np.isinf(dist[j]).any()]


def weights(in_lists):
    """W of eq. (1) with the self-loop: W[j, i] = 1 / (|N_in(i)| + 1) for j in N_in(i) and j = i."""
    n = len(in_lists)
    w = np.zeros((n, n))
    for i, ins in enumerate(in_lists):
        for j in list(ins) + [i]:
            w[j, i] = 1.0 / (len(ins) + 1)
    return w


def fig21_matrix(in_lists):
    """The paper's W for its spectral gaps (§7.3.6): the adjacency A over each worker's degree, no self-loops."""
    n = len(in_lists)
    a = np.zeros((n, n))
    for i, ins in enumerate(in_lists):
        a[i, list(ins)] = 1.0
    return a / np.maximum(a.sum(axis=1, keepdims=True), 1.0)


def spectral_gap(in_lists, matrix="paper"):
    """Hop §7.3.6's footnote: ||lambda_1(W)|| - ||lambda_2(W)|| for the two largest eigenvalues of W.

    ``matrix="paper"``: W = A / degree without self-loops, eigenvalues ordered by value; this gives Fig 21's
    0.6667 / 0.2682 / 0.2688.  ``matrix="eq1"``: the W training actually averages with (eq. (1), self-loop
    included), eigenvalues ordered by modulus (the usual mixing-rate reading).  1.0 for one worker."""
    if len(in_lists) < 2:
        return 1.0
    if matrix == "paper":
        values = sorted(np.linalg.eigvals(fig21_matrix(in_lists)).real, reverse=True)
        return float(abs(values[0]) - abs(values[1]))
    if matrix != "eq1":
        raise ValueError(f"matrix must be 'paper' or 'eq1', got {matrix!r}")
    mods = sorted(np.abs(np.linalg.eigvals(weights(in_lists))), reverse=True)
    return float(mods[0] - mods[1])


def gap_bound(dist, i, j, max_ig, backup=0, staleness=None):
    """Table 1 (with token queues): the bound on Iter(i) - Iter(j): min(b0 * len(j -> i), max_ig * len(i -> j)),
    b0 = 1 standard, s + 1 with staleness s, unbounded with backup workers (and the hybrid)."""
    tokens = max_ig * dist[i, j]
    if backup:
        return tokens
    b0 = 1 if staleness is None else staleness + 1
    return min(b0 * dist[j, i], tokens)


def describe(in_lists):
    """One line for the log: degrees and spectral gap."""
    degrees = sorted({len(x) for x in in_lists})
    return (f"{len(in_lists)} workers, in-degree {degrees}, spectral gap {spectral_gap(in_lists):.4f} (the "
            f"paper's W), {spectral_gap(in_lists, 'eq1'):.4f} (eq. (1)'s W)")
