"""Placeholder package; filled by later work."""
