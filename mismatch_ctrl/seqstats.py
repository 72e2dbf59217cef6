"""Sequence statistics: the one table of named per-sequence sums and maxima that every statistic of a hook call reads.

ARCHITECTURE.md: "Statistics are additive ... Build them once per batch, as one table of named columns". A hook call
builds one :class:`SeqStats` from its :class:`~mismatch_ctrl.batch.TokenBatch`:

1. each requested *column* (masked token values, e.g. ``prob_diff[t] = |p_train - p_roll| m[t]``, named; see
   :class:`Columns`) is written once into a row of one ``[K, T]`` buffer;
2. one segment sum over the summed rows and one segment max over the maximum rows give the local table ``[N, K]``;
3. one gather over the context-parallel shards completes it (sums added, maxima maxed; :mod:`mismatch_ctrl.dist`).

Metrics, ``C_bar``, the ACRL discrepancy, rejection decisions and diagnostics are then functions of the table, read
by column name. The batch numbers they need (sums, maxima, minima as negated maxima, histogram counts) go into one
:class:`BatchTotals`, reduced by one gather over the data-parallel ranks (:func:`reduce_batch`). Only DC-GRPO shaping
and the IS weights touch tokens again, and they reuse the rows.

Cost: the token work is a fixed number of tensor operations per column (one GPU kernel launch each; launches, not
bandwidth, are what a hook costs at slime's micro-batch sizes) and a fixed number for all the reductions, whatever the
number of sequences and, on a GPU, of tokens. The table (``N x K`` numbers) and the batch numbers stay on the batch's
device: everything per sequence and per batch is a few vectorised tensor operations there, and the host reads only
the reduced batch numbers the controllers need, in one transfer, where a caller asks for it (:func:`reduce_batch`
with ``fetch=True``; :mod:`mismatch_ctrl.host`). On a CPU the price of millions of tokens per call is memory, so there
the tokens go in cache-sized chunks (:data:`CHUNK_BYTES`, :data:`CHUNKED_DEVICES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

import torch

from . import host
from .batch import BLOCK, Segments, TokenBatch
from .dist import LOCAL, Gather, Reducers, local_gather


class Tokens:
    """The token tensors a column is written from (of the whole batch or of one chunk of it), with the shared
    intermediates computed at most once, and the rows of the columns (a writer may read a column written before it:
    columns are written in request order)."""

    def __init__(self, mask: torch.Tensor, log_ratio: torch.Tensor, train: torch.Tensor,
                 rollout: torch.Tensor) -> None:
        self.mask, self.log_ratio, self.train, self.rollout = mask, log_ratio, train, rollout
        self.rows: dict[str, torch.Tensor] = {}
        self._shared: dict[str, torch.Tensor] = {}

    @classmethod
    def of(cls, batch: TokenBatch, start: int, stop: int) -> Tokens:
        """The tokens ``[start, stop)`` of ``batch`` (views; the tensors themselves for all tokens)."""
        tensors = (batch.mask, batch.log_ratio, batch.train_log_probs, batch.rollout_log_probs)
        if stop - start != batch.segments.num_tokens:
            tensors = tuple(t[start:stop] for t in tensors)
        return cls(*tensors)

    def _once(self, name: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        if name not in self._shared:
            self._shared[name] = compute()
        return self._shared[name]

    @property
    def expm1(self) -> torch.Tensor:
        """``exp(l) - 1`` (accurate for small ``l``)."""
        return self._once("expm1", lambda: torch.expm1(self.log_ratio))

    @property
    def p_train(self) -> torch.Tensor:
        return self._once("p_train", lambda: torch.exp(self.train))

    @property
    def p_roll(self) -> torch.Tensor:
        return self._once("p_roll", lambda: torch.exp(self.rollout))


Writer = Callable[[Tokens, torch.Tensor], None]
"""Writes a column's token values (0 where the token does not count) into the given ``[T]`` row."""


def _trained(t: Tokens, out: torch.Tensor) -> None:
    out.copy_(t.mask)


@dataclass(frozen=True)
class Columns:
    """Named columns: ``sums`` and ``maxima`` map a name to the :data:`Writer` of a column reduced per sequence;
    ``tokens`` to one only written (a token output, e.g. a metric's token values for slime). ``keep`` names the
    columns whose token values a consumer reads after the reduction (the others may be gone, see
    :data:`CHUNK_BYTES`).

    A name means one quantity everywhere, so requests of several consumers merge with ``|``: a column that two of
    them need is written and reduced once. ``trained`` (the loss mask; its sum is the token count) is always there.
    """

    sums: Mapping[str, Writer] = field(default_factory=dict)
    maxima: Mapping[str, Writer] = field(default_factory=dict)
    tokens: Mapping[str, Writer] = field(default_factory=dict)
    keep: frozenset[str] = frozenset()

    def __or__(self, other: Columns) -> Columns:
        return Columns({**self.sums, **other.sums}, {**self.maxima, **other.maxima},
                       {**self.tokens, **other.tokens}, self.keep | other.keep)


CHUNK_BYTES = 4 << 20
"""On a CPU, columns are written and reduced in chunks of tokens whose ``[K, chunk]`` buffer takes at most this many
bytes: the tokens go through one buffer that stays in cache; per chunk the columns are written and reduced to block
sums and maxima plus the few edge tokens, per sequence once after the last chunk; only the ``keep`` columns are
written out at full length. One ``[K, T]`` buffer of millions of tokens makes every pass a trip to memory, and glibc
maps such an allocation fresh on every call, whose page faults then cost more than the arithmetic
(``benchmarks/bench_core.py`` at 2.1M tokens: (a) 28 ms with chunks against 41 ms with one buffer below 32 MiB;
``benchmarks/bench_hooks.py``: the TIS hook's statistics 2.3-2.4x faster at 1.9M tokens, 1.0-1.2x at 190k). Each chunk
costs its own operations, so on a CPU the count grows with the tokens past one chunk."""

CHUNKED_DEVICES = frozenset({"cpu"})
"""Device types whose batches are chunked. Elsewhere (a GPU) a call is one chunk whatever its size: a kernel launch
costs more than the bandwidth chunks would save, and the caching allocator reuses the buffer, so the number of
operations stays independent of the tokens."""


def default_chunk_tokens(device: torch.device, total: int, rows: int, element_size: int) -> int:
    """Tokens per chunk of a ``rows x total`` buffer: on :data:`CHUNKED_DEVICES` the fewest chunks within
    :data:`CHUNK_BYTES`, of about equal size; elsewhere, and in a compiled region (whose compiler fuses the columns'
    writes into their reductions), one chunk of all ``total`` tokens."""
    if device.type not in CHUNKED_DEVICES or torch.compiler.is_compiling():
        return max(total, 1)
    most = max(CHUNK_BYTES // (rows * element_size) // BLOCK, 1) * BLOCK
    return -(-total // -(-total // most)) if total > most else most


class SeqStats:
    """The per-sequence table of one batch, complete over context-parallel shards (see the module docstring).

    ``table`` ``[N, K]`` (float64, on the batch's device) holds the sum columns, ``nonfinite`` (trained tokens dropped
    by the non-finite guard), then the maximum columns (``-inf`` for a sequence without tokens); read them by name
    with :meth:`sum` and :meth:`max`. ``rows`` keeps each column's token values on this shard, for token outputs.
    """

    def __init__(self, batch: TokenBatch, sum_names: Sequence[str], max_names: Sequence[str],
                 rows: dict[str, torch.Tensor], table: torch.Tensor) -> None:
        self.batch = batch
        self.segments: Segments = batch.segments
        self.rows = rows
        self.table = table
        self.index = {name: k for k, name in enumerate([*sum_names, "nonfinite"])}
        self.max_index = {name: len(self.index) + k for k, name in enumerate(max_names)}
        self.counts = self.sum("trained")
        """Trained tokens per sequence."""
        self.denom = self.counts.clamp_min(1.0)
        """``max(counts, 1)``: the denominator of a per-sequence token mean."""
        self.valid = (self.counts > 0).double()
        """1.0 for sequences with trained tokens, else 0.0."""
        self._means: torch.Tensor | None = None

    @classmethod
    def build(cls, batch: TokenBatch, columns: Columns, reducers: Reducers = LOCAL,
              chunk_tokens: int | None = None) -> SeqStats:
        """Write every column once, reduce per sequence (by chunks of ``chunk_tokens``, rounded up to whole blocks;
        default: :func:`default_chunk_tokens`), complete over the CP shards with one gather."""
        sums = {"trained": _trained, **columns.sums}
        maxima = columns.maxima
        writers = {**columns.tokens, **maxima, **sums}
        # Rows in this order make the summed and the maximum columns of any subsequence two contiguous ranges.
        order = [name for name in sums if name not in maxima] + [name for name in sums if name in maxima] + \
            [name for name in maxima if name not in sums] + \
            [name for name in columns.tokens if name not in sums and name not in maxima]
        write_order = [*sums, *(name for name in order if name not in sums)]
        sum_names, max_names = order[:len(sums)], [name for name in order if name in maxima]

        segments, total = batch.segments, batch.segments.num_tokens
        if chunk_tokens is None:
            chunk_tokens = default_chunk_tokens(batch.mask.device, total, len(order), batch.mask.element_size())
        chunk_tokens = -(-max(chunk_tokens, 1) // BLOCK) * BLOCK  # whole blocks: a chunk's blocks are the batch's
        single = total <= chunk_tokens
        # One chunk: every column in one buffer, all kept. Several: the kept columns are written straight into
        # full-length rows, the others into one chunk buffer that every chunk reuses.
        kept = order if single else [name for name in order if name in columns.keep]
        others = [name for name in order if name not in kept]
        full = batch.mask.new_empty(len(kept), total)
        buffer = batch.mask.new_empty(len(others), chunk_tokens)
        rows = dict(zip(kept, writable_rows(full)))
        stacks = []  # per buffer: its summed and its maximum columns, each a contiguous range of its rows
        for names in (kept, others):
            summed, maxed = [n for n in names if n in sums], [n for n in names if n in maxima]
            first = names.index(maxed[0]) if maxed else 0
            stacks.append((summed, slice(0, len(summed)), maxed, slice(first, first + len(maxed))))
        # Per chunk only dense block reductions and the edge tokens' values; per sequence once, after the chunks.
        pieces: dict[str, list[list[torch.Tensor]]] = {kind: [[], []] for kind in ("sum", "sum_edges", "max",
                                                                                  "max_edges")}
        # One chunk (also of an empty batch) reads no bound: in a compiled region ``total`` stays symbolic.
        for start in (0,) if single else range(0, total, chunk_tokens):
            stop = total if single else min(start + chunk_tokens, total)
            tokens = Tokens.of(batch, start, stop)
            if single:
                tokens.rows, chunk_stacks, edges = rows, (full,), segments.edge_index()
            else:
                held = buffer[:, :stop - start]
                tokens.rows = {**dict(zip(others, held.unbind(0))), **{name: rows[name][start:stop] for name in kept}}
                chunk_stacks, edges = (full[:, start:stop], held), segments.edge_index(start, stop)
            for name in write_order:
                writers[name](tokens, tokens.rows[name])
            for k, (stack, (summed, sum_range, maxed, max_range)) in enumerate(zip(chunk_stacks, stacks)):
                for kind, names, part in (("sum", summed, sum_range), ("max", maxed, max_range)):
                    if names:
                        part = stack if len(names) == stack.shape[0] else stack[part]
                        blocks = Segments.blocks(part)
                        pieces[kind][k].append(blocks.sum(2) if kind == "sum" else blocks.amax(2))
                        pieces[f"{kind}_edges"][k].append(part.index_select(1, edges))

        def joined(kind: str) -> torch.Tensor:
            """A kind's pieces: chunks joined along the tokens, then the two buffers along the rows."""
            return _cat([_cat(chunks, 1) for chunks in pieces[kind] if chunks], 0)

        summed = [name for stack in stacks for name in stack[0]]
        maxed = [name for stack in stacks for name in stack[2]]
        columns = [segments.combine_sums(joined("sum"), joined("sum_edges")) if summed else None,
                   batch.nonfinite.double().unsqueeze(1),
                   segments.combine_maxima(joined("max"), joined("max_edges")).double() if maxed else None]
        table = _cat([c for c in columns if c is not None], 1)
        if not single:  # columns in the order of one chunk (``order``), so that every CP shard's table agrees
            at = {name: k for k, name in enumerate([*summed, "nonfinite", *(f"max {name}" for name in maxed)])}
            table = torch.cat([table[:, k:k + 1] for k in [at[name] for name in [*sum_names, "nonfinite"]] +
                               [at[f"max {name}"] for name in max_names]], 1)
        if reducers.sharded:
            gathered = reducers.seq(table)
            table = torch.cat([gathered[:, :, :len(summed) + 1].sum(0), gathered[:, :, len(summed) + 1:].amax(0)], 1)
        return cls(batch, sum_names, max_names, rows, table)

    @property
    def num_seqs(self) -> int:
        return self.segments.num_seqs

    def sum(self, name: str) -> torch.Tensor:
        """The per-sequence sum ``[N]`` of column ``name``."""
        return self.table[:, self.index[name]]

    @property
    def means(self) -> torch.Tensor:
        """The per-sequence token means ``[N, S]`` of every sum column (one op for all)."""
        if self._means is None:
            self._means = self.table[:, :len(self.index)] / self.denom.unsqueeze(1)
        return self._means

    def mean(self, name: str) -> torch.Tensor:
        """The per-sequence token mean ``[N]`` of column ``name`` (``sum / max(count, 1)``)."""
        return self.means[:, self.index[name]]

    def max(self, name: str) -> torch.Tensor:
        """The per-sequence maximum ``[N]`` of column ``name`` (``-inf`` for a sequence without tokens)."""
        return self.table[:, self.max_index[name]]

    def token_rows(self, columns: Mapping[str, str]) -> dict[str, torch.Tensor]:
        """``{key: token values of column}`` for the pairs of ``columns`` whose column's rows are still there."""
        return {key: self.rows[column] for key, column in columns.items() if column in self.rows}

    def at_tokens(self, rows: Sequence[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
        """Per-sequence rows ``[N]`` broadcast to this shard's tokens, as ``[T]`` tensors of ``dtype``."""
        if not rows:
            return []
        return writable_rows(self.segments.expand(torch.stack(list(rows)).to(dtype)))


def writable_rows(t: torch.Tensor) -> list[torch.Tensor]:
    """The rows of ``t`` as views its consumers may write in place: ``unbind``, or in a compiled region one ``select``
    each (under torch 2.13's compiler, an ``unbind`` view written in place fixes the row length, so every batch size
    would compile anew)."""
    return [t[k] for k in range(t.shape[0])] if torch.compiler.is_compiling() else list(t.unbind(0))


def _cat(tensors: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.cat`` without an op for a single tensor."""
    return tensors[0] if len(tensors) == 1 else torch.cat(list(tensors), dim)


class BatchTotals:
    """Named batch numbers of one hook call, reduced over the data-parallel ranks by one gather.

    Each entry is a 1-D float64 tensor on the batch's device (several numbers under one name), given as a tensor or as
    a list of 0-d tensors and Python numbers: ``sum`` entries are added over the ranks, ``max`` entries maxed (a
    minimum is the maximum of the negated values). :meth:`reduce` returns every entry as a 1-D float64 tensor: on the
    device, or with ``fetch`` on the host, all entries in one transfer.
    """

    def __init__(self) -> None:
        self.entries: dict[str, tuple[str, torch.Tensor]] = {}

    def add(self, op: str, name: str, values: torch.Tensor | Sequence[torch.Tensor | float],
            device: torch.device | str = "cpu") -> None:
        """Add the entry ``name`` (``op`` ``"sum"`` or ``"max"``); numbers of a list go to the device of its tensors
        (or ``device`` if it has none)."""
        if name in self.entries:
            raise ValueError(f"batch total {name!r} added twice")
        if not isinstance(values, torch.Tensor):
            device = next((v.device for v in values if isinstance(v, torch.Tensor)), device)
            values = torch.stack([v.double() if isinstance(v, torch.Tensor) else
                                  torch.full((), float(v), dtype=torch.float64, device=device) for v in values])
        self.entries[name] = (op, values.reshape(-1).double())

    def reduce(self, gather: Gather = local_gather, fetch: bool = False) -> Reduced:
        """Every entry combined over the participants of ``gather``; on the host with ``fetch``."""
        order = sorted(self.entries.items(), key=lambda item: item[1][0] != "sum")
        if not order:
            return Reduced(on_host=fetch)
        vector = _cat([values for _, (_, values) in order], 0)
        if gather is not local_gather:
            n_sum = sum(values.numel() for _, (op, values) in order if op == "sum")
            gathered = gather(vector)
            vector = torch.cat([gathered[:, :n_sum].sum(0), gathered[:, n_sum:].amax(0)])
        if fetch:
            vector = torch.tensor(host.fetch(vector), dtype=torch.float64)
        return Reduced(zip([name for name, _ in order], torch.split(vector, [v.numel() for _, (_, v) in order])),
                       on_host=fetch)


class Reduced(dict):
    """The reduced batch numbers by entry name (1-D float64 tensors); ``on_host``: whether they were fetched to the
    host (else they are on the batch's device)."""

    def __init__(self, *args: object, on_host: bool) -> None:
        super().__init__(*args)
        self.on_host = on_host


class BatchPart(Protocol):
    """A consumer of batch totals: adds the entries it needs, then reads the reduced values."""

    def add_to(self, totals: BatchTotals) -> None: ...

    def read(self, reduced: Reduced) -> None: ...


def reduce_batch(gather: Gather, *parts: BatchPart | None, fetch: bool = False) -> Reduced:
    """One gather for the batch numbers of every part (``None`` parts are skipped); each part then reads them, on the
    device, or with ``fetch`` on the host (one transfer for all parts)."""
    totals = BatchTotals()
    present = [part for part in parts if part is not None]
    for part in present:
        part.add_to(totals)
    reduced = totals.reduce(gather, fetch)
    for part in present:
        part.read(reduced)
    return reduced
