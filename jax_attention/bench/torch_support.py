"""The PyTorch peer of the benchmarks: the mirror of one of our models, and PyTorch's threads.

Shared by ``bench train`` (:mod:`jax_attention.bench.train`), its ``--whole-run``
(:mod:`jax_attention.bench.book_run`) and ``bench decode`` (:mod:`jax_attention.bench.decode`);
PyTorch is imported only when these are called. ``bench train``'s rounds of the book's PyTorch
training are here too: eager (:class:`TorchRounds`, the book's loop) and compiled by
``torch.compile`` (:class:`CompiledTorchRounds`).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

__all__ = ["torch_model", "torch_num_threads", "ThreadChoice", "torch_batches", "TorchRounds",
           "CompiledTorchRounds", "failure_line"]


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


# --------------------------------------------------------------------------- bench train's rounds


def torch_batches(plain) -> list[tuple]:
    """NumPy batches ``[(src, src_valid_len, tgt, tgt_valid_len), ...]`` as PyTorch tensors."""
    import numpy as np
    import torch

    return [tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in batch) for batch in plain]


class TorchRounds:
    """Rounds of the book's PyTorch training (``train_seq2seq``) of ``net``, eager: each call
    runs one :func:`jax_attention.interop.torch_models.train_step` per batch (``loss.sum()``,
    backward, ``grad_clipping``, ``Adam.step``), on the unpadded batches as the book's
    ``DataLoader`` gives them.

    Attributes:
      net, optimizer: the model (training mode) and its Adam.
      losses: each round's summed loss per target token (``tokens`` a round).
      steps_trained: the steps of the rounds so far.
    """

    def __init__(self, net, batches: list, *, bos_id: int, tokens: int, lr: float):
        import torch

        from jax_attention.interop import torch_models

        self.net = net
        self.optimizer = torch.optim.Adam(net.parameters(), lr=lr)
        self._batches, self._bos_id, self._tokens = batches, bos_id, tokens
        self._train_step = torch_models.train_step
        self.losses: list[float] = []
        self.steps_trained = 0

    def step(self, src, src_valid_len, tgt, tgt_valid_len) -> float:
        """One training step on one batch; its summed loss."""
        return self._train_step(self.net, self.optimizer, src, src_valid_len, tgt,
                                tgt_valid_len, self._bos_id)

    def __call__(self) -> None:
        total = 0.0
        for batch in self._batches:
            total += self.step(*batch)
        self.losses.append(total / self._tokens)
        self.steps_trained += len(self._batches)


@contextlib.contextmanager
def _fresh_inductor_cache() -> Iterator[str]:
    """Inside, inductor compiles into a new, empty cache directory (removed on the way out), as a
    first ``torch.compile`` on a machine does; yields what the cache was, in words."""
    try:
        from torch._inductor.utils import fresh_cache
    except ImportError:  # older PyTorch
        try:
            from torch._inductor.utils import fresh_inductor_cache as fresh_cache
        except ImportError:
            fresh_cache = None
    if fresh_cache is None:
        yield "inductor's cache as found"
        return
    # fresh_cache keeps its directory when the compilation fails: make it in one removed here.
    with tempfile.TemporaryDirectory(prefix="jax-attention-inductor-") as parent:
        with fresh_cache(dir=parent):
            yield "a fresh, empty inductor cache: a first compilation, as ours"


class CompiledTorchRounds(TorchRounds):
    """:class:`TorchRounds` with the step compiled by ``torch.compile`` (the inductor backend,
    its defaults): the model's loss (the module's forward and the masked cross-entropy, summed;
    its backward compiled by AOTAutograd) and the update (the book's gradient clipping to global
    norm ``grad_clip`` and ``Adam.step``) are two compiled functions; ``zero_grad`` and the
    ``backward`` call stay as in the book's loop. The clipping multiplies the gradients by
    ``min(grad_clip / norm, 1)``, the book's ``if norm > theta: g *= theta / norm`` without its
    data-dependent branch (which would break the graph), the same numbers.

    Nothing is compiled until :meth:`warm_up`, which resets TorchDynamo (this process compiles
    nothing else with it) and runs the first round in a fresh inductor cache: the compilation
    is a first one, as ours is. Inductor's C++ kernels take PyTorch's thread count at the time
    they are compiled: warm up under the threads the rounds will run with.

    Attributes:
      cache: how the inductor cache was, in words (after :meth:`warm_up`).
    """

    def __init__(self, net, batches: list, *, bos_id: int, tokens: int, lr: float,
                 grad_clip: float = 1.0):
        super().__init__(net, batches, bos_id=bos_id, tokens=tokens, lr=lr)
        self._params = [p for p in net.parameters() if p.requires_grad]
        self._grad_clip = float(grad_clip)
        self._loss = self._update = None
        self.cache: str | None = None

    def _batch_loss(self, src, src_valid_len, tgt, tgt_valid_len):
        return self.net.loss(src, src_valid_len, tgt, tgt_valid_len, self._bos_id).sum()

    def _clip_and_step(self) -> None:
        import torch

        grads = [p.grad for p in self._params if p.grad is not None]
        norm = torch.sqrt(sum(torch.sum(g ** 2) for g in grads))
        scale = torch.clamp(self._grad_clip / norm, max=1.0)
        for g in grads:
            g.mul_(scale)
        self.optimizer.step()

    def step(self, src, src_valid_len, tgt, tgt_valid_len) -> float:
        self.optimizer.zero_grad()
        loss = self._loss(src, src_valid_len, tgt, tgt_valid_len)
        loss.backward()
        self._update()
        return float(loss.detach())

    def warm_up(self) -> float:
        """Compile both functions and train the first round (every batch shape of the rounds);
        the round's seconds, compilation included. Raises what ``torch.compile`` raises (no C++
        compiler, an unsupported Python)."""
        import torch

        torch._dynamo.reset()
        self._loss = torch.compile(self._batch_loss, backend="inductor")
        self._update = torch.compile(self._clip_and_step, backend="inductor")
        with _fresh_inductor_cache() as cache, _quiet_profiler_notice():
            start = time.perf_counter()
            self()
            seconds = time.perf_counter() - start
        self.cache = cache
        return seconds


#: The logger of TorchDynamo's warning that it drops a profiler region while it traces
#: (``Adam.step``'s ``record_function``): a line on stderr about PyTorch's profiler, which the
#: benchmark does not use.
_PROFILER_NOTICE_LOGGER = "torch._dynamo.variables.ctx_manager"


@contextlib.contextmanager
def _quiet_profiler_notice() -> Iterator[None]:
    """Inside, TorchDynamo's profiler-region warning is not printed (its level restored after)."""
    logger = logging.getLogger(_PROFILER_NOTICE_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def failure_line(error: BaseException, limit: int = 200) -> str:
    """An exception in one line: its type and the first non-empty line of its message, cut to
    ``limit`` characters."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
