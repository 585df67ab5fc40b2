"""``jax-attention plot positional-encoding | attention``: the chapter's figures (PNG)."""

from __future__ import annotations

import argparse
from pathlib import Path

from jax_attention.cli.arguments import (add_html_argument, check_html_argument,
                                         check_output_arguments, finish_outputs, int_at_least,
                                         positive_int, seed)
from jax_attention.cli.registry import register, register_group

__all__ = ["run_plot_positional_encoding", "run_plot_attention"]

register_group("plot", help="draw the chapter's figures (PNG)")


def _add_plot_arguments(parser: argparse.ArgumentParser, seed_help: str, *,
                        out_required: bool = True) -> None:
    """``--out DIR`` (required unless ``out_required=False``), ``--json FILE`` and ``--seed``,
    shared by the ``plot`` commands."""
    parser.add_argument("--out", metavar="DIR", type=Path, required=out_required,
                        help="write the plots (PNG) into DIR (created if missing)")
    parser.add_argument("--json", metavar="FILE", type=Path, default=None,
                        help="write the paths written, the shapes and the seed to FILE as JSON")
    parser.add_argument("--seed", metavar="N", type=seed, default=0, help=seed_help)


@register("plot positional-encoding",
          help="the sinusoidal position table: some columns over the positions, and its heatmap "
               "(d2l §11.6.3)",
          description="Draw the book's two figures of the sinusoidal positional encoding "
                      "(d2l §11.6.3): columns 6 to 9 of the table over 60 positions with encoding "
                      "dimension 32, and the whole table as a heatmap (encoding dimension across, "
                      "position down). Writes positional_encoding_columns.png and "
                      "positional_encoding_heatmap.png into --out.")
def _plot_positional_encoding(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-steps", metavar="T", type=positive_int, default=60,
                        help="positions, the rows of the table (default: %(default)s)")
    parser.add_argument("--encoding-dim", metavar="D", type=positive_int, default=32,
                        help="encoding dimension, the columns of the table (default: %(default)s)")
    parser.add_argument("--columns", metavar="C", type=int_at_least(0), nargs="+", default=[6, 7, 8, 9],
                        help="the columns drawn in the first figure (default: 6 7 8 9)")
    _add_plot_arguments(parser, "recorded in the JSON only: the table is deterministic "
                                "(default: %(default)s)")
    parser.set_defaults(handler=run_plot_positional_encoding)


def run_plot_positional_encoding(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``plot positional-encoding``; see its ``--help``."""
    check_output_arguments(args, parser)
    bad = [c for c in args.columns if c >= args.encoding_dim]
    if bad:
        parser.error(f"argument --columns: columns must be < --encoding-dim = {args.encoding_dim}, "
                     f"got {bad}")
    from jax_attention.viz.plotting import plot_positional_columns, plot_positional_heatmap
    from jax_attention.nn.positional import positional_encoding

    P = positional_encoding(args.num_steps, args.encoding_dim)
    plots = {"columns": args.out / "positional_encoding_columns.png",
             "heatmap": args.out / "positional_encoding_heatmap.png"}
    plot_positional_columns(P, args.columns, path=plots["columns"])
    plot_positional_heatmap(P, path=plots["heatmap"])
    record = {"seed": args.seed, "num_steps": args.num_steps, "encoding_dim": args.encoding_dim,
              "columns": args.columns, "shapes": {"P": list(P.shape)}}
    return finish_outputs(args, "plot positional-encoding", record, plots)


@register("plot attention",
          help="per-head attention weights of a multi-head self-attention on a sample batch "
               "(d2l §11.5, §11.6)",
          description="Build a multi-head attention with random (Xavier) weights, run it as "
                      "self-attention on a random batch X of shape (batch, queries, num-hiddens) "
                      "with the given valid lengths, and draw the weights of every head: one row "
                      "of heatmaps per example of the batch, one column per head. The defaults are "
                      "the book's example (d2l §11.5.3 and §11.6.1): 100 hiddens, 5 heads, a batch "
                      "of 2 with 4 tokens and valid lengths 3 and 2. Writes "
                      "multihead_attention.png into --out and, with --html FILE, the same weights "
                      "as an interactive page; one of them is required.")
def _plot_attention(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-hiddens", metavar="D", type=positive_int, default=100,
                        help="model width D (default: %(default)s)")
    parser.add_argument("--num-heads", metavar="N", type=positive_int, default=5,
                        help="heads; must divide --num-hiddens (default: %(default)s)")
    parser.add_argument("--batch-size", metavar="B", type=positive_int, default=2,
                        help="examples in the batch (default: %(default)s)")
    parser.add_argument("--num-queries", metavar="T", type=positive_int, default=4,
                        help="tokens per example (default: %(default)s)")
    parser.add_argument("--valid-lens", metavar="L", type=int_at_least(0), nargs="+", default=[3, 2],
                        help="valid length of each example, or one for all, each <= --num-queries "
                             "(default: 3 2)")
    _add_plot_arguments(parser, "seeds the batch X and the initial weights (default: %(default)s)",
                        out_required=False)
    add_html_argument(parser, "the same weights, a selector of the sequence of the batch, the "
                              "heads side by side or one, the positions on both axes, the weight "
                              "under the pointer, and the keys past each sequence's valid length "
                              "drawn as masked")
    parser.set_defaults(handler=run_plot_attention)


def _valid_lens(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[int]:
    """``--valid-lens``, one per example of the batch, checked."""
    valid_lens = args.valid_lens
    if len(valid_lens) == 1:
        valid_lens = valid_lens * args.batch_size
    if len(valid_lens) != args.batch_size:
        parser.error(f"argument --valid-lens: expected one length or --batch-size = {args.batch_size} "
                     f"lengths, got {len(valid_lens)}: {args.valid_lens}")
    if max(valid_lens) > args.num_queries:
        parser.error(f"argument --valid-lens: lengths must be <= --num-queries = {args.num_queries}, "
                     f"got {args.valid_lens}")
    return valid_lens


def _attention_weights(args: argparse.Namespace, valid_lens: list[int]):
    """The book's multi-head self-attention on a random batch: ``(X, output, weights (B, N, T,
    S))``."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jax_attention.nn.multihead import MultiHeadAttention

    shape = (args.batch_size, args.num_queries, args.num_hiddens)
    X = jnp.asarray(np.random.default_rng(args.seed).normal(size=shape), jnp.float32)
    model = MultiHeadAttention(args.num_hiddens, args.num_heads, 0.5, sow_weights=True,
                               rngs=nnx.Rngs(args.seed))
    model.eval()  # the weights are sown before dropout; eval keeps the output deterministic too
    output, intermediates = nnx.capture(model, nnx.Intermediate)(
        X, X, X, jnp.asarray(valid_lens, jnp.int32))
    (weights,) = intermediates["attention"]["attention_weights"].get_value()  # (B, N, T, S)
    return X, output, np.asarray(weights)


def _attention_outputs(args: argparse.Namespace, weights, valid_lens: list[int]) -> dict:
    """Draw the heatmaps (``--out``) and the interactive view (``--html``); ``{name: path}``."""
    import numpy as np

    plots = {}
    positions = [str(position) for position in range(args.num_queries)]
    heads = [f"Head {n}" for n in range(1, args.num_heads + 1)]
    what = f"{args.num_heads} heads, {args.num_hiddens} hiddens, random initial weights"
    if args.out is not None:
        from jax_attention.viz.plotting import show_heatmaps

        plots["attention"] = args.out / "multihead_attention.png"
        show_heatmaps(
            weights, xlabel="Key positions", ylabel="Query positions", titles=heads,
            row_titles=[f"Sequence {b}\n(valid length {length})"
                        for b, length in enumerate(valid_lens, start=1)],
            xticklabels=positions, yticklabels=positions, figsize=(2, 2),
            suptitle=f"Multi-head self-attention weights ({what})\n"
                     "one row per sequence of the batch, one column per head",
            path=plots["attention"])
    if args.html is not None:
        from jax_attention.viz.attention_view import attention_view

        # One "layer" per sequence of the batch; its keys past the valid length are masked.
        keep = np.arange(args.num_queries)[None, :] < np.asarray(valid_lens)[:, None]  # (B, S)
        plots["view"] = attention_view(
            weights, positions, positions, mask=keep[:, None, None, :],
            title=f"Multi-head self-attention weights ({what}, seed {args.seed})",
            xlabel="Key positions", ylabel="Query positions", head_names=heads,
            layer_names=[f"Sequence {b} (valid length {length})"
                         for b, length in enumerate(valid_lens, start=1)]).save(args.html)
    return plots


def run_plot_attention(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Handler of ``plot attention``; see its ``--help``."""
    if args.out is None and args.html is None:
        parser.error("one of the arguments --out --html is required")
    check_output_arguments(args, parser)
    check_html_argument(args, parser)
    if args.num_hiddens % args.num_heads:
        parser.error(f"argument --num-heads: must divide --num-hiddens = {args.num_hiddens}, "
                     f"got {args.num_heads}")
    valid_lens = _valid_lens(args, parser)
    X, output, weights = _attention_weights(args, valid_lens)
    plots = _attention_outputs(args, weights, valid_lens)
    record = {"seed": args.seed, "num_hiddens": args.num_hiddens, "num_heads": args.num_heads,
              "batch_size": args.batch_size, "num_queries": args.num_queries,
              "valid_lens": valid_lens,
              "shapes": {"X": list(X.shape), "output": list(output.shape),
                         "weights": list(weights.shape)}}
    return finish_outputs(args, "plot attention", record, plots)
