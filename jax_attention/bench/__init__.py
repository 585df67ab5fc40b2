"""Benchmarks: our code against the peers a user would otherwise pick, in one run on one machine.

``jax-attention bench attention|memory|train|decode`` (see :mod:`jax_attention.cli`). Every
benchmark interleaves the peers (one call of each per round, so drifting clocks and neighbours
hit all of them alike), reports medians of at least five timed rounds after warm-up, the ratios
between peers, and the environment (:func:`common.environment`), and writes JSON.
``jax-attention bench profile`` (:mod:`.step_profile`) has no peer: it says where the compiled
training step's time goes, kernel by kernel.
"""
