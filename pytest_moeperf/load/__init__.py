"""Traffic: request records, arrival schedules, the streaming client and the SLO search."""
