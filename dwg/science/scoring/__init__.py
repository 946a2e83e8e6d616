"""Plans and scoring: what to graft where (plans), scoring prompts under a plan, grafting runs, readouts, localisation,
and the tables, statistics and bootstrap intervals of their results."""
