"""The PyTorch peer of the benchmarks: the mirror of one of our models, and PyTorch's threads.

Shared by ``bench train`` (:mod:`jax_attention.bench.train`), its ``--whole-run``
(:mod:`jax_attention.bench.book_run`) and ``bench decode`` (:mod:`jax_attention.bench.decode`);
PyTorch is imported only when these are called.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence

__all__ = ["torch_model", "torch_num_threads", "ThreadChoice"]


def torch_model(kind: str, config, params):
    """The PyTorch mirror of registered model ``kind`` (:attr:`~jax_attention.models.registry.ModelSpec.
    torch_mirror`) built from its ``config``, with our weights ``params``, in training mode."""
    from jax_attention.interop import to_torch
    from jax_attention.models.registry import get_model

    model = get_model(kind).torch_mirror(config)
    model.load_state_dict(to_torch(params, kind))
    model.train()
    return model


@contextlib.contextmanager
def torch_num_threads(threads: int) -> Iterator[None]:
    """PyTorch's intra-op thread count set to ``threads`` inside, restored on the way out."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ThreadChoice:
    """PyTorch's intra-op thread count for a peer, chosen by timing the peer's own work.

    Why (issue 15, "the PyTorch peer must be as fast as the book's own code"): measured against
    d2l 1.0.3's own ``train_seq2seq`` and Transformer on the same 2-core machine, one process
    each, interleaved, the mirror (:mod:`jax_attention.interop.torch_models`) is not slower: an
    epoch of the book's Transformer issues 58.5k ATen operations in the mirror and 76.4k in the
    book's code, and takes the same CPU time (1 thread: 11.8–12.7k vs 11.1–12.6k target tokens
    per CPU second; Bahdanau 17.1–17.6k vs 15.8–16.9k). What made the PyTorch figures low and
    erratic was the thread count: at PyTorch's default of one thread per core, OpenMP's workers
    spin-wait after every parallel region, and whenever another process wants a core the
    epochs of *either* code fall from ~15k to 150–1,800 tokens/s, where one thread runs 6–13k.
    A choice made on a single round can catch such a moment, so the candidates take turns.

    The candidates (1 and PyTorch's default, unless given) take turns on the first
    ``len(candidates) * trials`` units of work (benchmark rounds, training epochs); each keeps
    its fastest time, and the fastest candidate runs every later unit. With ``threads`` fixed
    there is nothing to probe.

    ::

        choice = ThreadChoice()
        for epoch in range(epochs):
            result, seconds, threads = choice.timed(lambda: train_one_epoch(epoch))

    Args:
      threads: a fixed count (no probe), or ``None`` to choose.
      trials: turns per candidate (>= 1).
      candidates: the counts to try (default: 1 and ``torch.get_num_threads()``).
    """

    def __init__(self, threads: int | None = None, *, trials: int = 2,
                 candidates: Sequence[int] | None = None):
        import torch

        from jax_attention._checks import check_int

        check_int("trials", trials, 1)
        if threads is not None:
            candidates = [check_int("threads", threads, 1)]
        elif candidates is None:
            candidates = sorted({1, torch.get_num_threads()})
        else:
            candidates = sorted({check_int("candidates", n, 1) for n in candidates})
        self._order = [n for _ in range(trials) for n in candidates] if len(candidates) > 1 \
            else []
        self._candidates = list(candidates)
        self._best: dict[int, float] = {}

    @property
    def probing(self) -> bool:
        """Whether the next unit of work is still a probe."""
        return bool(self._order)

    @property
    def threads(self) -> int:
        """The count for the next unit: the next candidate while probing, then the fastest."""
        if self._order:
            return self._order[0]
        if not self._best:
            return self._candidates[0]
        return min(self._best, key=self._best.get)

    @property
    def probe_seconds(self) -> dict[int, float]:
        """Each probed candidate's fastest unit, in seconds (empty when nothing was probed)."""
        return dict(self._best) if len(self._candidates) > 1 else {}

    def record(self, threads: int, seconds: float) -> None:
        """Count a unit of work that ran with :attr:`threads` threads and took ``seconds``
        (:meth:`timed` does it)."""
        if self._order and threads == self._order[0]:
            self._order.pop(0)
            self._best[threads] = min(seconds, self._best.get(threads, float("inf")))

    def timed(self, work: Callable[[], object]) -> tuple[object, float, int]:
        """Run ``work()`` with :attr:`threads` threads; ``(its result, seconds, threads)``."""
        threads = self.threads
        with torch_num_threads(threads):
            start = time.perf_counter()
            result = work()
            seconds = time.perf_counter() - start
        self.record(threads, seconds)
        return result, seconds, threads
