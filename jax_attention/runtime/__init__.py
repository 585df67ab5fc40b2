"""What a long run needs around the models: checkpoints and their lock, Ctrl-C handling, Orbax's
noise filtered, the compilation cache and timer, devices and meshes, provenance and the export a
user loads with :func:`jax_attention.load_model`."""
