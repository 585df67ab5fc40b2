"""The attention maths of d2l's chapter, one module per section, mirrored file by file by
:mod:`reference_numpy`: masking and the masked softmax, attention pooling (Nadaraya–Watson),
the one core of dot-product attention, the scoring functions (additive, scaled dot product), the memory-efficient chunked attention,
multi-head attention, positional encodings and the models' dropout.

Pure functions on arrays and parameter dicts, with thin Flax NNX modules over them. Nothing here
imports the models, data, runtime, training or command-line layers (``tests/test_architecture.py``).
"""
