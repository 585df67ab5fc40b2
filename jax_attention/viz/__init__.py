"""Figures: attention heatmaps (d2l's ``show_heatmaps``) and loss curves."""
