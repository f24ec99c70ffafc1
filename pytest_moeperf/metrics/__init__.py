"""Derived metrics: energy per token, memory-bandwidth utilisation and fleet sizing."""
