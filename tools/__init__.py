"""Harnesses that run beside the product, never installed: the three-zone mesh (``tools/zones``)."""
