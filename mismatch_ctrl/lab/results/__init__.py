"""Finished runs read once into one table, analyses as pure functions of it, and the renderers of their results."""
