"""Records of runs: files written atomically and read with clear errors, JSON lines, progress lines and the memory setting
of long runs, provenance (commit, machine), and the run record (`run.json`) that marks a run as finished."""
