"""The machine: its profile (CPU, memory, bandwidth) and how alike two machines are."""
