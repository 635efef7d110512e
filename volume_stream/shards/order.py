"""The order of a shard's records within a version (`shards.reader` numbers them in it).

- `by_key`: (key, old image before new): each version's keys sorted by Arrow (stable) after
  numpy grouped the rows by (version, phase). Tables' streams, and volumes' made before
  "order": "bucket".
- `by_bucket`: (bucket, key, old before new), a volume's streams since: the rows grouped by
  (version, bucket) with numpy keep the read's order, which is that order already for rows
  the read gave one after the other in order (`follows`, one comparison of neighbours over
  the read). A group whose rows are runs of the read out of order is merged run by run
  (`_merged`: the files of one bucket in a big commit each hold a range of paths, so a few
  pieces make it), or sorted by Arrow when its runs interleave.
"""

from __future__ import annotations

import heapq

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["FEW_RUNS", "by_bucket", "by_key", "follows", "in_order", "one_chunk"]

#: versions (groups) handled one by one up to this many (more: at once)
FEW_RUNS = 256
#: pieces of runs a group's merge may take before it is sorted instead (`_merged`)
_MERGED_PIECES = 64


def in_order(col: pa.ChunkedArray, phases: np.ndarray, a: np.ndarray, b: np.ndarray
             ) -> np.ndarray:
    """Per pair of rows (a[k], b[k]): whether b[k] comes after a[k] by (key, phase)."""
    x, y = col.take(pa.array(a)), col.take(pa.array(b))
    less = pc.fill_null(pc.less(x, y), False).to_numpy(zero_copy_only=False)
    equal = pc.fill_null(pc.equal(x, y), False).to_numpy(zero_copy_only=False)
    return less | (equal & (phases[a] < phases[b]))


def follows(rows: pa.Table, key: str) -> np.ndarray:
    """Per row of `rows` (`reader._rows`): whether the next row comes after it by (key, phase), a
    key's old image before its new one (False for the last): where the read's rows are in
    that order already, as a volume's change data feed gives each bucket's rows of a commit.
    One comparison of neighbours, keys compared for equality only where not ascending."""
    col, n = one_chunk(rows[key]), rows.num_rows
    out = np.zeros(n, bool)
    if n < 2:
        return out
    a, b = col.slice(0, n - 1), col.slice(1)
    out[:-1] = pc.fill_null(pc.less(a, b), False).to_numpy(zero_copy_only=False)
    maybe = np.flatnonzero(~out[:-1])
    if len(maybe):
        out[maybe] = in_order(col, one_chunk(rows["_phase"]).to_numpy(), maybe, maybe + 1)
    return out


def by_key(rows: pa.Table, perm: np.ndarray, version: np.ndarray, phases: np.ndarray,
           keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """`perm` (rows of `rows`) ordered by (version, key, phase), stably, and their versions.
    The rows are first grouped by (version, phase) with numpy (a radix sort of small codes),
    then each version's keys are sorted apart (an Arrow sort is stable: a key's old image
    stays first); with many versions, or versions too far apart for the codes, one Arrow
    sort of all three."""
    v = version[perm]
    lo, hi = (int(v.min()), int(v.max())) if len(v) else (0, 0)
    if (hi - lo) * 2 + 1 >= 1 << 16:
        return _by_key_at_once(rows, perm, v, phases[perm], keys)
    grouped = np.argsort(((v - lo) * 2 + phases[perm]).astype(np.uint16), kind="stable")
    perm, v = perm[grouped], v[grouped]
    bounds = [0, *(np.flatnonzero(v[1:] != v[:-1]) + 1).tolist(), len(v)]
    if len(bounds) > FEW_RUNS:
        return _by_key_at_once(rows, perm, v, phases[perm], keys)
    taken = pa.table({k: rows[k].take(pa.array(perm)) for k in keys})
    out = np.empty(len(perm), np.int64)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        order = pc.sort_indices(taken.slice(a, b - a), [(k, "ascending") for k in keys])
        out[a:b] = perm[a:b][order.to_numpy().view(np.int64)]
    return out, v  # (sorting within a version leaves the versions as they are)


def by_bucket(rows: pa.Table, perm: np.ndarray, version: np.ndarray, phases: np.ndarray,
              key: str, follows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`perm` ordered by (version, bucket, key, phase), and their versions: grouped by
    (version, bucket) with numpy (a stable radix sort of small codes: each group keeps the
    read's order), then only the groups whose rows the read did not give one after the other
    in (key, phase) order (`follows`) sorted apart with Arrow."""
    v, b = version[perm], one_chunk(rows["_bucket"]).to_numpy()[perm].astype(np.int64)
    vlo, blo = int(v.min()), int(b.min())
    code = (v - vlo) * (int(b.max()) - blo + 1) + (b - blo)
    grouped = np.argsort(code.astype(np.uint16) if code.max() < 1 << 16 else code,
                         kind="stable")
    perm, v, code = perm[grouped], v[grouped], code[grouped]
    same = code[1:] == code[:-1]
    # where a group's rows are not rows the read gave one after the other in order: a run of
    # the read ends (another file or batch of the bucket follows), out of order or not
    cuts = np.flatnonzero(same & ~((perm[1:] == perm[:-1] + 1) & follows[perm[:-1]]))
    col = rows[key]
    bad = cuts[~in_order(col, phases, perm[cuts], perm[cuts + 1])] if len(cuts) else cuts
    if not len(bad):
        return perm, v
    starts = np.flatnonzero(np.r_[True, ~same])
    ends = np.r_[starts[1:], len(perm)]
    groups = np.unique(np.searchsorted(starts, bad, side="right") - 1)
    if len(groups) > FEW_RUNS:  # many: one sort of all four
        sub = pa.table({"c": code, "k": col.take(pa.array(perm)), "p": phases[perm]})
        order = pc.sort_indices(sub, [("c", "ascending"), ("k", "ascending"),
                                      ("p", "ascending")]).to_numpy().view(np.int64)
        return perm[order], v[order]
    for a, e in zip(starts[groups].tolist(), ends[groups].tolist(), strict=True):
        if not _merged(col, phases, perm, a, e, cuts[(cuts >= a) & (cuts < e)] + 1):
            sub = pa.table({"k": col.take(pa.array(perm[a:e])), "p": phases[perm[a:e]]})
            order = pc.sort_indices(sub, [("k", "ascending"), ("p", "ascending")])
            perm[a:e] = perm[a:e][order.to_numpy().view(np.int64)]
    return perm, v  # (sorting within a group leaves the versions as they are)


def _merged(col: pa.ChunkedArray, phases: np.ndarray, perm: np.ndarray, a: int, e: int,
            cuts: np.ndarray) -> bool:
    """Merge the runs of perm[a:e] (each in (key, phase) order; `cuts`: where the second and
    later start) in place: the run with the smallest first row gives all its rows before
    the next run's first (a binary search, a row looked at per step), and so on. The runs of
    a bucket are mostly whole files of one commit, each a range of paths
    (`directory_table.rewrite`), so a few pieces make the group; False, and perm untouched,
    when it would take more than `_MERGED_PIECES` (runs that interleave: a sort is cheaper)."""
    def at(i: int) -> tuple[str, int]:
        return col[int(perm[i])].as_py(), int(phases[perm[i]])

    runs = [[x, y] for x, y in zip([a, *cuts.tolist()], [*cuts.tolist(), e], strict=True)]
    heap = [(at(x), k) for k, (x, _) in enumerate(runs)]
    heapq.heapify(heap)
    pieces: list[np.ndarray] = []
    while heap:
        _, k = heapq.heappop(heap)
        x, y = runs[k]
        if heap:  # this run's rows before the next run's first row
            nxt, lo, hi = heap[0][0], x + 1, y
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (mid + 1, hi) if at(mid) < nxt else (lo, mid)
            y = lo
        pieces.append(perm[x:y])
        if len(pieces) > _MERGED_PIECES:
            return False
        if y < runs[k][1]:
            runs[k][0] = y
            heapq.heappush(heap, (at(y), k))
    perm[a:e] = np.concatenate(pieces)
    return True


def _by_key_at_once(rows: pa.Table, perm: np.ndarray, v: np.ndarray, phase: np.ndarray,
                    keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    sub = pa.table({"v": v, **{k: rows[k].take(pa.array(perm)) for k in keys}, "p": phase})
    order = pc.sort_indices(sub, [("v", "ascending"), *((k, "ascending") for k in keys),
                                  ("p", "ascending")]).to_numpy().view(np.int64)
    return perm[order], v[order]



def one_chunk(col: pa.ChunkedArray) -> pa.Array:
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
