"""Choosing among measured configs: candidates and the one decision rule."""
