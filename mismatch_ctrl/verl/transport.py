"""An in-process stand-in for the two TransferQueue calls verl's driver makes around the advantage step
(``transfer_queue.kv_batch_get`` / ``kv_batch_put``, TransferQueue 0.1.11 ``interface.py:414-540``): the remote data
transport, the one part of verl the CPU lab (``mismatch_ctrl.lab.training.verl_trainer``) and the tests replace.

Rows are kept per response key, field by field, as verl's jagged layout holds them (one 1-D tensor per response;
a 0-d tensor per response for ``uid``), with each key's tags; a get returns the requested fields as a ``TensorDict``
of jagged tensors, a put the keys with their stored tags (as TransferQueue's does: verl reads ``is_padding`` there).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta


class LocalTransferQueue:
    """``kv_batch_get`` / ``kv_batch_put`` over a dict of per-response rows."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, torch.Tensor]] = {}
        self.tags: dict[str, dict] = {}

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str] | None = None) -> TensorDict:
        fields = [f for f in (select_fields or self.rows[keys[0]]) if f in self.rows[keys[0]]]
        out = {}
        for field in fields:
            rows = [self.rows[k][field] for k in keys]
            out[field] = torch.stack(rows) if rows[0].dim() == 0 else \
                torch.nested.as_nested_tensor(rows, layout=torch.jagged)
        return TensorDict(out, batch_size=len(keys))

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: TensorDict | None = None,
                     tags: list[dict] | None = None) -> KVBatchMeta:
        if fields is not None:
            for name in fields.keys():
                for key, row in zip(keys, fields[name].unbind(0)):
                    self.rows.setdefault(key, {})[name] = row.clone()
        for key, tag in zip(keys, tags or [{}] * len(keys)):
            self.tags.setdefault(key, {}).update(tag)
        return KVBatchMeta(partition_id=partition_id, keys=list(keys), tags=[dict(self.tags[k]) for k in keys])

    @contextlib.contextmanager
    def installed(self) -> Iterator[LocalTransferQueue]:
        """``transfer_queue``'s two calls answered by this queue inside the block (verl's trainer looks them up on
        the module at each call)."""
        saved = tq.kv_batch_get, tq.kv_batch_put
        tq.kv_batch_get, tq.kv_batch_put = self.kv_batch_get, self.kv_batch_put
        try:
            yield self
        finally:
            tq.kv_batch_get, tq.kv_batch_put = saved
