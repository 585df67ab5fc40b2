"""The English–French data of d2l §10.5: the archive (find, download, check: :mod:`.archive`) and
the NMT pipeline (preprocess, tokenise, vocabularies, batches: :mod:`.nmt`)."""
