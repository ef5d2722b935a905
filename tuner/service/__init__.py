"""Using the result: autoconfig, load, serve."""
