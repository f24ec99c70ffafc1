"""The MoE kernel-config PR gate: changed config files become interleaved A/B pairs on one machine.

Kept import-light: pytest imports this package at collection to parametrize the A/B tests.
"""
