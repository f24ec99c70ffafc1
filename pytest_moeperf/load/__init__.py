"""Traffic: request records, arrivals, the streaming client, server stats, the steady-state test."""
